"""Worker functions for the guard's promise under desync and death (spawned gloo processes, module level).

Each scenario returns, per rank, what that rank saw: ``"ok ..."`` or
``"<ErrorClass>: <message>"`` with the seconds it took, so the tests can check
every survivor.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

import hypergrid.grid.batch
from hypergrid import HyperCommGrid, HyperGridError, RankFailure
from hypergrid.agreement import protocol
from hypergrid.agreement.arrivals import Arrivals
from hypergrid.agreement.liveness import world_keys


def timed(create: Callable[[], Any]) -> dict[str, Any]:
    """Run ``create``; what this rank saw, how long it took, and the error's ``dead`` if any."""
    start = time.monotonic()
    try:
        group = create()
        seen = "ok" if group is None else f"ok {dist.get_process_group_ranks(group)}"
        dead: list[int] = []
    except HyperGridError as error:
        seen = f"{type(error).__name__}: {error}"
        dead = list(getattr(error, "dead", []))
    return {"seen": seen, "seconds": time.monotonic() - start, "dead": dead}


def desync(case: str) -> dict[str, Any]:
    """One of the desync holes on 4 ranks: rank 3 (or 0) differs in what the guard must compare."""
    rank = dist.get_rank()
    odd = rank == 3
    out: dict[str, Any] = {}
    if case == "share_groups":
        grid = HyperCommGrid([2, 1, 2], ["tp", "cp", "dp"], share_groups=not odd, guard_timeout_s=20)
        out["first"] = timed(lambda: grid.create_pg("tp"))
    elif case == "view":
        grid = HyperCommGrid([2, 2], ["tp", "dp"], guard_timeout_s=20)
        shape, names = ([2, 2], ["ep", "edp"]) if not odd else ([2, 2], ["edp", "ep"])
        grid.register_view("expert", shape, names)
        out["first"] = timed(lambda: grid.create_pg("ep", view="expert"))
    elif case == "strategy":
        grid = HyperCommGrid([2, 2], ["tp", "dp"], strategy="local" if odd else "enumerate", guard_timeout_s=20)
        out["first"] = timed(lambda: grid.create_pg("dp"))
    elif case == "destroy_one":
        # tp and cp-tp share their groups (cp has size 1); rank 3 alone releases tp, then all ask for cp-tp.
        grid = HyperCommGrid([2, 1, 2], ["tp", "cp", "dp"], guard_timeout_s=20)
        grid.create_pg("tp")
        if odd:
            grid.destroy()
        out["first"] = timed(lambda: grid.create_pg(["cp", "tp"]))
        out.update(_recover(grid, lambda: grid.create_pg(["cp", "tp"])))
    elif case == "swapped_grids":
        a = HyperCommGrid([2, 2], ["tp", "dp"], guard_timeout_s=20)
        b = HyperCommGrid([2, 2], ["tp", "dp"], guard_timeout_s=20)
        first = b if odd else a
        out["first"] = timed(lambda: first.create_pg("tp"))
    elif case == "skipped":
        # The program creates tp, then dp; rank 3 skips tp. Then every rank recovers as documented.
        grid = HyperCommGrid([2, 2], ["tp", "dp"], guard_timeout_s=20)
        out["first"] = timed(lambda: grid.create_pg("dp" if odd else "tp"))
        if not odd:
            out["second"] = timed(lambda: grid.create_pg("dp"))
        out.update(_recover(grid, lambda: grid.create_pg("tp")))
        out["sum"] = _sum(grid.get_pg("tp"))
    elif case == "three_grids":
        # The program creates tp on grids a, b, c in that order; rank 2 starts at b, rank 3 at c.
        grids = [HyperCommGrid([2, 2], ["tp", "dp"], guard_timeout_s=20) for _ in range(3)]
        start = {2: 1, 3: 2}.get(rank, 0)
        out["first"] = timed(lambda: [grids[(start + i) % 3].create_pg("tp") for i in range(3)][-1])
        rounds = []
        for _ in range(3):  # the documented way back, for several grids: destroy() each on every rank, retry
            for grid in grids:
                grid.destroy()
            rounds.append(timed(lambda: [grid.create_pg("tp") for grid in grids][-1]))
            if rounds[-1]["seen"].startswith("ok"):
                break
        out["tries"] = rounds
        if rounds[-1]["seen"].startswith("ok"):
            out["sums"] = [_sum(grid.get_pg("tp")) for grid in grids]
        for grid in grids:
            grid.destroy()
        dist.barrier()
        out["left"] = int(c10d._get_default_store().num_keys())
    else:
        raise ValueError(case)
    return out


