"""Agreement on who is gone: the survivors' round behind ``grid.shrink``, O(1) store operations each.

The same family as the guard's round (`hypergrid.agreement.protocol`): one count per distinct `Proposal`, a
roster line per participant, a verdict written by the one whose count completes the round, keys deleted by the
participants themselves. What differs: the participants are not known up front (the proposal says who is dead),
and a missing participant is not an error but part of the answer. `MembershipRound` is one survivor's side;
spares wait for the round's call alone (`wait_for_call`). The keys, the costs and the slow path:
docs/design/recovery.md ("The membership round").
"""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch.distributed as dist

from hypergrid.agreement import diagnosis
from hypergrid.agreement.barrier import Prober
from hypergrid.agreement.liveness import majority
from hypergrid.binding.alarm import Job
from hypergrid.errors import DesyncError, FencedError, RankFailure
from hypergrid.timing import FOREVER_S, Timing
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
    families: str = ""  # what the survivors will re-create (a digest): different lists are a desync

    @property
    def encoded(self) -> str:
        return json.dumps([list(self.dead), self.policy, self.dim, self.families])

    @property
    def digest(self) -> str:
        return hashlib.sha1(self.encoded.encode(), usedforsecurity=False).hexdigest()[:16]

    @classmethod
    def decode(cls, text: str) -> Proposal:
        dead, policy, dim, families = json.loads(text)
        return cls(tuple(dead), policy, dim, families)


