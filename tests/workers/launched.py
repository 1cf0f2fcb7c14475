"""Workers for ``python -m hypergrid.run`` tests: each ends in the way a test asks for.

    python -m hypergrid.run --standalone --nproc-per-node N tests/workers/launched.py MODE [--pids DIR]

Modes:
    outside: a 4-rank grid in a larger world: the ranks outside it raise ``RankError`` at their first
        grid call (nobody shrinks: their deaths are unaccounted).
    die: every rank all-reduces once, then rank 3 SIGKILLs itself and the others exit 0 without
        noticing (an unaccounted death).
    twice: a dp grid over the world, six steps of one all-reduce; the launcher's rank 1 SIGKILLs
        itself at step 1 and rank 4 at step 3 (rank 3 of the world the first shrink made): the
        survivors shrink twice and finish (both deaths accounted for, in the launcher's ranks).
    sleep: every rank waits (sleeps) until it is stopped; with ``--pids DIR`` each writes its pid
        to DIR/rank<R>.pid first.
    unformed: in the round's first start, the launcher's rank 1 SIGKILLs itself before it forms the first world
        (the others wait in it); then every rank all-reduces once and exits 0.
    neverjoins: as ``die``; under ``--replace-dead`` the replacement of rank 3 never joins (it sleeps).
"""

from __future__ import annotations

import argparse
import datetime
import os
import pathlib
import signal
import time

import torch
import torch.distributed as dist

import hypergrid


def sleep_forever(pid_dir: str) -> None:
    """Write this worker's pid to ``pid_dir/rank<R>.pid`` (unless ``pid_dir`` is empty), then sleep until stopped."""
    if pid_dir:
        (pathlib.Path(pid_dir) / f"rank{dist.get_rank()}.pid").write_text(str(os.getpid()))
    while True:
        time.sleep(0.1)


def twice(first_rank: int) -> None:
    """Two deaths, two shrinks (see the module's docstring)."""
    timeout = {"timeout": datetime.timedelta(seconds=3)}
    grid = hypergrid.HyperCommGrid([dist.get_world_size()], ["dp"], guard_timeout_s=30, group_options=timeout)
    grid.create_pgs(["dp"])
    step = 0
    while step < 6:
        if (first_rank, step) in ((1, 1), (4, 3)):
            os.kill(os.getpid(), signal.SIGKILL)
        try:
            grid.all_reduce(torch.ones(1), "dp")
            step += 1
        except hypergrid.RankFailure as failure:
            grid = grid.shrink(dead=failure.dead or None, dim="dp", timeout_s=10).grid
    grid.destroy()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["outside", "die", "twice", "sleep", "unformed", "neverjoins"])
    parser.add_argument("--pids", default="")
    args = parser.parse_args()
    if args.mode == "neverjoins" and os.environ.get("HYPERGRID_ARRIVAL") == "1":
        sleep_forever("")  # a replacement whose script never calls grid.arrive
    first_start = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"
    if args.mode == "unformed" and first_start and os.environ["RANK"] == "1":
        time.sleep(0.5)  # (the others begin forming the world)
        os.kill(os.getpid(), signal.SIGKILL)
    hypergrid.init_from_env(timeout_s=60)
    rank = dist.get_rank()
    if args.mode == "outside":
        grid = hypergrid.HyperCommGrid([4], ["dp"])
        grid.create_pgs(["dp"])
        value = torch.ones(1)
        grid.all_reduce(value, "dp")  # ranks 4 and up are not in the grid: RankError
    elif args.mode == "twice":
        twice(rank)
    elif args.mode in ("die", "unformed", "neverjoins"):
        dist.all_reduce(torch.ones(1))
        if args.mode != "unformed" and rank == 3:
            os.kill(os.getpid(), signal.SIGKILL)
    else:
        sleep_forever(args.pids)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
