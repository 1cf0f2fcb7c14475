"""What each rank runs for ``make gpu-check``'s ``ops`` step (benchmarks/gpu_check.py plans and launches it).

    torchrun --standalone --nproc-per-node N benchmarks/gpu_workers.py ops

``ops`` runs under torchrun (``env://``): every rank joins with
`hypergrid.init_from_env` ("nccl": ``torch.cuda.set_device`` by ``LOCAL_RANK``,
``init_process_group(..., device_id=...)``), then checks, each on CUDA tensors
against a value computed without communication: NCCL grid creation with the
three strategies, every grid operation (blocking and ``async_op``), checked
collectives, gradient averaging, the pipeline exchange, the bridge between two
grids and the autograd mappings. Rank 0 prints one line per check and rank; the
exit status is 1 if any failed.

"""

from __future__ import annotations

import argparse
import math
import os
import pathlib
import sys
import time
from collections.abc import Callable
from typing import Any

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

import torch
import torch.distributed as dist

from hypergrid import Bridge, HyperCommGrid, autograd, init_from_env
from hypergrid.values import first_line

#: The sub-checks of ``ops``, in the order they run (gpu_check.py lists them in its plan).
OPS_CHECKS = (
    "create enumerate",
    "create local",
    "create split",
    "all_reduce",
    "all_reduce async_op",
    "all_gather",
    "reduce_scatter",
    "broadcast",
    "barrier",
    "hierarchical_all_reduce",
    "checked all_reduce",
    "average_gradients",
    "exchange",
    "bridge overlapping",
    "bridge disjoint",
    "autograd",
)