def wait_for_call(store: Any, epoch: int, slice_s: float = FOREVER_S, gone: Callable[[], None] | None = None) -> str:
    """Block until the round of ``epoch`` is called; return the call (``shrink ...`` or ``release``).

    One blocking ``wait`` (a day long, `hypergrid.timing.FOREVER_S`: it rarely times out, and torch logs every store
    wait that does), then one read. A wait that returns without the call (this process was stopped while the call was
    written and deleted: it resumes now; or a read of the absent key woke it) runs ``gone``, which raises if this
    rank was left behind (a spare the others declared dead), before the wait goes on.
    """
    key = call_key(epoch)
    while True:
        with contextlib.suppress(dist.DistStoreError):  # the slice ended (a store that is gone ends the job)
            store.wait([key], datetime.timedelta(seconds=slice_s))
        data = diagnosis.read(store, key)
        if data is not None:
            return data.decode()
        if gone is not None:
            gone()


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
        timeout_s: how long to wait for a rank nobody named (and no roll call found dead) before declaring it dead.
        probe: the world's liveness probe: runs a roll call, returns every rank found dead so far.
        side: a store connection the probing thread may use while this rank's is blocked (needed with ``probe``).
        job: the job whose store this is (a lost store raises ``StoreLostError``).
        timing: the world's `hypergrid.timing.Timing` (default: the defaults): the first two waiting survivors
            probe every `hypergrid.timing.Timing.round_probe_s` of the expected ranks.
    """

    def __init__(
        self,
        store: Any,
        prefix: str,
        rank: int,
        expected: Sequence[int],
        proposal: Proposal,
        timeout_s: float,
        probe: Callable[[], Sequence[int]] | None = None,
        side: Any = None,
        job: Job | None = None,
        timing: Timing | None = None,
    ) -> None:
        self.job = Job(store) if job is None else job
        self.timing = Timing() if timing is None else timing
        self.store = store
        self.prefix = prefix
        self.rank = rank
        self.expected = expected
        self.proposal = proposal
        self.timeout_s = timeout_s
        self.probe = probe
        self.side = side
        self.target = len(expected) - len(proposal.dead)
        self._count = f"{prefix}/count/{proposal.digest}"
        self._roster = f"{prefix}/roster"
        self._verdict = f"{prefix}/verdict"
        self._readers = f"{prefix}/readers"
        self._done = f"{prefix}/done"
        self._started = 0.0
        self._counted = 0
        self.stop: Callable[[], bool] = lambda: False  # give up waiting (this rank was fenced: `wake` ends the wait)

    def run(self) -> tuple[int, ...]:
        """The dead ranks all survivors agreed on (sorted); () when `stop` ended the wait (the caller knows why).

        Raises:
            FencedError: this rank was declared dead (it arrived too late, or another survivor named it).
            DesyncError: survivors asked for different policies or dims.
        """
        with self.job.store_calls("shrink's membership round"):
            return self.decide() if self.arrive() else self.await_verdict()

    def arrive(self) -> bool:
        """Count this proposal and arrival; True on the survivor whose count completes its proposal."""
        self._started = time.monotonic()
        counted = self._counted = self.store.add(self._count, 1)
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
        if self.target == 1:  # no other survivor will conclude: the round's keys are this one's to delete
            for key in (self._count, self._roster, call_key_of(self.prefix), self._verdict):
                self.store.delete_key(key)
        return self.proposal.dead

    def await_verdict(self) -> tuple[int, ...]:
        """On the others: wait for the verdict (the first two probe liveness meanwhile), else judge from the roster."""
        prober = None
        if self._counted <= 2 and self.probe is not None and self.side is not None:
            prober = Prober(self.timing.round_probe_s(len(self.expected)), self.probe, self._dead_found).start()
        try:
            # (a wake without the verdict, once the roster is gone too: the round ended without this rank)
            stop = lambda: self.stop() or not self.store.check([self._roster])  # noqa: E731
            data = diagnosis.await_value(self.store, self._verdict, self._started + self.timeout_s, stop)
        finally:
            if prober is not None:
                prober.stop()
        if data is None and self.stop():
            return ()
        if data is None and not self.store.check([self._roster]):
            raise self._declared_dead([self.rank])
        if data is None:
            self._give_up(set(self.probe() if self.probe is not None else ()), timed_out=True)
        return self._conclude(data)

    def wake(self, store: Any) -> None:
        """End this round's wait from another thread's ``store`` (a read of the absent verdict wakes its waiters:
        the others look and wait again), once `stop` says so."""
        diagnosis.read(store, self._verdict)

    def _dead_found(self, found: set[int]) -> bool:
        """The prober found ``found`` dead: give up now if the proposals did not name all of them."""
        if not found - set(self.proposal.dead):
            return False
        self._give_up(found, timed_out=False, store=self.side)
        return True

    def _give_up(self, found: set[int], timed_out: bool, store: Any = None) -> None:
        """Judge from the roster (unless a verdict is there first) and publish the dead set.

        ``found``: ranks the roll calls found dead. ``timed_out``: every expected rank that has not
        arrived is dead too (else ranks still on their way, alive, read the verdict when they come).
        ``store``: the connection to use (the prober's, while this rank's waits); default this rank's.
        """
        store = self.store if store is None else store
        entries, proposals = self._read_roster(store)
        named = {rank for proposal in proposals.values() for rank in proposal.dead}
        terms = {(proposal.policy, proposal.dim, proposal.families) for proposal in proposals.values()}
        missing = {rank for rank in self.expected if rank not in entries} if timed_out else set()
        dead = sorted((named | found | missing) & set(self.expected))
        alive = [rank for rank in self.expected if rank not in set(dead)]
        verdict: dict[str, Any] = {"dead": dead, "readers": len(alive), "digests": sorted(proposals)}
        if not majority(alive, self.expected):  # the ranks here are the cut-off side: they never go on alone
            verdict.update(dead=sorted(self.expected), readers=len(entries), cut_off=sorted(entries))
        if len(terms) > 1:
            verdict["error"] = "survivors asked for different shrinks: " + "; ".join(
                f"policy={policy!r} dim={dim!r} families {families or '-'}" for policy, dim, families in sorted(terms)
            )
        store.compare_set(self._verdict, "", json.dumps(verdict))

    def _read_roster(self, store: Any) -> tuple[dict[int, str], dict[str, Proposal]]:
        data = diagnosis.read(store, self._roster)
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

    def _conclude(self, data: bytes | None = None) -> tuple[int, ...]:
        """The verdict exists: read it (unless given), count this survivor done; the last one deletes the round."""
        if data is None:
            data = diagnosis.read(self.store, self._verdict)
        if data is None:
            raise self._declared_dead([self.rank])
        if data.startswith(b"ok "):
            if data.decode()[3:] != self.proposal.digest:  # the others agreed on a proposal that names this rank
                raise self._declared_dead([self.rank])
            if self.store.add(self._done, 1) == self.target - 1:  # the decider counts no completion
                # The last reader, not the decider, deletes the round: a decider that dies after its verdict
                # leaves nothing behind (every spare has read the call by now).
                for key in (self._verdict, self._done, self._count, self._roster, call_key_of(self.prefix)):
                    self.store.delete_key(key)
            return self.proposal.dead
        verdict = json.loads(data)
        dead: list[int] = verdict["dead"]
        if self.proposal.digest not in verdict["digests"]:  # arrived after the verdict with a proposal of its own
            self.store.delete_key(self._count)
        # The ranks the verdict leaves alive read it (those on their way too); the last deletes the round.
        reads = self.rank not in dead or self.rank in verdict.get("cut_off", ())
        if reads and self.store.add(self._readers, 1) == verdict["readers"]:
            keys = [self._verdict, self._readers, self._roster, call_key_of(self.prefix)]
            for key in keys + [f"{self.prefix}/count/{digest}" for digest in verdict["digests"]]:
                self.store.delete_key(key)
        if "error" in verdict:
            raise DesyncError(f"grid.shrink: {verdict['error']}")
        if "cut_off" in verdict:
            raise RankFailure(
                f"grid.shrink: rank {self.rank} is on the minority side: only {format_ranks(verdict['cut_off'])} of "
                f"{len(self.expected)} ranks came to this round, so they may not declare the others dead (the "
                "others went on without them, or most of the world is gone: restart from a checkpoint)",
                list(verdict["cut_off"]),
            )
        if self.rank in dead:
            raise self._declared_dead(dead)
        return tuple(dead)

    def _declared_dead(self, dead: list[int]) -> FencedError:
        return FencedError(
            f"grid.shrink: rank {self.rank} was declared dead by the other survivors (another proposal named "
            f"it, or it arrived after their {self.timeout_s:g} s timeout; dead: {format_ranks(dead)}): it cannot "
            "take part in the job any more: exit, and let the launcher start a new process if one is needed"
        )


def call_key_of(prefix: str) -> str:
    return f"{prefix}/call"
