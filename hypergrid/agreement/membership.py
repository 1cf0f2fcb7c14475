"""Agreement on who is gone: the survivors' round behind ``grid.shrink``, O(1) store operations each.

The same family as the guard's round (`hypergrid.agreement.protocol`): one
count per distinct proposal, a roster line per participant, a verdict written
by the one whose count completes the round, keys deleted by the participants
themselves. What differs: the participants are not known up front (the
proposal says who is dead), and a missing participant is not an error but part
of the answer.

Keys of one round, under its prefix ``P`` (``hypergrid/elastic/<epoch>``):

- ``P/call``: what the round is (``shrink <proposal>``) or ``release``: spares
  wait on this key alone (`wait_for_call`);
- ``P/count/<digest>``: how many survivors made the proposal with that digest;
- ``P/roster``: ``rank digest [proposal]`` per survivor (the proposal after
  the first of each digest): read only on the timeout path;
- ``P/verdict``: ``ok <digest>`` (that proposal stands), or the dead set as JSON;
- ``P/done`` (success) or ``P/readers`` (timeout): who has read the verdict.

Success path (every survivor proposes the same complete dead set ``D``, so
``expected - |D|`` of them come): each adds 1 to its proposal's count and
appends its roster line; the one whose count comes back complete (nobody names
itself, so a complete count is every rank ``D`` does not name) writes ``ok``
and deletes the count, the roster and the call; the others wait for the
verdict, read it and count themselves done, the last deleting the rest. Five
store operations for most survivors, whatever their number (the first also
writes the call; the decider deletes three keys).

Otherwise (a dead rank nobody named, proposals that differ) no count
completes: the first survivor whose ``timeout_s`` passes reads the roster and
publishes the verdict: dead = every rank named by some proposal, plus every
expected rank that did not arrive; a named rank that is alive is told it is
dead. Proposals that differ in policy or dim make a ``DesyncError`` on every
survivor instead.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from hypergrid.agreement import diagnosis
from hypergrid.errors import DesyncError, RankFailure
from hypergrid.values import format_ranks

__all__ = ["MembershipRound", "Proposal", "call_key", "release_key", "wait_for_call"]

PREFIX = "hypergrid/elastic"


def round_prefix(epoch: int) -> str:
    """The key prefix of the shrink round that ends ``epoch``.

    Examples:
        >>> round_prefix(0)
        'hypergrid/elastic/0'
    """
    return f"{PREFIX}/{epoch}"


def call_key(epoch: int) -> str:
    """The key spares wait on during ``epoch``: ``shrink <proposal>`` or ``release``."""
    return f"{round_prefix(epoch)}/call"


def release_key(epoch: int) -> str:
    """The counter of spares that saw ``release`` (the last one deletes the call key)."""
    return f"{round_prefix(epoch)}/released"


@dataclass(frozen=True)
class Proposal:
    """What one survivor brings to the round: the ranks it knows dead, and how to shrink.

    Examples:
        >>> proposal = Proposal((3,), "drop", "dp")
        >>> Proposal.decode(proposal.encoded) == proposal, len(proposal.digest)
        (True, 16)
    """

    dead: tuple[int, ...]
    policy: str
    dim: str

    @property
    def encoded(self) -> str:
        return json.dumps([list(self.dead), self.policy, self.dim])

    @property
    def digest(self) -> str:
        return hashlib.sha1(self.encoded.encode(), usedforsecurity=False).hexdigest()[:16]

    @classmethod
    def decode(cls, text: str) -> Proposal:
        dead, policy, dim = json.loads(text)
        return cls(tuple(dead), policy, dim)


def wait_for_call(store: Any, epoch: int, slice_s: float = 60.0) -> str:
    """Block until the round of ``epoch`` is called; return the call (``shrink ...`` or ``release``).

    One blocking ``wait`` per ``slice_s`` (no polling), then one ``get``.
    """
    key = call_key(epoch)
    while True:
        try:
            store.wait([key], datetime.timedelta(seconds=slice_s))
            break
        except RuntimeError as error:  # the slice ended; a store that is gone ends the job
            if "timeout" not in str(error).lower() and "timed out" not in str(error).lower():
                raise
    data: bytes = store.get(key)
    return data.decode()


class MembershipRound:
    """One survivor's side of the round that agrees on the dead ranks of the world ``expected``.

    `run` is the whole round; `arrive`, `decide` and `await_verdict` are
    its steps, so one thread can play many participants (the benchmark).

    Args:
        store: any ``torch.distributed.Store`` (or an object with its methods).
        prefix: the round's prefix (`round_prefix`), equal on every survivor.
        rank: this survivor's rank in the old world.
        expected: every rank that should take part unless dead (sorted).
        proposal: this survivor's `Proposal`.
        timeout_s: how long to wait for a rank nobody named before declaring it dead.
    """

    def __init__(
        self, store: Any, prefix: str, rank: int, expected: Sequence[int], proposal: Proposal, timeout_s: float
    ) -> None:
        self.store = store
        self.prefix = prefix
        self.rank = rank
        self.expected = expected
        self.proposal = proposal
        self.timeout_s = timeout_s
        self.target = len(expected) - len(proposal.dead)
        self._count = f"{prefix}/count/{proposal.digest}"
        self._roster = f"{prefix}/roster"
        self._verdict = f"{prefix}/verdict"
        self._readers = f"{prefix}/readers"
        self._done = f"{prefix}/done"
        self._started = 0.0

    def run(self) -> tuple[int, ...]:
        """The dead ranks all survivors agreed on (sorted).

        Raises:
            RankFailure: this rank was declared dead (it arrived too late, or another survivor named it).
            DesyncError: survivors asked for different policies or dims.
        """
        return self.decide() if self.arrive() else self.await_verdict()

    def arrive(self) -> bool:
        """Count this proposal and arrival; True on the survivor whose count completes its proposal."""
        self._started = time.monotonic()
        counted = self.store.add(self._count, 1)
        line = f"{self.rank} {self.proposal.digest}"
        if counted == 1:
            line += f" {self.proposal.encoded}"
        self.store.append(self._roster, line + "\n")
        if counted == 1:  # the first with this proposal calls the round (if none did): spares wake up and join
            self.store.compare_set(call_key_of(self.prefix), "", f"shrink {self.proposal.encoded}")
        # Nobody names itself, so `target` counts of one proposal are every rank it does not name.
        return bool(counted == self.target)

    def decide(self) -> tuple[int, ...]:
        """On the survivor that completed its proposal: publish it, delete the count, roster and call."""
        ok = f"ok {self.proposal.digest}"
        if self.store.compare_set(self._verdict, "", ok) != ok.encode():  # a timeout verdict was first
            return self._conclude()
        done = (self._count, self._roster, call_key_of(self.prefix))  # every spare has read the call
        alone = (self._verdict,) if self.target == 1 else ()  # no other survivor will conclude
        for key in done + alone:
            self.store.delete_key(key)
        return self.proposal.dead

    def await_verdict(self) -> tuple[int, ...]:
        """On the others: wait for the verdict (or give up after the timeout and judge from the roster)."""
        if not self._wait(self._started + self.timeout_s):
            self._give_up()
        return self._conclude()

    # -- the rest -------------------------------------------------------------

    def _wait(self, deadline: float) -> bool:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            try:
                self.store.wait([self._verdict], datetime.timedelta(seconds=max(left, 0.001)))
                return True
            except RuntimeError:
                continue

    def _give_up(self) -> None:
        """Judge from the roster (unless a verdict is there first) and publish the dead set."""
        entries, proposals = self._read_roster()
        named = {rank for proposal in proposals.values() for rank in proposal.dead}
        terms = {(proposal.policy, proposal.dim) for proposal in proposals.values()}
        alive = sorted(rank for rank in entries if rank not in named)
        verdict: dict[str, Any] = {
            "dead": sorted(set(self.expected) - set(alive)),
            "readers": len(entries),
            "digests": sorted(proposals),
        }
        if len(terms) > 1:
            verdict["error"] = "survivors asked for different shrinks: " + "; ".join(
                f"policy={policy!r} dim={dim!r}" for policy, dim in sorted(terms)
            )
        self.store.compare_set(self._verdict, "", json.dumps(verdict))

    def _read_roster(self) -> tuple[dict[int, str], dict[str, Proposal]]:
        data = diagnosis.read(self.store, self._roster)
        entries: dict[int, str] = {}
        proposals: dict[str, Proposal] = {}
        if data is None:
            return entries, proposals
        for line in data.decode().splitlines():
            rank, digest, *encoded = line.split(" ", 2)
            entries[int(rank)] = digest
            if encoded:
                proposals[digest] = Proposal.decode(encoded[0])
        return entries, proposals

    def _conclude(self) -> tuple[int, ...]:
        """The verdict exists: read it, count this survivor done; the last one deletes the round's keys."""
        data = diagnosis.read(self.store, self._verdict)
        if data is None:
            raise self._declared_dead([self.rank])
        if data.startswith(b"ok "):
            if data.decode()[3:] != self.proposal.digest:  # the others agreed on a proposal that names this rank
                raise self._declared_dead([self.rank])
            if self.store.add(self._done, 1) == self.target - 1:  # the decider counts no completion
                for key in (self._verdict, self._done):
                    self.store.delete_key(key)
            return self.proposal.dead
        verdict = json.loads(data)
        if self.store.add(self._readers, 1) == verdict["readers"]:
            keys = [self._verdict, self._readers, self._roster, call_key_of(self.prefix)]
            for key in keys + [f"{self.prefix}/count/{digest}" for digest in verdict["digests"]]:
                self.store.delete_key(key)
        if "error" in verdict:
            raise DesyncError(f"grid.shrink: {verdict['error']}")
        dead: list[int] = verdict["dead"]
        if self.rank in dead:
            raise self._declared_dead(dead)
        return tuple(dead)

    def _declared_dead(self, dead: list[int]) -> RankFailure:
        return RankFailure(
            f"grid.shrink: rank {self.rank} was declared dead by the other survivors (another proposal named "
            f"it, or it arrived after their {self.timeout_s:g} s timeout); dead: {format_ranks(dead)}",
            dead,
        )


def call_key_of(prefix: str) -> str:
    return f"{prefix}/call"
