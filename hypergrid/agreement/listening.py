"""The world's failure ends the agreement's store waits: a guard round's, a creation commit's.

A guard round (`hypergrid.agreement.protocol.Round`) and a creation's commit
(`hypergrid.agreement.barrier.Barrier`) block on one store key, their outcome. While a rank waits there, the alarm
(`hypergrid.binding.alarm`) holds what ends the wait (`ended_by_failure`): once the world's roll call settles a
failure, the rank's watcher writes a failure outcome into that key (``compare_set``: the first outcome written
stands), through `hypergrid.agreement.world.World.default_calls`. `liveness` is the world's roll call as these
waits ask it. docs/design/reliability.md ("The world's verdict ends a round").

torch's own waits while it creates a family's groups (a member's address, which a dead member never writes) end the
same way: `creating` makes the default group's store interruptible for that time
(`hypergrid.binding.interruptible.interruptible_default_store`), and the world's failure interrupts it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from hypergrid.agreement.request import failure_verdict
from hypergrid.agreement.world import World
from hypergrid.binding.interruptible import interruptible_default_store
from hypergrid.errors import FencedError, RankFailure

__all__ = ["creating", "ended_by_failure", "failed_commit", "failed_round", "liveness"]


def liveness(world: World, participants: Sequence[int]) -> tuple[Callable[[], Sequence[int]] | None, Any]:
    """The world's liveness probe (its watcher's roll call: the participants found dead so far) and the default
    group's store as a probing thread may use it; (None, None) where no watcher runs."""
    watcher = world.watcher
    if watcher is None:
        return None, None
    members = set(participants)
    probe = lambda: [rank for rank in watcher.probe("a guarded creation waits") if rank in members]  # noqa: E731
    return probe, world.default_calls


def ended_by_failure(world: World, end: Callable[[Any], object]) -> contextlib.AbstractContextManager[None]:
    """While inside, the world's failure runs ``end(store)``: it writes the failure into the key the wait blocks on.

    ``store``: the default group's store for the thread that heard the news (the main thread's connection is blocked in
    the wait). Nothing where no watcher runs (a world of one, the fake backend).
    """
    if world.watcher is None:
        return contextlib.nullcontext()
    store = world.default_calls
    return world.alarm.listening(lambda: end(store))


@contextlib.contextmanager
def creating(world: World, what: str) -> Iterator[None]:
    """While inside (torch creates groups on the world's default group), the world's failure ends torch's waits for
    the other members with the error this rank's alarm holds (``RankFailure`` naming the dead, ``FencedError``).

    Nothing where no watcher runs (a world of one, the fake backend) or the world is not torch's default group.
    """
    if world.watcher is None or not world.is_current():
        yield
        return
    with interruptible_default_store(world.default_calls) as store:
        if store is None:
            yield
            return

        def end() -> None:
            error = world.alarm.pending(what)
            store.interrupt(RankFailure(f"{what} failed: the world failed", []) if error is None else error)

        with world.alarm.listening(end):
            yield


def failed_round(world: World, what: str) -> str:
    """The encoded failure verdict of a guard round that the world's failure ended (the dead its roll call named).

    On a rank the others left behind, the round fails without it: the verdict names it.
    """
    error = world.alarm.pending(what)
    if isinstance(error, FencedError):
        rank = world.rank
        return failure_verdict(f"{what} failed: rank {rank} was excluded by the others", [rank]).encode()
    dead = getattr(error, "dead", [])
    return failure_verdict(str(error) if error is not None else f"{what} failed: the world failed", dead).encode()


def failed_commit(world: World, what: str, participants: Sequence[int]) -> tuple[str, list[int]]:
    """A commit's failure when the world failed during it: why, and its dead among the participants."""
    error = world.alarm.pending(what)
    members = set(participants)
    dead = sorted(rank for rank in getattr(error, "dead", ()) if rank in members)
    said = str(error).splitlines()[0] if error is not None else "the world failed"
    return f"the world failed during the commit ({said})", dead
