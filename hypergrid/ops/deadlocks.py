"""Checked calls that can never meet: found through the store while their comparisons wait.

A checked collective (`hypergrid.ops.checks`) compares its call with one ``all_gather`` on its own group; ranks
that call different families' collectives, or skip one, wait in different gathers, which no gather over one family
can see. A comparison still waiting after `TICK_S` publishes what it waits in on the default group's store and,
every `TICK_S`, follows the records of the members it waits for (at most `MAX_READS`); a path back to itself is a
cycle of waits that can never end, written to the grid's verdict key, and every waiting rank raises
`CollectiveMismatchError` naming every call in it. The rules, the cost and what follows (the grid refuses checked
calls until ``destroy()``) are in docs/reliability.md.
"""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import json
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

from hypergrid.agreement.diagnosis import read
from hypergrid.binding.failures import Watched
from hypergrid.binding.registry import guard_key
from hypergrid.errors import CollectiveMismatchError, RankFailure
from hypergrid.values import format_ranks

__all__ = ["MAX_READS", "TICK_S", "Pending", "namespace", "wait_comparing"]

#: How long a comparison waits before it publishes what it waits in, and between two looks at the others.
TICK_S = 1.0
#: The most records one look reads (a search through large groups stops there and looks again next tick).
MAX_READS = 4096


@dataclass(frozen=True)
class Pending:
    """What a waiting comparison stands for: published when it waits longer than `TICK_S`.

    Attributes:
        root: the root grid of the call.
        family: the call's family (its registry key, as the guard writes it).
        number: the call's number on that family on this rank (0 for the first of the epoch).
        waits_in: the family whose group the waiting gather runs on (a hierarchy's half, or ``family``).
        describe: the call in words (asked only when the comparison waits).
        counts: how many calls this rank started on each family (this one included).
    """

    root: Any
    family: str
    number: int
    waits_in: str
    describe: Callable[[], str]
    counts: dict[str, int]


def namespace(root: Any) -> str:
    """The store prefix of a grid's waiting comparisons in its current epoch (``destroy()`` starts the next).

    Examples:
        >>> from types import SimpleNamespace
        >>> class Grid:
        ...     _core = SimpleNamespace(ordinal=0, epoch=2, describe=lambda: "tp2-dp2")
        >>> namespace(Grid()).endswith("/e2")
        True
    """
    text = f"{root._core.ordinal}:{root._core.describe()}"
    digest = hashlib.sha1(text.encode(), usedforsecurity=False).hexdigest()[:16]
    return f"hypergrid/checked/{digest}/e{root._core.epoch}"


def wait_comparing(work: Watched, what: str, pending: Pending, on_cpu: bool = True) -> None:
    """Wait for a comparison's gather; past `TICK_S`, look for calls that can never meet, each tick.

    ``on_cpu``: the rows are CPU tensors (gloo), so torch's own timed wait
    ticks (no thread to hand the completion over); else the work's future does.

    Raises:
        CollectiveMismatchError: this rank waits in a cycle of calls that can never meet, or another rank
            found one (the verdict key).
        RankFailure: a member is gone, or failure news came (`hypergrid.binding.failures`).
    """
    done = _ticker(work.work, on_cpu)
    try:
        if not done() and dist.get_backend() != "fake":
            with _Watch(pending) as watch:
                while not done():
                    if work.alarm is not None:
                        work.alarm.check(what)
                    watch.look()
        if work.work.is_completed():
            try:  # ended: where it failed, a rank that found calls that never meet may have destroyed its grid
                work.work.wait()
            except RuntimeError:
                verdict = _verdict(pending)
                if verdict is not None:  # that verdict is the news, not a failed world (no roll call for it)
                    raise _error(verdict) from None
        work.wait()
    except RankFailure as failure:
        # A rank that found the calls could never meet raised, and its groups went with its grid: the
        # connections closed under this rank's gather. Its verdict, not a dead peer, is the news.
        verdict = _verdict(pending)
        if verdict is None:
            raise
        raise _error(verdict) from failure


