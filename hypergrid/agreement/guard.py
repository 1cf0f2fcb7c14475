"""The consistency guard: the ranks of a collective creation agree before any of them waits in torch.

Group creation is collective: every participating rank must ask for the same families, on the same grid, with
the same strategy and options, at the same point of its creation sequence; else torch waits until its timeout (or
forever). The guard makes that a clear error on every participant instead: a `DesyncError` naming the distinct
requests and the ranks that sent each, an `OutOfStepError`, or a `GuardTimeoutError` naming the ranks that did not
arrive. `agree` runs one round (`hypergrid.agreement.protocol.Round`) before each ``create_pg`` and each
``create_pgs``, `settle` commits once torch created the groups, and `GuardLedger` keeps what ``destroy()`` deletes.
How rounds are keyed, and what they cost: docs/design/reliability.md ("The guard round").
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

from hypergrid.agreement import diagnosis
from hypergrid.agreement.barrier import Barrier, BarrierFailed
from hypergrid.agreement.diagnosis import announce_key
from hypergrid.agreement.listening import ended_by_failure, failed_commit, failed_round, liveness
from hypergrid.agreement.protocol import Round, round_keys
from hypergrid.agreement.request import CreationRequest, shown_ranks
from hypergrid.agreement.world import World
from hypergrid.binding.alarm import quoted
from hypergrid.errors import RankFailure

__all__ = [
    "CreationRequest",
    "GuardLedger",
    "Scope",
    "agree",
    "creation_failed",
    "grid_scope",
    "roll_call",
    "settle",
]

_PREFIX = "hypergrid/guard"


@dataclass(frozen=True)
class Scope:
    """One guard round: a family of rounds that the same participants count together, and its number.

    Examples:
        >>> Scope("world", 3).prefix
        'hypergrid/guard/world/3'
    """

    family: str
    number: int

    @property
    def prefix(self) -> str:
        """The round's key prefix in the store."""
        return f"{_PREFIX}/{self.family}/{self.number}"


def grid_scope(description: str, ordinal: int, epoch: int, sequence: int, members: Sequence[int] | None) -> Scope:
    """The scope of a grid's creation #``sequence`` in its ``epoch``; ``members`` for a members-only one.

    Examples:
        >>> grid_scope("tp2", 0, 1, 3, None).prefix.endswith("/e1/3")
        True
    """
    grid = hashlib.sha1(f"{ordinal}:{description}".encode(), usedforsecurity=False).hexdigest()[:16]
    family = f"{grid}/e{epoch}"
    if members is not None:
        family += "/m" + hashlib.sha1(",".join(map(str, members)).encode(), usedforsecurity=False).hexdigest()[:16]
    return Scope(family, sequence)


class GuardLedger:
    """The guard's keys of one grid that may still be in the store, for ``destroy()`` to delete.

    Rounds that end in agreement delete their own keys, and so does a mismatch
    found by the last rank to arrive. Other failed rounds (out of step, a
    timeout, a death during creation, and its roll call) keep a few keys: until
    the next completed round of the same grid, or until every live participant
    has released them with ``destroy()`` (`release`). Deleting them at the first
    ``destroy()`` would pull the verdict from under a participant that has not
    read it yet, so each participant counts itself in ``P/released`` and the
    last of the participants that arrived (the dead left out) deletes them.
    `release` also deletes this rank's announcement and those of the ranks found dead.
    """

    def __init__(self) -> None:
        self.rounds: dict[str, set[int]] = {}  # failed round's prefix -> its ranks known dead
        self.ranks: set[int] = set()  # ranks whose announcement to delete (besides this rank's)
        self.commits: dict[str, tuple[str, Sequence[int]]] = {}  # scope family -> its last commit's prefix, members
        self.dead: set[int] = set()  # ranks known dead (``shrink``): they will not release anything
        self.ended: list[str] = []  # records of worlds a shrink ended (`liveness.ended_key`), on one rank of the grid

    def release(self, world: World | None) -> None:
        """Count this rank out of the recorded rounds, deleting each once its last live participant did so.

        ``world``: the grid's (None: a grid that never had one, which recorded nothing)."""
        rounds, self.rounds = self.rounds, {}
        ranks, self.ranks = self.ranks, set()
        commits, self.commits = self.commits, {}
        ended, self.ended = self.ended, []
        if world is None or not world.is_current() or dist.get_backend() == "fake":
            return
        with contextlib.suppress(RuntimeError):  # the record of the world the grid's shrink ended: its keeper is done
            for key in ended:
                world.base_store.delete_key(key)
        if world.size < 2:
            return
        store = c10d._get_default_store()
        for family_rounds in world.guard_leftovers.values():
            family_rounds[:] = [prefix for prefix in family_rounds if prefix not in rounds]
        last = world.guard_last_commits
        with contextlib.suppress(RuntimeError):  # the store is gone: nothing left to delete
            for prefix, dead in rounds.items():
                _release_round(store, prefix, dead)
            for family, (prefix, members) in commits.items():
                last.pop(family, None)
                live = sum(1 for member in members if member not in self.dead)
                if store.add(f"{prefix}/released", 1) >= live:  # the last live member to let go deletes it
                    store.delete_key(f"{prefix}/verdict")
                    store.delete_key(f"{prefix}/released")
            for rank in sorted(ranks | {world.rank}):
                store.delete_key(announce_key(rank))

    def record(self, prefix: str, dead: Sequence[int] = ()) -> None:
        """Remember a failed round's prefix, and the ranks found dead there (their announcements go too)."""
        self.rounds.setdefault(prefix, set()).update(dead)
        self.ranks.update(dead)


