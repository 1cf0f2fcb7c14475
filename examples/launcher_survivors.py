"""Carry on after a worker's death under ``python -m hypergrid.run``: the survivors shrink the grid and finish.

    python -m hypergrid.run --standalone --nproc-per-node 4 examples/launcher_survivors.py \\
        [--tp 1] [--steps 5] [--kill-rank 3] [--kill-step 2] [--report FILE]

Every worker joins the job (``hypergrid.init_from_env``: gloo on CPU), builds a
tp x dp grid over the world (tp=1 by default: dp = the world) and runs
``--steps`` steps of one all-reduce over ``dp`` and one over ``tp``; in step
``s`` rank ``r`` contributes ``(r + 1) * (s + 1)``. At step ``--kill-step``
rank ``--kill-rank`` SIGKILLs itself (first attempt only: not after a restart).
The survivors catch ``hypergrid.RankFailure``, call ``grid.shrink`` (policy
``"drop"``: the dead rank's dp slice goes; with tp > 1 its tp partners retire
and exit 0) and redo the step on the new grid. Under plain torchrun they
never get there: its agent stops every worker when one dies.

Each worker prints one line when it ends; with ``--report FILE`` it also
appends one JSON line (its old and new rank, the new world, the sums it got)
to FILE, which the test reads.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import signal
import time
from typing import Any

import torch
import torch.distributed as dist

import hypergrid

# The groups' timeout: a survivor that does not talk to the dead rank sees the failure at this timeout.
GROUP_TIMEOUT_S = 3.0
# shrink's: longer than the groups', so that every survivor arrives before anyone is declared dead by timeout.
SHRINK_TIMEOUT_S = 10.0


def step_sums(grid: hypergrid.HyperCommGrid, step: int) -> dict[str, float]:
    """One step: this rank's contribution all-reduced over ``dp`` and over ``tp``."""
    sums = {}
    for dim in ("dp", "tp"):
        value = torch.tensor([float((dist.get_rank() + 1) * (step + 1))])
        grid.all_reduce(value, dim)
        sums[dim] = value.item()
    return sums


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tp", type=int, default=1)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--kill-rank", type=int, default=3)
    parser.add_argument("--kill-step", type=int, default=2)
    parser.add_argument("--report", default="")
    args = parser.parse_args()

    hypergrid.init_from_env(timeout_s=60)
    first_rank, restart = dist.get_rank(), int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    grid = hypergrid.HyperCommGrid(
        [args.tp, dist.get_world_size() // args.tp],
        ["tp", "dp"],
        guard_timeout_s=30,
        group_options={"timeout": datetime.timedelta(seconds=GROUP_TIMEOUT_S)},
    )
    grid.create_pgs(["tp", "dp"])
    outcome: dict[str, Any] = {"first_rank": first_rank, "restart": restart, "caught": None, "sums": []}
    step = 0
    while step < args.steps:
        if first_rank == args.kill_rank and step == args.kill_step and restart == 0:
            os.kill(os.getpid(), signal.SIGKILL)
        try:
            outcome["sums"].append(step_sums(grid, step))
            step += 1
        except hypergrid.RankFailure as failure:
            began = time.perf_counter()
            regrid = grid.shrink(dead=failure.dead or None, dim="dp", timeout_s=SHRINK_TIMEOUT_S)
            outcome.update(caught=type(failure).__name__, dead=list(regrid.dead), retired=regrid.retired)
            outcome["shrink_s"] = round(time.perf_counter() - began, 3)
            if regrid.retired:
                break
            grid = regrid.grid
    retired = outcome.get("retired", False)
    outcome.update(rank=None if retired else dist.get_rank(), world=None if retired else dist.get_world_size())
    outcome["shape"] = None if retired else dict(zip(grid.dim_names, grid.shape))
    where = "retired" if retired else f"rank {outcome['rank']} of {outcome['world']}, grid {outcome['shape']}"
    dead = f"; survived the death of rank(s) {outcome['dead']}" if outcome["caught"] else ""
    print(f"worker {first_rank}: {where}, {len(outcome['sums'])} steps{dead}", flush=True)
    if args.report:
        with open(args.report, "a") as out:
            out.write(json.dumps(outcome) + "\n")
    if not retired:
        grid.destroy()
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