def grid_shape(world: int) -> list[int]:
    """tp x pp x dp for ``world`` ranks: tp=2 where it divides, pp=2 where 4 divides, dp the rest.

    Examples:
        >>> grid_shape(1), grid_shape(2), grid_shape(8), grid_shape(6)
        ([1, 1, 1], [2, 1, 1], [2, 2, 2], [2, 1, 3])
    """
    tp = 2 if world % 2 == 0 else 1
    pp = 2 if world % 4 == 0 else 1
    return [tp, pp, world // (tp * pp)]


def rank_tensor(rank: int, device: torch.device, size: int = 4) -> torch.Tensor:
    return torch.full((size,), float(rank + 1), device=device)


def _expect(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    if not torch.equal(got.cpu(), want.cpu()):
        raise AssertionError(f"{what}: got {got.cpu().tolist()}, expected {want.cpu().tolist()}")


def _families(grid: HyperCommGrid) -> list[tuple[str, ...]]:
    return [tuple(family) for family in grid.layout.all_families()]


def _created(strategy: str) -> Callable[[torch.device], None]:
    def check(device: torch.device) -> None:
        grid = HyperCommGrid(grid_shape(dist.get_world_size()), ["tp", "pp", "dp"], strategy=strategy)
        groups = grid.create_pgs(_families(grid))
        rank = dist.get_rank()
        for family, group in zip(_families(grid), groups.values()):
            _expect(
                torch.tensor(dist.get_process_group_ranks(group)),
                torch.tensor(grid.layout.group_ranks(list(family), rank)),
                f"members of {family}",
            )
            tensor = rank_tensor(rank, device)
            dist.all_reduce(tensor, group=group)
            members = grid.layout.group_ranks(list(family), rank)
            _expect(tensor, torch.full((4,), float(sum(m + 1 for m in members)), device=device), f"sum on {family}")
        grid.destroy()

    return check


def _collectives(grid: HyperCommGrid, device: torch.device) -> dict[str, Callable[[], None]]:
    """The grid operations over every family, each against the value computed from the members."""
    rank = dist.get_rank()

    def members(family: tuple[str, ...]) -> list[int]:
        return grid.layout.group_ranks(list(family), rank)

    def all_reduce(async_op: bool) -> None:
        for family in _families(grid):
            tensor = rank_tensor(rank, device)
            work = grid.all_reduce(tensor, list(family), async_op=async_op)
            if async_op:
                assert work is not None
                work.wait()
            _expect(tensor, torch.full((4,), float(sum(m + 1 for m in members(family))), device=device), "sum")

    def all_gather() -> None:
        for family in _families(grid):
            got = grid.all_gather(rank_tensor(rank, device, 2), list(family))
            _expect(got, torch.cat([rank_tensor(m, device, 2) for m in members(family)]), f"all_gather {family}")

    def reduce_scatter() -> None:
        for family in _families(grid):
            n = len(members(family))
            got = grid.reduce_scatter(torch.arange(2.0 * n, device=device) * (rank + 1), list(family))
            place = members(family).index(rank)
            total = sum(m + 1 for m in members(family))
            _expect(got, torch.arange(2.0 * place, 2.0 * place + 2, device=device) * total, f"reduce_scatter {family}")

    def broadcast() -> None:
        for family in _families(grid):
            tensor = rank_tensor(rank, device)
            grid.broadcast(tensor, list(family), group_src=0)
            _expect(tensor, rank_tensor(members(family)[0], device), f"broadcast {family}")

    def barrier() -> None:
        for family in _families(grid):
            grid.barrier(list(family))

    def hierarchical() -> None:
        per_node = int(os.environ.get("LOCAL_WORLD_SIZE", dist.get_world_size()))
        tensor = rank_tensor(rank, device, 8)
        grid.hierarchical_all_reduce(tensor, ["tp", "pp", "dp"], ranks_per_node=per_node)
        _expect(tensor, torch.full((8,), float(sum(range(1, dist.get_world_size() + 1))), device=device), "sum")

    return {
        "all_reduce": lambda: all_reduce(False),
        "all_reduce async_op": lambda: all_reduce(True),
        "all_gather": all_gather,
        "reduce_scatter": reduce_scatter,
        "broadcast": broadcast,
        "barrier": barrier,
        "hierarchical_all_reduce": hierarchical,
    }


def _checked(device: torch.device) -> None:
    grid = HyperCommGrid(grid_shape(dist.get_world_size()), ["tp", "pp", "dp"], check_collectives=True)
    tensor = rank_tensor(dist.get_rank(), device)
    grid.all_reduce(tensor, "dp")
    members = grid.layout.group_ranks(["dp"], dist.get_rank())
    _expect(tensor, torch.full((4,), float(sum(m + 1 for m in members)), device=device), "checked sum")
    grid.destroy()


def _average_gradients(grid: HyperCommGrid, device: torch.device) -> None:
    model = torch.nn.Linear(3, 2, device=device)
    rank = dist.get_rank()
    for param in model.parameters():
        param.grad = torch.full_like(param, float(rank + 1))
    grid.average_gradients(model, "dp")
    members = grid.layout.group_ranks(["dp"], rank)
    mean = sum(m + 1 for m in members) / len(members)
    for param in model.parameters():
        assert param.grad is not None
        _expect(param.grad, torch.full_like(param, mean), "averaged gradient")


def _exchange(grid: HyperCommGrid, device: torch.device) -> None:
    rank = dist.get_rank()
    stage, stages = grid.layout.coords_of(rank)[1], grid.layout.dim_size("pp")
    received = torch.full((4,), -1.0, device=device)
    grid.exchange("pp", send_next=rank_tensor(rank, device), recv_prev=received)
    want = rank_tensor(grid.prev_rank("pp"), device) if stage > 0 else torch.full((4,), -1.0, device=device)
    _expect(received, want, f"exchange on stage {stage} of {stages}")


def _bridge(disjoint: bool, device: torch.device) -> None:
    world, rank = dist.get_world_size(), dist.get_rank()
    if disjoint:
        half = world // 2
        src = HyperCommGrid([half], ["dp"])
        dst = HyperCommGrid([world - half], ["dp"], rank_offset=half)
    else:
        tp = grid_shape(world)[0]  # the same ranks in another layout: each is on both sides
        src = HyperCommGrid([1, world], ["tp", "dp"])
        dst = HyperCommGrid([tp, world // tp], ["tp", "dp"])
    src_dp, dst_dp = src.layout.dim_size("dp"), dst.layout.dim_size("dp")
    batch = 2 * math.lcm(src_dp, dst_dp)
    rows = torch.arange(batch * 3.0, device=device).reshape(batch, 3)
    bridge = Bridge(src, dst)
    got_forward = got_backward = None
    in_src, in_dst = src.layout.contains(rank), dst.layout.contains(rank)
    if in_src:
        mine = src.layout.coords_of(rank)[src.dim_names.index("dp")]
        got_forward = bridge.send_forward(rows.chunk(src_dp)[mine].clone())
    elif in_dst:
        got_forward = bridge.recv_forward()
    if in_dst:
        assert got_forward is not None
        there = dst.layout.coords_of(rank)[dst.dim_names.index("dp")]
        _expect(got_forward, rows.chunk(dst_dp)[there], "forward slice")
        got_backward = bridge.send_backward(-got_forward)
    if in_src:
        if got_backward is None:
            got_backward = bridge.recv_backward()
        _expect(got_backward, -rows.chunk(src_dp)[mine], "backward slice")
    bridge.destroy()
    src.destroy()
    dst.destroy()


def _autograd(grid: HyperCommGrid, device: torch.device) -> None:
    """The tensor-parallel mappings over ``tp``, forward and backward, against their definitions."""
    rank, members = dist.get_rank(), grid.layout.group_ranks(["tp"], dist.get_rank())
    n, place, total = len(members), members.index(rank), float(sum(m + 1 for m in members))
    x = torch.ones(2 * n, device=device, requires_grad=True)
    (autograd.copy_to(x, grid, "tp") * (rank + 1)).sum().backward()  # backward: all-reduce
    _expect(x.grad, torch.full((2 * n,), total, device=device), "copy_to backward")
    x = rank_tensor(rank, device).requires_grad_()
    y = autograd.reduce_from(x, grid, "tp")
    (y * 2).sum().backward()  # forward: all-reduce; backward: identity
    _expect(y.detach(), torch.full((4,), total, device=device), "reduce_from forward")
    _expect(x.grad, torch.full((4,), 2.0, device=device), "reduce_from backward")
    x = torch.arange(2.0 * n, device=device).requires_grad_()
    y = autograd.scatter_to(x, grid, "tp")
    (y * (rank + 1)).sum().backward()  # forward: own chunk; backward: all-gather
    _expect(y.detach(), torch.arange(2.0 * place, 2.0 * place + 2, device=device), "scatter_to forward")
    _expect(x.grad, torch.cat([torch.full((2,), float(m + 1), device=device) for m in members]), "scatter_to backward")
    x = rank_tensor(rank, device, 2).requires_grad_()
    y = autograd.gather_from(x, grid, "tp")
    (y * torch.arange(2.0 * n, device=device)).sum().backward()  # backward: own chunk
    _expect(y.detach(), torch.cat([rank_tensor(m, device, 2) for m in members]), "gather_from forward")
    _expect(x.grad, torch.arange(2.0 * place, 2.0 * place + 2, device=device), "gather_from backward")
    x = torch.ones(2 * n, device=device, requires_grad=True)
    y = autograd.reduce_scatter_to(x, grid, "tp")
    (y * (rank + 1)).sum().backward()  # forward: reduce-scatter; backward: all-gather
    _expect(y.detach(), torch.full((2,), float(n), device=device), "reduce_scatter_to forward")
    _expect(x.grad, torch.cat([torch.full((2,), float(m + 1), device=device) for m in members]), "rs backward")
    x = rank_tensor(rank, device, 2).requires_grad_()
    y = autograd.gather_from_sequence(x, grid, "tp")
    y.sum().backward()  # forward: all-gather; backward: reduce-scatter of ones
    _expect(y.detach(), torch.cat([rank_tensor(m, device, 2) for m in members]), "gather_from_sequence forward")
    _expect(x.grad, torch.full((2,), float(n), device=device), "gather_from_sequence backward")


def ops() -> int:
    """Every check of ``OPS_CHECKS`` on this rank; rank 0 prints every rank's outcome. Exit status."""
    device = init_from_env("nccl" if torch.cuda.is_available() else None)
    rank, world = dist.get_rank(), dist.get_world_size()
    grid = HyperCommGrid(grid_shape(world), ["tp", "pp", "dp"])
    grid.create_pgs(_families(grid))
    checks: dict[str, Callable[[], None]] = {
        "create enumerate": lambda: _created("enumerate")(device),
        "create local": lambda: _created("local")(device),
        "create split": lambda: _created("split")(device),
        **_collectives(grid, device),
        "checked all_reduce": lambda: _checked(device),
        "average_gradients": lambda: _average_gradients(grid, device),
        "exchange": lambda: _exchange(grid, device),
        "bridge overlapping": lambda: _bridge(False, device),
        "bridge disjoint": lambda: _bridge(True, device),
        "autograd": lambda: _autograd(grid, device),
    }
    outcomes: list[tuple[str, str, float]] = []
    for name in OPS_CHECKS:
        if name == "bridge disjoint" and world < 2:
            outcomes.append((name, "skipped: one rank has no disjoint pair of grids", 0.0))
            continue
        started = time.perf_counter()
        try:
            checks[name]()
            if device.type == "cuda":
                torch.cuda.synchronize()
            said = "ok"
        except Exception as error:  # a check that fails is reported, and the next one runs
            said = f"FAILED {type(error).__name__}: {first_line(error)[:300]}"
        outcomes.append((name, said, time.perf_counter() - started))
        if said != "ok":  # at once: a check that failed on some ranks only may leave the others waiting
            print(f"[rank {rank}] {name}: {said}", flush=True)
    every: list[Any] = [None] * world
    dist.all_gather_object(every, outcomes)
    backend = dist.get_backend()
    card = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    grid.destroy()
    dist.destroy_process_group()
    if rank != 0:
        return 0
    print(f"# ops on {world} rank(s), backend {backend}, {card}")
    failed = 0
    for index, name in enumerate(OPS_CHECKS):
        said = sorted({outcome[index][1] for outcome in every})
        slowest = max(outcome[index][2] for outcome in every)
        failed += any(s.startswith("FAILED") for s in said)
        print(f"{name:<24} {' | '.join(said)}  ({slowest:.3f} s on the slowest rank)")
    print(f"# ops: {len(OPS_CHECKS) - failed} of {len(OPS_CHECKS)} checks without a failure")
    return 1 if failed else 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("worker", choices=("ops",), help="what to run (under torchrun)")
    return parser


def main(argv: list[str] | None = None) -> int:
    build_parser().parse_args(argv)
    return ops()


if __name__ == "__main__":
    sys.exit(main())
