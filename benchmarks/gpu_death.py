"""``make gpu-check``'s ``death`` step: a rank lost under NCCL (benchmarks/gpu_check.py plans and launches it).

    python benchmarks/gpu_death.py --nprocs N --timeout 40

Starts N NCCL ranks with `hypergrid.spawn` (``allow_deaths``: torchrun would stop
every worker at the first death), each on its own GPU with ``device_id``. The
last rank exits without a word between all-reduces; each survivor must see
``RankFailure`` naming it (the NCCL communicators aborted), ``shrink`` to a
world of N - 1 and all-reduce on the new grid. Prints each survivor's account;
exit status 1 if any differs.
"""

from __future__ import annotations

import argparse
import datetime
import os
import pathlib
import sys
import time
from typing import Any

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

import torch
import torch.distributed as dist

from benchmarks.gpu_workers import rank_tensor
from hypergrid import HyperCommGrid, RankFailure, WorkerError, spawn
from hypergrid.values import first_line


def death_scenario(timeout_s: float) -> dict[str, Any]:
    """One rank of ``death``: the last rank exits mid-loop; a survivor sees RankFailure, shrinks and all-reduces."""
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    grid = HyperCommGrid(
        [world], ["dp"], guard_timeout_s=timeout_s, group_options={"timeout": datetime.timedelta(seconds=timeout_s)}
    )
    grid.create_pg("dp")
    tensor = rank_tensor(rank, device)
    grid.all_reduce(tensor, "dp")
    if device.type == "cuda":
        torch.cuda.synchronize()
    dist.barrier()
    if rank == world - 1:
        os._exit(3)  # no word to anyone: what a lost node looks like
    out: dict[str, Any] = {"rank": rank}
    started = time.monotonic()
    try:
        for _ in range(1000):  # hypergrid's wait on the NCCL work (never blocking the host), then the host's
            work = grid.all_reduce(rank_tensor(rank, device), "dp", async_op=True)
            assert work is not None
            work.wait()
            if device.type == "cuda":
                torch.cuda.synchronize()
        out["failure"] = "none seen in 1000 all-reduces"
        return out
    except RankFailure as failure:
        out["failure"] = f"RankFailure dead={list(failure.dead)} after {time.monotonic() - started:.2f} s"
    except Exception as error:  # the finding: NCCL's error was not turned into RankFailure
        out["failure"] = f"not RankFailure: {type(error).__name__}: {first_line(error)[:300]}"
        return out
    started = time.monotonic()
    regrid = grid.shrink(dim="dp", timeout_s=timeout_s)
    out["shrink"] = f"epoch {regrid.epoch}, dead {list(regrid.dead)}, {time.monotonic() - started:.2f} s"
    if regrid.grid is not None:
        tensor = rank_tensor(dist.get_rank(), device)
        regrid.grid.all_reduce(tensor, "dp")
        out["after"] = tensor.cpu().tolist()
        out["new_world"] = dist.get_world_size()
    return out


def death(nprocs: int, timeout_s: float) -> int:
    """``death_scenario`` on ``nprocs`` NCCL ranks; prints each survivor's account. Exit status."""
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    os.environ.setdefault("HYPERGRID_PROBE_S", "10")  # a roll call after 10 s of waiting, before NCCL's own timeout
    try:
        outcomes = spawn(
            death_scenario, nprocs, (timeout_s,), backend=backend, timeout_s=timeout_s * 3, allow_deaths=True
        )
    except WorkerError as error:  # a survivor raised, or the run outlived its limit: the finding, in its own words
        print(f"# death on {nprocs} ranks, backend {backend}: NOT as expected\n{str(error)[:4000]}")
        return 1
    survivors = [o for o in outcomes if isinstance(o, dict)]
    for lost in outcomes[:-1]:
        if not isinstance(lost, dict):  # a survivor that died too (NCCL's watchdog tearing the process down, say)
            print(f"survivor lost: {lost!r}")
    print(f"# death on {nprocs} ranks, backend {backend}: rank {nprocs - 1} exits, {len(survivors)} survivors report")
    want = [float(sum(range(1, nprocs)))] * 4
    bad = len(survivors) != nprocs - 1
    for outcome in survivors:
        print(
            f"rank {outcome['rank']}: {outcome.get('failure')}; shrink: {outcome.get('shrink')}; "
            f"new world {outcome.get('new_world')}, all_reduce {outcome.get('after')}"
        )
        bad = bad or not str(outcome.get("failure", "")).startswith(f"RankFailure dead=[{nprocs - 1}]")
        bad = bad or outcome.get("after") != want
    print(
        f"# death: {'as expected' if not bad else 'NOT as expected'} (RankFailure naming rank {nprocs - 1}, "
        f"shrink to {nprocs - 1}, all-reduce {want[0]:g} on the new grid)"
    )
    return 1 if bad else 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nprocs", type=int, default=2, help="ranks to start (one per GPU)")
    parser.add_argument("--timeout", type=float, default=60.0, help="group and guard timeout in seconds")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return death(args.nprocs, args.timeout)


if __name__ == "__main__":
    sys.exit(main())
