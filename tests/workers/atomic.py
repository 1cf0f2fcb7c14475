"""A death at each point of a creation (issue 31): every survivor holds the same registry, and ``shrink`` works.

Module-level functions so that ``spawn`` can import them. A ``tp=2 x dp=N/2``
grid (600 s group timeouts, a moderate guard timeout) holds ``tp``; in each
round rank 3 of the current world dies at one point of a creation of ``dp``
(or of ``dp`` and ``dp-tp`` in one ``create_pgs``), the survivors catch
``RankFailure``, record their registries, shrink along ``dp`` and run a real
all-reduce over every dim of the new grid. Points:

- ``before``: SIGKILL before the call (it never reaches the guard round);
- ``torch``: ``os._exit`` inside torch's ``new_subgroups_by_enumeration``, at its
  second ``new_group`` (the ``dp`` group of rank 3, after one group was made):
  the ranks outside that group finish and register ``dp``, its members wait in torch;
- ``registered``: ``os._exit`` after every rank (the victim too) created and
  registered the families of a ``create_pgs``, before the commit;
- ``committed``: ``os._exit`` once the commit passed (every rank holds the families).

Under ``"local"`` the ``torch`` death comes at the victim's only ``new_group`` (its own ``dp`` group): that
group's members roll ``dp`` back, the other group keeps it (each group commits alone), and ``shrink``
re-creates what every survivor holds.
"""

from __future__ import annotations

import datetime
import os
import signal
import time
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

import hypergrid.grid.batch
from hypergrid import HyperCommGrid, RankFailure

#: The rank of the current world that dies in each round.
VICTIM = 3
#: Production-like group timeouts; the guard (and so torch's wait in a creation) bounded well below shrink's.
GROUP_TIMEOUT = datetime.timedelta(seconds=600)
GUARD_TIMEOUT_S = 12.0
SHRINK_TIMEOUT_S = 30.0
#: Where creation looks up the commit (`hypergrid.agreement.guard.settle`), replaced on the victim.
_BATCH: Any = hypergrid.grid.batch


def _die_inside_torch(call: int) -> None:
    """Exit at torch's ``call``-th ``new_group`` (``new_subgroups_by_enumeration`` looks the name up in c10d,
    members-only creation calls ``torch.distributed.new_group``)."""
    real, calls = c10d.new_group, [0]

    def dying(*args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        if calls[0] == call:
            os._exit(17)
        return real(*args, **kwargs)

    c10d.new_group = dist.new_group = dying


def _die_at(point: str, strategy: str) -> None:
    """Arrange this rank's death at ``point`` of the next creation (``before``: now)."""
    if point == "before":
        os.kill(os.getpid(), signal.SIGKILL)
    elif point == "torch":  # "enumerate" makes every group of the family, "local" only the caller's
        _die_inside_torch(2 if strategy == "enumerate" else 1)
    elif point == "registered":
        _BATCH.settle = lambda *args, **kwargs: os._exit(17)
    elif point == "committed":
        real = _BATCH.settle

        def settle_then_die(*args: Any, **kwargs: Any) -> None:
            real(*args, **kwargs)
            os._exit(17)

        _BATCH.settle = settle_then_die
    else:
        raise ValueError(f"unknown point {point!r}")


def _create(grid: Any, point: str) -> None:
    """The creation a round fails in: ``dp`` alone, or ``dp`` and ``dp-tp`` in one ``create_pgs``."""
    if point in ("registered", "committed"):
        grid.create_pgs(["dp", ["dp", "tp"]])
    else:
        grid.create_pg("dp")


def _sum_of_ranks(grid: Any) -> tuple[float, float]:
    """A real all-reduce of each rank's number over every dim of the grid, and what it must give."""
    size = dist.get_world_size()
    x = torch.tensor([float(dist.get_rank())])
    grid.all_reduce(x, ["dp", "tp"])
    return float(x.item()), float(size * (size - 1) // 2)


def creation_deaths(points: list[str], strategy: str = "enumerate") -> dict[str, Any]:
    """One round per point (see the module docstring); per round, what this survivor saw."""
    world = dist.get_world_size()
    grid = HyperCommGrid(
        [2, world // 2],
        ["tp", "dp"],
        strategy=strategy,
        guard_timeout_s=GUARD_TIMEOUT_S,
        group_options={"timeout": GROUP_TIMEOUT},
    )
    grid.create_pg("tp")
    out: dict[str, Any] = {"old_rank": dist.get_rank(), "rounds": []}
    for number, point in enumerate(points):
        rank, size = dist.get_rank(), dist.get_world_size()
        seen: dict[str, Any] = {"point": point, "world": size}
        out["rounds"].append(seen)
        dist.barrier()  # every rank reaches the round before the victim arranges its death
        if rank == VICTIM:
            _die_at(point, strategy)
        start = time.monotonic()
        try:
            _create(grid, point)
            # After the commit, or in a "local" group without the victim, the failure is met in the next step.
            grid.all_reduce(torch.ones(1), "tp")
            grid.all_reduce(torch.ones(1), "dp")
            seen["error"] = "a step went through with a dead rank"
            return out
        except RankFailure as failure:
            seen.update(caught=type(failure).__name__, dead=failure.dead, seconds=time.monotonic() - start)
        seen["keys"] = [str(key) for key in grid.created_keys]
        began = time.monotonic()
        regrid = grid.shrink(dead=seen["dead"] or None, timeout_s=SHRINK_TIMEOUT_S)
        seen.update(shrunk=list(regrid.dead), retired=regrid.retired, attempts=regrid.attempts)
        seen["shrink_s"] = time.monotonic() - began  # (shown when a check fails)
        if regrid.retired:
            return out
        grid = regrid.grid
        seen["new_keys"] = [str(key) for key in grid.created_keys]
        seen["sum"], seen["expected"] = _sum_of_ranks(grid)
        if number < len(points) - 1:  # the next round starts from ``tp`` alone again
            grid.destroy()
            grid.create_pg("tp")
    grid.destroy()
    return out
