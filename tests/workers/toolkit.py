"""Spawned-rank scenarios for the toolkit: collectives, autograd mappings, pipeline p2p, DeviceMesh, MPU.

Workers return raw results; the tests compute what to expect independently.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

from hypergrid import HyperCommGrid, HyperGridError
from hypergrid.autograd import copy_to, gather_from, gather_from_sequence, reduce_from, reduce_scatter_to, scatter_to

DIMS = ["tp", "pp", "dp"]  # the 3-dim grid [2, 2, 2] of the collective tests


def contribution(rank: int, rows: int, cols: int) -> torch.Tensor:
    """What ``rank`` puts into a collective: a (rows, cols) float64 tensor unique to the rank."""
    return torch.arange(rows * cols, dtype=torch.float64).reshape(rows, cols) + 1000.0 * rank


def _error(call: Callable[[], Any]) -> str:
    try:
        call()
    except HyperGridError as error:
        return f"{type(error).__name__}: {error}"
    return "no error"


def collective_scenarios() -> dict[str, Any]:
    """Every collective on every family of a [2, 2, 2] grid; ``dim`` 0 and 1 where it applies."""
    rank = dist.get_rank()
    grid = HyperCommGrid([2, 2, 2], DIMS)
    out: dict[str, Any] = {}
    for family in grid.layout.all_families():
        n = grid.group_size(family)
        key = "-".join(family)
        reduced = contribution(rank, 2, 3)
        grid.all_reduce(reduced, family)
        asynchronous = contribution(rank, 1, 2)
        work = grid.all_reduce(asynchronous, family, async_op=True)
        assert work is not None
        work.wait()
        maximum = contribution(rank, 1, 2)
        grid.all_reduce(maximum, family, op=dist.ReduceOp.MAX)
        broadcast = contribution(rank, 2, 2)
        grid.broadcast(broadcast, family, group_src=n - 1)
        broadcast_async = contribution(rank, 1, 1)
        handle = grid.broadcast(broadcast_async, family, group_src=1, async_op=True)
        assert handle is not None
        handle.wait()
        barrier = grid.barrier(family, async_op=True)
        assert barrier is not None
        barrier.wait()
        grid.barrier(family)
        out[key] = {
            "all_reduce": reduced,
            "all_reduce_async": asynchronous,
            "all_reduce_max": maximum,
            "all_gather_0": grid.all_gather(contribution(rank, 2, 3), family),
            "all_gather_1": grid.all_gather(contribution(rank, 2, 3), family, dim=1),
            "all_gather_neg": grid.all_gather(contribution(rank, 2, 3), family, dim=-1),
            "reduce_scatter_0": grid.reduce_scatter(contribution(rank, 2 * n, 3), family),
            "reduce_scatter_1": grid.reduce_scatter(contribution(rank, 3, 2 * n), family, dim=1),
            "broadcast": broadcast,
            "broadcast_async": broadcast_async,
            "same_group": grid.get_pg(family) is grid.pg(list(reversed(family))),
        }
    out["errors"] = {
        "non_dividing": _error(lambda: grid.reduce_scatter(torch.zeros(3, 2), ["dp", "tp"])),
        "bad_group_src": _error(lambda: grid.broadcast(torch.zeros(1), "pp", group_src=2)),
        "unknown_dims": _error(lambda: grid.all_reduce(torch.zeros(1), "ep")),
        "bad_dim": _error(lambda: grid.all_gather(torch.zeros(2), "tp", dim=3)),
    }
    grid.destroy()
    return out


def sub_grid_scenarios(strategy: str) -> dict[str, Any]:
    """A [2, 2] sub-grid over ranks 2..5 of 8: collectives and DeviceMesh export, members and not."""
    rank = dist.get_rank()
    grid = HyperCommGrid([2, 2], ["tp", "dp"], rank_offset=2, strategy=strategy, guard_timeout_s=60)
    out: dict[str, Any] = {}
    value = torch.tensor([float(rank)])
    out["all_reduce"] = _error(lambda: grid.all_reduce(value, "dp"))
    out["all_reduce_value"] = value.item()
    try:
        mesh = grid.to_device_mesh(["dp", "tp"])
        out["mesh"] = {
            "mesh": mesh.mesh.tolist(),
            "names": mesh.mesh_dim_names,
            "dp": dist.get_process_group_ranks(mesh.get_group("dp")),
            "tp": dist.get_process_group_ranks(mesh.get_group("tp")),
        }
    except HyperGridError as error:
        out["mesh"] = f"{type(error).__name__}: {error}"
    # Everyone is still in step: a world collective after the export completes.
    check = torch.ones(1)
    dist.all_reduce(check)
    out["world_after"] = check.item()
    grid.destroy()
    return out


def pipeline_scenarios() -> dict[str, Any]:
    """Ring neighbours and real send/recv along pp of a [2, 4] grid (ring of 4) and a [2, 2, 2] grid (ring of 2)."""
    rank = dist.get_rank()
    out: dict[str, Any] = {}
    for name, grid in (("ring4", HyperCommGrid([2, 4], ["tp", "pp"])), ("ring2", HyperCommGrid([2, 2, 2], DIMS))):
        recv_prev, recv_next = torch.zeros(2), torch.zeros(2)
        ops = grid.p2p_ops(
            "pp",
            send_next=torch.tensor([float(rank), 1.0]),
            send_prev=torch.tensor([float(rank), -1.0]),
            recv_next=recv_next,
            recv_prev=recv_prev,
        )
        for request in dist.batch_isend_irecv(ops):
            request.wait()
        # A stage sending only forward while the next receives only from behind.
        forward = torch.zeros(1)
        half = grid.p2p_ops("pp", send_next=torch.tensor([rank * 10.0]), recv_prev=forward)
        for request in dist.batch_isend_irecv(half):
            request.wait()
        out[name] = {
            "prev": grid.prev_rank("pp"),
            "next": grid.next_rank("pp"),
            "shift": grid.shift("pp", periodic=True),
            "recv_prev": recv_prev.tolist(),
            "recv_next": recv_next.tolist(),
            "forward": forward.item(),
            "peers": [(op.peer, op.op.__name__) for op in ops],
            "groups_are_grids": all(op.group is grid.get_pg("pp") for op in ops),
        }
        grid.destroy()
    return out


def mesh_scenarios() -> dict[str, Any]:
    """A DeviceMesh with a combined dim ["dp", ("pp", "tp")]; a DTensor sharded over the combined dim."""
    from torch.distributed.tensor import Shard, distribute_tensor

    rank = dist.get_rank()
    grid = HyperCommGrid([2, 2, 2], DIMS)
    mesh = grid.to_device_mesh(["dp", ("pp", "tp")])
    registry = c10d._world.pg_map
    before = len(registry)
    again = grid.to_device_mesh(["dp", ("pp", "tp")])
    after_again = len(registry)
    single = grid.to_device_mesh([("dp", "pp", "tp")])
    out: dict[str, Any] = {
        "names": mesh.mesh_dim_names,
        "mesh": mesh.mesh.tolist(),
        "groups": {name: dist.get_process_group_ranks(mesh.get_group(name)) for name in mesh.mesh_dim_names},
        "local_ranks": {name: mesh.get_local_rank(name) for name in mesh.mesh_dim_names},
        "same_objects": mesh.get_group("dp") is grid.get_pg("dp") and mesh.get_group("pp_tp") is grid.get_pg("pp-tp"),
        "new_groups_on_reexport": after_again - before,
        "again_same": again.get_group("pp_tp") is mesh.get_group("pp_tp"),
        "single": (
            single.mesh_dim_names,
            single.mesh.tolist(),
            single.get_group("dp_pp_tp") is grid.get_pg("dp-pp-tp"),
        ),
    }
    full = torch.arange(32, dtype=torch.float64).reshape(8, 4)
    sharded = distribute_tensor(full, mesh["pp_tp"], [Shard(0)])
    out["local"] = sharded.to_local()
    out["full_back"] = torch.equal(sharded.full_tensor(), full)
    out["rank"] = rank
    grid.destroy()
    return out


def mpu_scenarios() -> dict[str, Any]:
    """An MPU over moe_grids(tp=2, pp=2, etp=1, ep=2, cp=2): every getter against torch's groups."""
    from hypergrid.compat.megatron import moe_grids
    from hypergrid.compat.mpu import MPU

    dense, expert = moe_grids(tp=2, pp=2, etp=1, ep=2, cp=2)
    mpu = MPU(dense, expert_grid=expert)
    roles = {
        "data": mpu.get_data_parallel_group,
        "tensor": mpu.get_tensor_model_parallel_group,
        "pipe": mpu.get_pipeline_model_parallel_group,
        "model": mpu.get_model_parallel_group,
        "context": mpu.get_context_parallel_group,
        "expert": mpu.get_expert_model_parallel_group,
        "expert_tensor": mpu.get_expert_tensor_parallel_group,
        "expert_data": mpu.get_expert_data_parallel_group,
    }
    ranks = {role: getattr(mpu, f"get_{name}_rank")() for role, name in _MPU_NAMES.items()}
    sizes = {role: getattr(mpu, f"get_{name}_world_size")() for role, name in _MPU_NAMES.items()}
    out = {
        "shapes": (dense.shape, dense.dim_names, expert.shape, expert.dim_names),
        "groups": {role: dist.get_process_group_ranks(get()) for role, get in roles.items()},
        "group_ranks": {role: dist.get_rank(get()) for role, get in roles.items()},
        "ranks": ranks,
        "sizes": sizes,
        "context_global_ranks": mpu.get_context_parallel_global_ranks(),
        "next": mpu.get_pipeline_model_parallel_next_rank(),
        "prev": mpu.get_pipeline_model_parallel_prev_rank(),
        "first_rank": mpu.get_pipeline_model_parallel_first_rank(),
        "last_rank": mpu.get_pipeline_model_parallel_last_rank(),
        "grid_next_prev": (dense.next_rank("pp"), dense.prev_rank("pp")),
        "first": (mpu.is_pipeline_first_stage(), mpu.is_pipeline_first_stage(ignore_virtual=False, vp_stage=0)),
        "last": (mpu.is_pipeline_last_stage(), mpu.is_first_stage(), mpu.is_last_stage()),
        "pipe_shared": mpu.get_pipeline_model_parallel_group() is expert.pg("pp"),
    }
    expert.destroy()
    dense.destroy()
    return out


