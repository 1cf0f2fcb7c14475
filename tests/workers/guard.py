"""Functions run inside spawned gloo processes for the guard's tests (module level, so spawn can import them)."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

import hypergrid.grid.batch
from benchmarks.guard import CountingStore
from hypergrid import HyperCommGrid
from hypergrid.agreement.arrivals import Arrivals
from hypergrid.agreement.liveness import done_key, members_key, world_keys
from hypergrid.timing import Timing
from tests.workers.basic import _allreduce_rank, _outcome


@contextmanager
def counted_store() -> Iterator[CountingStore]:
    """The default store as the guard sees it, through a counter (torch itself never asks for it)."""
    real = c10d._get_default_store
    counter = CountingStore(real())
    c10d._get_default_store = lambda: counter
    try:
        yield counter
    finally:
        c10d._get_default_store = real


def store_ops() -> dict[str, Any]:
    """Store operations of this rank per guard round: every family one by one, then all in one create_pgs.

    The success path only: a round slower than the probe time (a loaded host) would add the slow path's
    roll-call mark and probe reads, so the probe is moved out of reach.
    """
    probe = Timing.round_probe_s
    Timing.round_probe_s = lambda self, participants: 3600.0  # type: ignore[method-assign]
    shape = [2] * (dist.get_world_size().bit_length() - 1)
    names = ["tp", "cp", "dp"][: len(shape)]
    per_family = []
    with counted_store() as counter:
        grid = HyperCommGrid(shape, names)
        for family in grid.layout.all_families():
            before = counter.ops
            grid.create_pg(family)
            per_family.append(counter.ops - before)
        batch = HyperCommGrid(shape, names)
        before = counter.ops
        groups = batch.create_pgs(list(reversed(batch.layout.all_families())))
        in_batch = counter.ops - before
    sums = {key: _allreduce_rank(group) for key, group in groups.items()}
    grid.destroy()
    batch.destroy()
    Timing.round_probe_s = probe  # type: ignore[method-assign]
    return {"per_family": per_family, "batch": in_batch, "families": len(groups), "sums": sums}


def failure_scenarios() -> dict[str, Any]:
    """A skipped call, a differing guard timeout, and create_pgs listed in different orders, on 8 ranks."""
    rank = dist.get_rank()
    out: dict[str, Any] = {}
    # Rank 3 skips create_pg('tp') and goes on with create_pg('dp'): both are creation #0 of the grid.
    grid = HyperCommGrid([2, 2, 2], ["tp", "cp", "dp"], guard_timeout_s=60)
    out["skipped"] = _outcome(lambda: grid.create_pg("dp" if rank == 3 else "tp"))
    # Rank 0 configured another guard timeout than the others.
    timed = HyperCommGrid([2, 2, 2], ["tp", "cp", "dp"], guard_timeout_s=30 if rank == 0 else 60)
    out["timeout_differs"] = _outcome(lambda: timed.create_pg("tp"))
    # The same batch listed in another order on odd ranks: one canonical order, so they agree.
    batch = HyperCommGrid([2, 2, 2], ["tp", "cp", "dp"])
    families = batch.layout.all_families()
    groups = batch.create_pgs(families[::-1] if rank % 2 else families)
    out["batch_keys"] = list(groups)
    out["batch_sums"] = {key: _allreduce_rank(group) for key, group in groups.items()}
    # The same batch, but rank 5 asks for one family fewer.
    other = HyperCommGrid([2, 2, 2], ["tp", "cp", "dp"])
    out["batch_mismatch"] = _outcome(lambda: other.create_pgs(families[:-1] if rank == 5 else families))
    for each in (grid, timed, batch, other):
        each.destroy()
    return out


def create_pgs_with(strategy: str) -> dict[str, Any]:
    """create_pgs of every family of a [2, 2, 2] grid and of an offset [2, 2] grid with ``strategy``."""
    grid = HyperCommGrid([2, 2, 2], ["tp", "cp", "dp"], strategy=strategy)
    groups = grid.create_pgs(grid.layout.all_families())
    out: dict[str, Any] = {key: (dist.get_process_group_ranks(g), _allreduce_rank(g)) for key, g in groups.items()}
    offset = HyperCommGrid([2, 2], ["tp", "dp"], rank_offset=4, strategy=strategy)
    for key, group in offset.create_pgs(["dp", "tp"]).items():
        out[f"offset {key}"] = None if group is None else _allreduce_rank(group)
    # With "local", ranks 0-3 take part in nothing of the offset grid: without this barrier they destroy the
    # shared groups (and exit) while rank 4-7 may still finish its last all_reduce on them, and gloo fails that
    # all_reduce with "Connection closed by peer" (CI, 1 run in ~1900 tests). destroy() is local, as torch's is.
    dist.barrier()
    grid.destroy()
    offset.destroy()
    return out


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def _left(store: Any, baseline: int) -> int:
    """Keys above ``baseline`` once every rank got here, counted before any rank goes on.

    The world's own keys (its ``done``, the number of its last roll call that every rank read, and who is in its
    watch: `hypergrid.agreement.liveness.world_keys`; where a process that arrives wakes it:
    `hypergrid.agreement.arrivals`), which stay while a grid holds the world, are not counted:
    `store_hygiene` says whether they are there at the end.
    """
    dist.barrier()
    own = [*world_keys(0), Arrivals.key("world")]  # (the last: where an arrival wakes the world, while it is held)
    keys = int(store.num_keys()) - baseline - sum(int(store.check([key])) for key in own)
    dist.barrier()
    return keys


def store_hygiene(creations: int) -> dict[str, Any]:
    """Keys hypergrid leaves in the store over many guard rounds, failed rounds and destroy(), on 2 ranks.

    Torch's own group creation is replaced by nothing (the caller gets None), so
    that only the guard writes to the store and ``num_keys()`` counts its keys.
    Between rounds a grid keeps one key, its last commit's verdict, and each rank that waited long in a
    round its announcement; destroy() deletes them.
    """
    store = c10d._get_default_store()
    rank = dist.get_rank()
    hypergrid.grid.batch.create_family = lambda *args, **kwargs: None  # type: ignore[assignment]
    baseline = _left(store, 0)
    out: dict[str, Any] = {"during": [], "steady": []}
    grid = HyperCommGrid([2], ["dp"])
    for index in range(creations):
        grid.create_pg("dp")
        grid.destroy()
        if index % 100 == 0:
            out["during"].append(store.num_keys() - baseline)
    out["after_successes"] = _left(store, baseline)
    # Successful rounds without destroy: the count stays the same (the last commit's verdict).
    steady = HyperCommGrid([2], ["dp"])
    for index in range(creations):
        steady.create_pg("dp", tag=f"t{index}")
        if index % 100 == 99:
            out["steady"].append(_left(store, baseline))
    steady.destroy()
    out["after_steady_destroy"] = _left(store, baseline)
    # Mismatches: each failed round keeps its roster and verdict until destroy().
    for _ in range(5):
        _outcome(lambda: grid.create_pg("dp", group_desc=f"rank{rank}"))
    out["after_mismatches"] = _left(store, baseline)
    grid.destroy()
    out["after_mismatch_destroy"] = _left(store, baseline)
    # Timeouts: rank 1 arrives after rank 0 gave up (it gets the same error, late); progress lines on rank 0.
    lines = _Lines()
    logging.getLogger("hypergrid").addHandler(lines)
    slow = HyperCommGrid([2], ["dp"], guard_timeout_s=1.0, guard_progress_s=0.2)
    out["timeouts"] = []
    for _ in range(2):
        if rank == 1:
            time.sleep(2.0)
        out["timeouts"].append(_outcome(lambda: slow.create_pg("dp")))
        dist.barrier()
    logging.getLogger("hypergrid").removeHandler(lines)
    out["progress"] = lines.lines
    out["after_timeouts"] = _left(store, baseline)
    slow.destroy()
    out["after_destroy"] = _left(store, baseline)
    # A failed round's keys also go with the next completed round of the same grid.
    if rank == 1:
        time.sleep(2.0)
    _outcome(lambda: slow.create_pg("dp"))
    out["after_third_timeout"] = _left(store, baseline)
    slow.create_pg("dp")
    out["after_next_success"] = _left(store, baseline)
    slow.destroy()
    out["after_final_destroy"] = _left(store, baseline)
    # No grid holds the world any more: every rank left its watch, the last deleting the world's keys.
    out["world_keys"] = [key for key in (done_key(0), members_key(0)) if store.check([key])]
    return out


def ops_and_failures() -> dict[str, Any]:
    """`store_ops` and then `failure_scenarios` in one world of 8."""
    return {"ops": store_ops(), **failure_scenarios()}


def create_pgs_strategies() -> dict[str, Any]:
    """`create_pgs_with` each strategy that runs on gloo."""
    return {strategy: create_pgs_with(strategy) for strategy in ("enumerate", "local")}


def unavailable_backend_alone(backend: str) -> dict[str, Any]:
    """Rank 0 alone asks for a backend torch lacks here, with a guard that would wait 600 s for the others.

    Refused before the guard round: the others (who never call) are not waited for. Rank 1 waits for rank 0's
    word in the store, so the world stays up while rank 0 asks.
    """
    store, rank = c10d._get_default_store(), dist.get_rank()
    out: dict[str, Any] = {}
    if rank == 0:
        grid = HyperCommGrid([2], ["dp"], guard_timeout_s=600)
        for strategy in ("enumerate", "local"):
            out[strategy] = _outcome(lambda strategy=strategy: grid.create_pg("dp", backend=backend, strategy=strategy))
        store.set("unavailable_backend_alone", "done")
    else:
        store.wait(["unavailable_backend_alone"])
    return out