def _release_round(store: Any, prefix: str, dead: set[int]) -> None:
    """This rank is done with the failed round ``prefix``: the last live participant to say so deletes its keys."""
    members = set(diagnosis.roster_of(store, prefix)[0]) | diagnosis.alive_of(store, prefix)
    if not members:
        return  # the round cleaned itself up (or the next one of its grid did)
    if store.add(f"{prefix}/released", 1) >= len(members - dead):
        for key in round_keys(prefix):
            store.delete_key(key)


def agree(
    world: World,
    request: CreationRequest,
    participants: Sequence[int],
    scope: Scope,
    timeout_s: float,
    progress_s: float = 30.0,
    ledger: GuardLedger | None = None,
) -> bool:
    """Return once every participant made the same ``request``; else raise the same error on all of them.

    Returns False where no round was needed (a lone participant, the fake backend).

    Args:
        world: the world the creation is in (the grid's).
        request: what this rank is about to create.
        participants: every rank that takes part (sorted; the caller among them).
        scope: from `world_scope` or `members_scope`, equal on all participants.
        timeout_s: how long to wait for the other participants.
        progress_s: how often to log a progress line while waiting.
        ledger: where to record a round that leaves keys behind (the grid's).

    Raises:
        DesyncError: the participants asked for different things.
        GuardTimeoutError: some participants did not arrive within ``timeout_s``.
    """
    if len(participants) < 2 or dist.get_backend() == "fake":
        return False  # nobody to disagree with: a lone rank, or torch's one-process fake backend
    with world.job.store_calls("a creation's guard round"):
        return _agree(world, request, participants, scope, timeout_s, progress_s, ledger)


def _agree(
    world: World,
    request: CreationRequest,
    participants: Sequence[int],
    scope: Scope,
    timeout_s: float,
    progress_s: float,
    ledger: GuardLedger | None,
) -> bool:
    # The default group's store: torch exposes it only through this accessor, which torch's own
    # helpers and Megatron use too.
    store = c10d._get_default_store()
    leftovers = world.guard_leftovers.setdefault(scope.family, [])
    rank = world.rank
    probe, _ = liveness(world, participants)
    what = f"{request.call()} on grid {request.grid}"
    rounds = Round(
        store,
        scope.prefix,
        rank,
        participants,
        request,
        timeout_s,
        progress_s,
        leftovers,
        probe,
        world.timing,
    )
    ended = ended_by_failure(
        world, lambda side: side.compare_set(f"{scope.prefix}/verdict", "", failed_round(world, what))
    )
    with ended:
        verdict = rounds.run()
    if verdict.kind == "failure":
        world.alarm.check_fence(what)  # a rank the others left behind raises FencedError, the others the verdict
    if verdict.kind != "ok":
        world.job.guard_failures += 1
        leftovers.append(scope.prefix)
        if ledger is not None:
            ledger.record(scope.prefix, [rank for first, last in verdict.dead for rank in range(first, last + 1)])
    else:
        leftovers.clear()  # the decider of this completed round deleted them
    verdict.raise_if_failed()
    return True


def roll_call(prefix: str, participants: Sequence[int], deadline: float) -> list[int]:
    """After a failure every participant sees: who answers by ``deadline`` (``time.monotonic()``)?

    Each participant appends its rank and adds 1 to a count; the one that makes
    it complete says so, ending every participant's wait at once. Returns the
    participants that did not answer (dead or hung), sorted. The keys stay for
    ``GuardLedger.release``.
    """
    store: Any = c10d._get_default_store()  # append is a TCPStore/HashStore method the stubs lack
    rank = dist.get_rank()
    store.append(f"{prefix}/alive", f"{rank}\n")
    if store.add(f"{prefix}/alive-count", 1) >= len(participants):
        store.set(f"{prefix}/alive-done", "1")
        return []
    diagnosis.wait_for(store, f"{prefix}/alive-done", deadline)
    answered = diagnosis.alive_of(store, prefix)
    return [other for other in participants if other not in answered]