_MPU_NAMES = {
    "data": "data_parallel",
    "tensor": "tensor_model_parallel",
    "pipe": "pipeline_model_parallel",
    "model": "model_parallel",
    "context": "context_parallel",
    "expert": "expert_model_parallel",
    "expert_tensor": "expert_tensor_parallel",
    "expert_data": "expert_data_parallel",
}


def _close(a: torch.Tensor | None, b: torch.Tensor) -> bool:
    return a is not None and a.shape == b.shape and torch.allclose(a, b, rtol=1e-10, atol=1e-10)


def autograd_scenarios(families: list[str]) -> dict[str, dict[str, bool]]:
    """Column-, row- and sequence-parallel layers over each family, against single-process references."""
    grid = HyperCommGrid([2, 2, 2], DIMS)
    out = {}
    for dims in families:
        n, me = grid.group_size(dims), grid.group_rank(dims)
        torch.manual_seed(1234)  # the same full tensors on every rank
        x_full, w_col, g_col = _randn(5, 6), _randn(8, 6), _randn(5, 8)
        x_row, w_row, g_row = _randn(5, 8), _randn(6, 8), _randn(5, 6)
        seq, w1, w2, g_seq = _randn(8, 6), _randn(16, 6), _randn(6, 16), _randn(8, 6)
        results: dict[str, bool] = {}

        # Column-parallel linear: copy_to -> local matmul with my rows of W -> gather_from.
        ref = _reference(lambda x, w: x @ w.T, [x_full, w_col], g_col)
        x = x_full.clone().requires_grad_()
        w = w_col.chunk(n, 0)[me].clone().requires_grad_()
        y = gather_from(copy_to(x, grid, dims) @ w.T, grid, dims)
        (y * g_col).sum().backward()
        results["column"] = _close(y, ref[0]) and _close(x.grad, ref[1]) and _close(w.grad, ref[2].chunk(n, 0)[me])

        # Row-parallel linear: scatter_to (my columns of x) -> matmul with my columns of W -> reduce_from.
        ref = _reference(lambda x, w: x @ w.T, [x_row, w_row], g_row)
        x = x_row.clone().requires_grad_()
        w = w_row.chunk(n, 1)[me].clone().requires_grad_()
        y = reduce_from(scatter_to(x, grid, dims) @ w.T, grid, dims)
        (y * g_row).sum().backward()
        results["row"] = _close(y, ref[0]) and _close(x.grad, ref[1]) and _close(w.grad, ref[2].chunk(n, 1)[me])

        # Sequence parallel MLP: my sequence chunk -> gather -> column -> gelu -> row -> reduce-scatter.
        ref = _reference(lambda s, a, b: torch.nn.functional.gelu(s @ a.T) @ b.T, [seq, w1, w2], g_seq)
        s = seq.chunk(n, 0)[me].clone().requires_grad_()
        a = w1.chunk(n, 0)[me].clone().requires_grad_()
        b = w2.chunk(n, 1)[me].clone().requires_grad_()
        hidden = torch.nn.functional.gelu(gather_from_sequence(s, grid, dims) @ a.T)
        y = reduce_scatter_to(hidden @ b.T, grid, dims)
        (y * g_seq.chunk(n, 0)[me]).sum().backward()
        results["sequence"] = (
            _close(y, ref[0].chunk(n, 0)[me])
            and _close(s.grad, ref[1].chunk(n, 0)[me])
            and _close(a.grad, ref[2].chunk(n, 0)[me])
            and _close(b.grad, ref[3].chunk(n, 1)[me])
        )
        # reduce_from leaves its input as it was (it reduces a copy).
        local = x_row @ w_row.T
        kept = local.clone()
        reduce_from(local, grid, dims)
        results["input_untouched"] = torch.equal(local, kept)
        out[dims] = results
    grid.destroy()
    return out