def _recover(grid: HyperCommGrid, create: Callable[[], Any]) -> dict[str, Any]:
    """The documented way back: destroy() and create again, until the creation works (3 tries)."""
    tries = []
    for _ in range(3):
        grid.destroy()
        tries.append(timed(create))
        if tries[-1]["seen"].startswith("ok"):
            break
    return {"tries": tries}


def _sum(group: Any) -> int:
    value = torch.tensor([dist.get_rank()])
    dist.all_reduce(value, group=group)
    return int(value.item())


def death(point: str, strategy: str, timeout_s: float) -> dict[str, Any]:
    """Rank ``VICTIM`` dies (``os._exit``) at ``point`` of a creation of ``dp`` on a 2 x 2 grid of 4 ranks.

    Points: ``before`` (never arrives), ``waiting`` (after arriving, while it
    waits for the verdict), ``decider`` (arrives last, dies before the
    verdict), ``creating`` (after agreement, while torch creates the groups).
    """
    rank = dist.get_rank()
    victim = VICTIM
    grid = HyperCommGrid([2, 2], ["tp", "dp"], strategy=strategy, guard_timeout_s=timeout_s, guard_progress_s=60)
    dist.barrier()
    if rank == victim:
        if point == "before":
            os._exit(17)
        if point == "waiting":
            protocol.Round.await_verdict = lambda self: os._exit(17)  # type: ignore[method-assign]
        if point == "decider":
            time.sleep(1.0)  # arrive last: the one that decides
            protocol.Round.decide = lambda self: os._exit(17)  # type: ignore[method-assign]
        if point == "creating":
            hypergrid.grid.batch.create_family = lambda *args, **kwargs: os._exit(17)  # type: ignore[assignment]
    elif point == "waiting":
        time.sleep(1.0)  # the victim arrives first and waits
    return timed(lambda: grid.create_pg("dp"))


#: The rank that dies in `death` (shares dp group [1, 3] with rank 1).
VICTIM = 3


def near_deadline_race() -> dict[str, Any]:
    """Rank 1 'reaches its deadline' exactly as 'ok' lands: its wait ends without seeing the verdict.

    Injected: rank 1's first wait for the verdict returns None (as at its
    deadline) only once the verdict is already in the store; then it gives up
    and must still end with 'ok' and leave no key behind.
    """
    rank = dist.get_rank()
    store = c10d._get_default_store()
    baseline = _keys(store)
    if rank == 1:
        real_wait = protocol.Round._wait

        def late(self: protocol.Round, deadline: float, progress: bool) -> Any:
            protocol.Round._wait = real_wait  # type: ignore[method-assign]
            store.wait([self._verdict_key])  # the verdict lands...
            return None  # ...just as this rank's deadline passes

        protocol.Round._wait = late  # type: ignore[method-assign]
    hypergrid.grid.batch.create_family = lambda *args, **kwargs: None  # type: ignore[assignment]
    grid = HyperCommGrid([2], ["dp"], guard_timeout_s=10)
    seen = timed(lambda: grid.create_pg("dp"))
    during = _keys(store) - baseline
    grid.destroy()
    return {"seen": seen["seen"], "during": during, "after": _keys(store) - baseline}


def _keys(store: Any) -> int:
    """The store's keys but the world's own (who is in its watch, where an arrival wakes it: they stay while a grid
    holds the world)."""
    dist.barrier()
    own = [*world_keys(0), Arrivals.key("world")]
    count = int(store.num_keys()) - sum(int(store.check([key])) for key in own)
    dist.barrier()
    return count


def rank_failure_is_caught() -> bool:
    """`RankFailure` is what a training loop catches: the guard's timeout is one."""
    from hypergrid import GuardTimeoutError

    return issubclass(GuardTimeoutError, RankFailure)