def settle(
    world: World,
    prefix: str,
    participants: Sequence[int],
    started: float,
    timeout_s: float,
    what: str,
    ledger: GuardLedger | None,
) -> None:
    """Return once every participant created its groups; else raise the same `RankFailure` on every survivor.

    After the guard agreed, torch creates the groups; a participant that dies
    there would leave the others with different registries (those whose groups
    did not hold it finish). The participants meet at a `Barrier` under
    ``prefix`` (at most until ``started + timeout_s``; a member the world's
    roll call finds dead ends it at once), whose outcome is written once: a
    participant that comes back after the others gave up (resumed after
    SIGSTOP) gets the failure too, never success.
    """
    store: Any = c10d._get_default_store()
    probe, side = liveness(world, participants)
    deadline = started + timeout_s
    what_step, rank, job, timing = f"the end of creating {what}", world.rank, world.job, world.timing
    barrier = Barrier(store, prefix, rank, participants, deadline, what_step, probe, side, True, job=job, timing=timing)
    failed_here = lambda side: barrier.fail(side, *failed_commit(world, f"creating {what}", participants))  # noqa: E731
    try:
        with ended_by_failure(world, failed_here):
            barrier.run()
    except BarrierFailed as failed:
        error = creation_failed(world, None, what, prefix, participants, started, timeout_s, ledger, failed.dead)
        raise error from None
    with world.job.store_calls("a creation's commit barrier"):
        _tidy(world, store, prefix, barrier, participants, ledger)


def _tidy(
    world: World, store: Any, prefix: str, barrier: Barrier, participants: Sequence[int], ledger: GuardLedger | None
) -> None:
    """The commit under ``prefix`` passed: delete what nobody reads any more, one key per member at most.

    The round's roster and verdict, this commit's count and the previous commit's verdict of the same scope family,
    the member that arrived ``i``-th deleting the ``i``-th (and every ``members``-th after it, where there are fewer
    members than keys); docs/design/reliability.md ("The guard round").
    """
    round_prefix = prefix.rpartition("/")[0]
    family = round_prefix.rpartition("/")[0]
    last = world.guard_last_commits
    keys = [f"{round_prefix}/roster", f"{round_prefix}/verdict", barrier.count_key]
    if family in last:
        keys.append(f"{last[family]}/verdict")
    for index in range(barrier.position - 1, len(keys), len(participants)):
        store.delete_key(keys[index])
    last[family] = prefix
    if ledger is not None:
        ledger.commits[family] = (prefix, participants)


def creation_failed(
    world: World,
    error: Exception | None,
    what: str,
    prefix: str,
    participants: Sequence[int],
    started: float,
    timeout_s: float,
    ledger: GuardLedger | None,
    dead: Sequence[int] | None = None,
) -> RankFailure:
    """torch failed (or a peer never finished) creating groups after the guard agreed: a `RankFailure`.

    The commit under ``prefix`` is failed first (the participants waiting
    there wake at once). Who is gone: ``dead`` if known, else the world's roll
    call (its watcher) where one runs, else the participants' own roll call
    under ``prefix``, which every survivor joins by ``started + timeout_s``
    (torch's creation is bounded by ``timeout_s``, and so is `settle`), so it
    ends by then plus the guard's grace (`hypergrid.timing.Timing.guard_grace_s`).
    """
    store: Any = c10d._get_default_store()
    said = (
        f"; torch said: {quoted(error)}" if error is not None else f"; not every rank finished within {timeout_s:g} s"
    )
    if error is not None:
        Barrier(store, prefix, world.rank, participants, started + timeout_s, what).fail(store, said)
    if dead is None:
        probe, _ = liveness(world, participants)
        if probe is not None:
            dead = list(probe())
        else:
            grace_s = world.timing.with_group_timeout(timeout_s).guard_grace_s
            dead = roll_call(prefix, participants, started + timeout_s + grace_s)
    if ledger is not None:
        ledger.record(prefix, dead)
    who = f"rank(s) {shown_ranks(dead)} stopped answering" if dead else "every participant still answers"
    return RankFailure(
        f"creating {what} failed after every rank agreed to it: {who} (a peer died or hung while torch was "
        f"creating the groups){said}",
        dead=list(dead),
    )