def _randn(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, dtype=torch.float64)


def _reference(
    fn: Callable[..., torch.Tensor], inputs: list[torch.Tensor], upstream: torch.Tensor
) -> list[torch.Tensor]:
    """Single-process output and input gradients of ``(fn(*inputs) * upstream).sum()``."""
    leaves = [tensor.clone().requires_grad_() for tensor in inputs]
    y = fn(*leaves)
    (y * upstream).sum().backward()
    return [y.detach(), *(leaf.grad for leaf in leaves if leaf.grad is not None)]


def run_source(source: str, function: str) -> Any:
    """Execute documentation code and call one function it defines (the docs' examples on real ranks)."""
    namespace: dict[str, Any] = {"__name__": "docs_example"}
    exec(compile(source, "docs/toolkit.md", "exec"), namespace)
    return _plain(namespace[function]())


def _plain(value: Any) -> Any:
    """Tensors as nested lists, recursively: tensors do not survive the trip back from an exited worker."""
    if isinstance(value, torch.Tensor):
        return value.tolist()
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_plain(item) for item in value)
    return value


def toolkit_scenarios(autograd_families: list[str]) -> dict[str, Any]:
    """Every scenario above in one 8-rank run (each spawn costs seconds)."""
    return _plain(
        {
            "collectives": collective_scenarios(),
            "pipeline": pipeline_scenarios(),
            "mesh": mesh_scenarios(),
            "mpu": mpu_scenarios(),
            "autograd": autograd_scenarios(autograd_families),
            "sub_enumerate": sub_grid_scenarios("enumerate"),
            "sub_local": sub_grid_scenarios("local"),
        }
    )