def _ticker(work: Any, on_cpu: bool) -> Callable[[], bool]:
    """A wait of at most `TICK_S` for ``work``: True once it ended (done or failed), False when the tick passed."""
    if on_cpu:

        def timed() -> bool:
            try:
                work.wait(datetime.timedelta(seconds=TICK_S))
            except RuntimeError as error:  # torch's timed wait says "Operation timed out!"; a failure is news
                return "Operation timed out" not in str(error)
            return True

        return timed
    try:
        future = work.get_future()
    except (AttributeError, RuntimeError):  # no future to watch: one plain wait
        return lambda: True
    ended = threading.Event()
    future.add_done_callback(lambda _: ended.set())
    return lambda: ended.wait(TICK_S)


def _verdict(pending: Pending) -> bytes | None:
    """The grid's verdict of calls that can never meet, if one was written (one non-blocking read)."""
    try:
        return read(c10d._get_default_store(), f"{namespace(pending.root)}/verdict")
    except RuntimeError:  # no store to ask
        return None


class _Watch:
    """This rank's record while its comparison waits, and the search for a cycle through it."""

    def __init__(self, pending: Pending) -> None:
        self.pending = pending
        self.store = c10d._get_default_store()
        self.space = namespace(pending.root)
        self.rank = dist.get_rank()
        self.record = {
            "family": pending.family,
            "number": pending.number,
            "waits_in": pending.waits_in,
            "call": pending.describe(),
            "counts": pending.counts,
        }

    def __enter__(self) -> _Watch:
        self.store.set(self._key(self.rank), json.dumps(self.record))
        return self

    def __exit__(self, *exc: object) -> None:
        with contextlib.suppress(RuntimeError):  # the store is gone: nothing left to delete
            self.store.delete_key(self._key(self.rank))

    def _key(self, rank: int) -> str:
        return f"{self.space}/waiting/{rank}"

    def look(self) -> None:
        """Raise the verdict, if there is one, or the cycle through this rank, if there is one."""
        verdict = _verdict(self.pending)
        if verdict is None:
            cycle = self._cycle()
            if cycle is None:
                return
            verdict = self.store.compare_set(f"{self.space}/verdict", "", json.dumps(cycle))  # first writer wins
        raise _error(verdict)

    def _cycle(self) -> list[dict[str, Any]] | None:
        """The waits from this rank back to itself, if the records show such a path (depth first)."""
        families = {
            guard_key(key): (layout, dims)
            for key, (layout, dims, _) in self.pending.root._core.registry.families.items()
        }
        records: dict[int, dict[str, Any] | None] = {self.rank: self.record}

        def record_of(rank: int) -> dict[str, Any] | None:
            if rank not in records and len(records) < MAX_READS:
                data = read(self.store, self._key(rank))
                records[rank] = None if data is None else json.loads(data)
            return records.get(rank)

        def waits_for(rank: int) -> list[int]:
            record = records[rank]
            assert record is not None
            if record["waits_in"] not in families:
                return []
            layout, dims = families[record["waits_in"]]
            found = []
            for member in layout.group_ranks(dims, rank):
                other = record_of(member) if member != rank else None
                if other is not None and other["counts"].get(record["family"], 0) <= record["number"]:
                    found.append(member)  # it waits elsewhere and never started this rank's call
            return found

        path, seen = [self.rank], {self.rank}
        stack = [iter(waits_for(self.rank))]
        while stack:
            step = next(stack[-1], None)
            if step is None:
                stack.pop()
                path.pop()
            elif step == self.rank:
                return [{"rank": rank, **(records[rank] or {})} for rank in path]
            elif step not in seen:
                seen.add(step)
                path.append(step)
                stack.append(iter(waits_for(step)))
        return None


def _error(verdict: bytes | str) -> CollectiveMismatchError:
    """The error every waiting rank raises for a cycle of calls that can never meet."""
    cycle = json.loads(verdict)
    calls: dict[str, list[int]] = {}
    for entry in cycle:
        calls.setdefault(entry["call"], []).append(entry["rank"])
    listed = "; ".join(f"{call} on rank(s) {format_ranks(ranks)}" for call, ranks in calls.items())
    return CollectiveMismatchError(
        f"checked collectives that can never meet, each waiting for another: {listed}. Every member of a group "
        "must make the same calls over the same families in the same order (one rank called another family's "
        "collective, or skipped or added one); the waiting comparisons were abandoned: destroy() the grid on "
        "every rank before using it again",
        {call: sorted(ranks) for call, ranks in calls.items()},
    )
