"""Recovery at the Nth failure (issue 31): one rank SIGKILLed per round, the survivors shrink and go on each time.

Module-level functions so that ``spawn`` can import them. A ``1 x N`` grid
(tp1 x dpN, 600 s group timeouts); in each round the last rank of the current
world SIGKILLs itself inside a step, the others catch ``RankFailure``, shrink
along ``dp`` with nobody named and run a step on the new grid. At the end of
every round each survivor records what a leak would grow: its hypergrid
threads, its open file descriptors and the number of keys in the job's store.
"""

from __future__ import annotations

import datetime
import os
import signal
import threading
import time
from typing import Any

import torch
import torch.distributed as dist

from hypergrid import HyperCommGrid
from hypergrid.agreement.world import World
from hypergrid.errors import RankFailure

#: Production-like: a collective waits this long before torch gives up on its own.
GROUP_TIMEOUT = datetime.timedelta(seconds=600)
#: Shrink's own bound (moderate: a death inside it is absorbed within it).
SHRINK_TIMEOUT_S = 30.0


def _grid() -> Any:
    grid = HyperCommGrid(
        [1, dist.get_world_size()], ["tp", "dp"], guard_timeout_s=60.0, group_options={"timeout": GROUP_TIMEOUT}
    )
    grid.create_pgs(["tp", "dp"])
    return grid


def _step(grid: Any) -> float:
    """A tensor-parallel then a data-parallel reduction of ones: the world's size, if every rank took part."""
    x = torch.ones(4)
    grid.all_reduce(x, "tp")
    grid.all_reduce(x, "dp")
    return float(x[0].item())


def _footprint(grid: Any) -> dict[str, Any]:
    """What a leak grows, once every rank of the world finished its round (a barrier on the world's grid)."""
    _step(grid)  # every rank is past its shrink and its first step: no roll call or commit is in flight
    base = World.current().base_store
    threads = sorted(thread.name for thread in threading.enumerate() if thread.name.startswith("hypergrid"))
    ours = sorted(key for key in base.list_keys() if key.startswith("hypergrid/"))
    return {"threads": threads, "fds": len(os.listdir("/proc/self/fd")), "keys": base.num_keys(), "ours": ours}


def successive_deaths(deaths: int) -> dict[str, Any]:
    """``deaths`` rounds; in each the last rank of the current world SIGKILLs itself and the others recover.

    Returns, per round a survivor lived through, the result of the first step on the new grid, the world's
    size and the footprint (`_footprint`); round 0 is the footprint before any death.
    """
    grid = _grid()
    out: dict[str, Any] = {"old_rank": dist.get_rank(), "rounds": [_footprint(grid) | {"world": dist.get_world_size()}]}
    for _ in range(deaths):
        victim = dist.get_world_size() - 1
        try:
            if dist.get_rank() == victim:
                os.kill(os.getpid(), signal.SIGKILL)
            time.sleep(0.2)  # the victim dies while the others are in their collectives
            _step(grid)
            out["error"] = "a step went through with a dead rank"
            return out
        except RankFailure as failure:
            caught = failure.dead
        regrid = grid.shrink(dim="dp", timeout_s=SHRINK_TIMEOUT_S)
        grid = regrid.grid
        first = _step(grid)
        seen = {"caught": caught, "dead": list(regrid.dead), "first": first, "world": dist.get_world_size()}
        out["rounds"].append(_footprint(grid) | seen)
    grid.destroy()
    return out
