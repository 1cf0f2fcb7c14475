"""One round of the consistency guard on a store: O(1) store operations per participant.

`hypergrid.agreement.guard` decides who takes part and under which key prefix; this
module is the protocol itself, one `Round` object per participant and
round, whose steps (`Round.arrive`, `Round.decide`,
`Round.await_verdict`) can be driven one at a time, so a benchmark can
play many participants over a few store connections.

Keys of one round, under its prefix ``P``:

- ``P/count/<digest>``: how many participants sent the request with that digest;
- ``P/roster``: one line per participant (``rank digest``), the first line of
  each digest followed by the request itself: diagnosis needs no other key;
- ``P/arrived``: one counter in three fields: arrivals and completions (low
  30 bits), "one request was counted N times" (bit 30) and, from bit 31 up,
  how many participants gave up waiting;
- ``P/verdict``: ``ok``, or the failure as JSON;
- ``P/alive``: on slow rounds only, the ranks still waiting (a roll call).

Besides, each participant announces where it is under
``hypergrid/guard/at/<rank>`` (one key per rank, overwritten each round; see
`hypergrid.agreement.diagnosis`).

A participant announces itself, adds 1 to the count of its request's digest,
appends its roster line and adds 1 to ``P/arrived`` (plus bit 30 if its count
came back N: then every participant sent its request). The one whose add makes
the arrivals N, the *decider*, sees in the value whether all agree (bit 30 set)
and writes ``P/verdict``, then deletes the counts and the roster. The others
wait for ``P/verdict``, read it, and then add 1 to ``P/arrived``: the one whose
add makes it 2N - 1 is the last, and deletes ``P/arrived``, ``P/verdict`` and
``P/alive`` (reading before counting means the verdict is never deleted under a
reader). Per participant that is 7 operations (announce, count, roster, arrive;
then publish and 2 deletes on the decider, wait, read and count on the others),
10 on the last one, whatever the number of participants.

Slow paths: the first participant to arrive probes a round that is still open
after its probe time (`probe_s`, and at every progress line) for ranks waiting
in another open round that waits for a rank here, and ends the round with an
out-of-step (or mismatch) verdict naming both. Waiters mark themselves alive at
their first progress line. A participant whose timeout
passes adds one timeout to ``P/arrived``: if it is the first and not everyone
has arrived, it reads the roster, names the missing ranks (and where they last
were) and writes that verdict; whichever comes first, the decider's arrival or
that timeout, decides for everyone. If everyone arrived but no verdict came
within the timeout plus a grace, the participants' roll call names the ones
that stopped answering. A rank that reads a verdict decided about another
request than its own is out of step, and is told so about its own request.
"""

from __future__ import annotations

import datetime
import logging
import time
from collections.abc import Sequence
from typing import Any

from hypergrid.agreement import diagnosis
from hypergrid.agreement.diagnosis import Announcement, announce_key, runs_text
from hypergrid.agreement.request import (
    CreationRequest,
    Verdict,
    foreign_verdict,
    mismatch_verdict,
    shown_ranks,
    timeout_verdict,
)

__all__ = ["LOGGER", "PROBE_S", "Round", "grace_s", "probe_s", "round_keys"]

#: The logger of the progress lines (``logging.getLogger("hypergrid")``).
LOGGER = logging.getLogger("hypergrid")

_FIELD = 1 << 30  # P/arrived: arrivals and completions count below this (rounds of up to 2**29 ranks)
_AGREE = _FIELD  # one request's count reached the number of participants: all agree
_TIMEOUT = _FIELD << 1  # one participant gave up waiting

#: The first probe of an open round comes after `probe_s` seconds: at least this long.
PROBE_S = 1.0
#: ...or this long per participant, so that a large round that is merely busy is not probed.
PROBE_PER_PARTICIPANT_S = 1e-4


def probe_s(participants: int, timeout_s: float) -> float:
    """When the first to arrive first probes an open round: max(1 s, 0.1 ms per participant), at most timeout / 4.

    A round's success path costs the store about 50 µs per participant (7
    operations), so a round this late is either stuck or ten times slower than
    it should be.

    Examples:
        >>> probe_s(8, 300.0), probe_s(131072, 300.0), probe_s(8, 2.0)
        (1.0, 13.1072, 0.5)
    """
    return min(max(PROBE_S, participants * PROBE_PER_PARTICIPANT_S), timeout_s / 4)


def round_keys(prefix: str) -> list[str]:
    """The keys a round under ``prefix`` may leave when it fails (each participant deletes its count)."""
    names = ("arrived", "roster", "verdict", "alive", "alive-count", "alive-done", "released", "count", "read")
    return [f"{prefix}/{name}" for name in names]


def grace_s(timeout_s: float) -> float:
    """How long past its timeout a participant waits for another's verdict: max(2 s, timeout / 4), at most 60 s.

    Examples:
        >>> grace_s(1.0), grace_s(60.0), grace_s(3600.0)
        (2.0, 15.0, 60.0)
    """
    return min(max(2.0, timeout_s / 4), 60.0)


def _fields(value: int) -> tuple[int, bool, int]:
    """``P/arrived`` split: (arrivals and completions, all agree, timeouts)."""
    return value % _FIELD, bool(value & _AGREE), value // _TIMEOUT


class Round:
    """One participant's side of one guard round over ``store`` under the key prefix ``prefix``.

    `run` is the whole round. Its steps are separate so that one thread
    can act for many participants: `arrive` for each (it returns True on
    the one participant that decides), then `decide` on that one and
    `await_verdict` on the others. Each returns the round's `Verdict`, as
    seen by this participant (a verdict about another request than its own
    comes back as an out-of-step verdict about its own).

    Args:
        store: the store (any ``torch.distributed.Store``, or an object with its methods).
        prefix: the round's key prefix, equal on every participant and new for each round.
        rank: this participant's rank.
        participants: every participating rank (the caller among them; at least 2).
        request: what this participant asks for.
        timeout_s: how long to wait for the others.
        progress_s: how often to log a progress line while waiting.
        stale: prefixes of earlier rounds (failed) whose keys the decider deletes.
    """

    def __init__(
        self,
        store: Any,
        prefix: str,
        rank: int,
        participants: Sequence[int],
        request: CreationRequest,
        timeout_s: float,
        progress_s: float = 30.0,
        stale: Sequence[str] = (),
    ) -> None:
        self.store = store
        self.prefix = prefix
        self.rank = rank
        self.participants = participants
        self.size = len(participants)
        self.request = request
        self.timeout_s = timeout_s
        self.progress_s = progress_s
        self.stale = tuple(stale)
        self._count_key = f"{prefix}/count/{request.digest}"
        self._arrived_key = f"{prefix}/arrived"
        self._roster_key = f"{prefix}/roster"
        self._verdict_key = f"{prefix}/verdict"
        self._alive_key = f"{prefix}/alive"
        self._started = 0.0
        self._arrival = 0  # what P/arrived said when this participant arrived
        self._marked_alive = False

    def run(self) -> Verdict:
        """The whole round for this participant."""
        return self.decide() if self.arrive() else self.await_verdict()

    # -- steps ----------------------------------------------------------------

    def arrive(self) -> bool:
        """Announce, count this participant's request and arrival; True on the last to arrive (the decider)."""
        self._started = time.monotonic()
        announcement = Announcement(self.prefix, runs_text(self.participants), self.request)
        self.store.set(announce_key(self.rank), announcement.encode())
        line = f"{self.rank} {self.request.digest}"
        counted = self.store.add(self._count_key, 1)
        if counted == 1:
            line += f" {self.request.encoded}"  # the first with this digest records the request
        self.store.append(self._roster_key, line + "\n")
        self._arrival = self.store.add(self._arrived_key, 1 + (_AGREE if counted == self.size else 0))
        return _fields(self._arrival)[0] == self.size

    def decide(self) -> Verdict:
        """On the last to arrive: publish the verdict, delete what no one reads any more."""
        _, agree, timeouts = _fields(self._arrival)
        if timeouts:
            return self._follow(decider=True)  # a participant gave up first: its verdict stands
        if agree:  # every count was added before this arrival: a count of N means all agree
            verdict, digests = Verdict("ok"), [self.request.digest]
        else:
            roster, requests = diagnosis.roster_of(self.store, self.prefix)
            verdict, digests = mismatch_verdict(self.size, roster, requests), sorted(set(roster.values()))
        published = self._publish(verdict)
        if published is not verdict:  # a probe or a timeout decided first: its verdict stands
            self.store.delete_key(self._count_key)
            return self._own(published)
        for digest in digests:
            self.store.delete_key(f"{self.prefix}/count/{digest}")
        self.store.delete_key(self._roster_key)
        for prefix in self.stale:
            for key in round_keys(prefix):
                self.store.delete_key(key)
        return verdict

    def await_verdict(self) -> Verdict:
        """On the others: wait for the verdict (logging progress, probing if first), then count this one done."""
        verdict = self._wait(self._started + self.timeout_s, progress=True)
        if verdict is None:
            return self._give_up()
        return self._conclude(verdict)

    # -- waiting and failures -------------------------------------------------

    def _conclude(self, verdict: Verdict) -> Verdict:
        """The verdict was read: count this participant done; the last one cleans up."""
        done = _fields(self.store.add(self._arrived_key, 1))[0]
        if done == 2 * self.size - 1:  # every participant arrived and every waiter read: nobody needs the keys
            for key in (self._arrived_key, self._verdict_key, self._alive_key):  # alive: marks of a slow round
                self.store.delete_key(key)
        if verdict.kind != "ok":
            self.store.delete_key(self._count_key)  # the decider deletes the counts only of its own verdicts
        return self._own(verdict)

    def _own(self, verdict: Verdict) -> Verdict:
        """``verdict`` as this participant must see it: about its own request, never another's."""
        if verdict.kind != "ok" and verdict.about and self.request.digest not in verdict.about:
            return foreign_verdict(self.request, self.rank, verdict)
        return verdict

    def _wait(self, deadline: float, progress: bool) -> Verdict | None:
        """Wait until the verdict exists and read it, or return None once ``deadline`` passes.

        Logs progress and probes on the way. A ``wait`` that returns without the
        key (torch's store client can, when its timeout ends as another client
        writes) is taken for what it is: the wait goes on.
        """
        start = self._started
        next_line = start + min(self.progress_s, self.timeout_s / 4)
        first = _fields(self._arrival)[0] == 1  # only the first to arrive probes
        next_probe = start + probe_s(self.size, self.timeout_s) if first else float("inf")
        while True:
            now = time.monotonic()
            if now >= deadline:
                return None
            until = min(next_line, next_probe, deadline) if progress else deadline
            try:
                self.store.wait([self._verdict_key], datetime.timedelta(seconds=max(until - now, 0.001)))
                data = diagnosis.read(self.store, self._verdict_key)
                if data is not None:
                    return Verdict.decode(data)
            except RuntimeError:  # the slice ended without a verdict (DistStoreError is a RuntimeError)
                pass
            now = time.monotonic()
            if progress and next_probe <= now < deadline:
                next_probe = float("inf") if next_probe < next_line else next_line + self.progress_s
                self._probe()
            if progress and next_line <= now < deadline:
                self._mark_alive()  # for a roll call, should the decider stop before deciding
                self._log_progress(now - start)
                next_line += self.progress_s

    def _mark_alive(self) -> None:
        """Append this participant to the round's roll call, once (slow and failure paths only)."""
        if not self._marked_alive:
            self.store.append(self._alive_key, f"{self.rank}\n")
            self._marked_alive = True

    def _probe(self) -> None:
        """On the first to arrive, a round open past its probe time: end it if ranks are stuck elsewhere."""
        verdict, _ = self._stuck_verdict()
        if verdict is not None:
            self._publish(verdict)

    def _stuck_verdict(self) -> tuple[Verdict | None, list[int]]:
        """An out-of-step (or mismatch) verdict if missing ranks are stuck in another round that waits for us.

        The verdict names every request of both rounds and ends both: it is
        published into the other round(s) too, or taken from there when one of
        them decided first, so that every rank on both sides raises the same
        error (and ``destroy()`` brings all of them to the same next epoch).
        """
        roster, requests = diagnosis.roster_of(self.store, self.prefix)
        missing = [rank for rank in self.participants if rank not in roster]
        stuck, found = diagnosis.waiting_elsewhere(self.store, self.prefix, roster, missing, self.request.digest)
        if not stuck:
            return None, missing
        if found is not None:
            return found, missing
        for rank, seen in stuck.items():
            roster[rank] = seen.request.digest
            requests.setdefault(seen.request.digest, seen.request.encoded)
        verdict = mismatch_verdict(self.size, roster, requests)
        text = verdict.encode()
        for other in sorted({seen.prefix for seen in stuck.values()}):
            current = self.store.compare_set(f"{other}/verdict", "", text)
            if current != text.encode():
                theirs = Verdict.decode(current)
                if theirs.kind != "ok" and self.request.digest in theirs.about:
                    return theirs, missing  # the other round decided about us first: its verdict ends both
        return verdict, missing

    def _log_progress(self, waited: float) -> None:
        arrived = min(_fields(self.store.add(self._arrived_key, 0))[0], self.size)
        text = (
            f"hypergrid: waiting {waited:.0f} s for {self.request.call()} on grid {self.request.grid}: "
            f"{arrived}/{self.size} ranks arrived"
        )
        if _fields(self._arrival)[0] == 1:  # only the first to arrive reads the roster
            missing = self._missing()
            if missing:
                text += f"; missing {shown_ranks(missing)}"
        LOGGER.warning("%s (timeout %g s)", text, self.timeout_s)

    def _give_up(self) -> Verdict:
        """This participant's timeout passed without a verdict: declare the timeout, unless a decision was first."""
        arrived, _, timeouts = _fields(self.store.add(self._arrived_key, _TIMEOUT))
        if arrived >= self.size or timeouts > 1:  # the decider arrived, or another participant gave up, first
            return self._follow(decider=False)
        verdict, missing = self._stuck_verdict()  # out of step, found only now if the first arrival is elsewhere
        if verdict is None:
            seen_text = diagnosis.last_seen(self.store, self.prefix, missing)
            verdict = timeout_verdict(self.request, self.size, missing, self.timeout_s, last_seen=seen_text)
        verdict = self._publish(verdict)
        self.store.delete_key(self._count_key)
        return self._own(verdict)

    def _follow(self, decider: bool) -> Verdict:
        """Another participant decided first: wait a grace for its verdict and take it.

        When none comes, every participant arrived but the decider (or a waiter)
        stopped: the ranks that marked themselves alive are the ones still here.
        """
        self._mark_alive()
        verdict = self._wait(time.monotonic() + grace_s(self.timeout_s), progress=False)
        if verdict is None:
            alive = diagnosis.alive_of(self.store, self.prefix)
            silent = [rank for rank in self.participants if rank not in alive]
            timed_out = timeout_verdict(self.request, self.size, self._missing(), self.timeout_s, dead=silent)
            verdict = self._publish(timed_out)
        if not decider:
            return self._conclude(verdict)
        self.store.delete_key(self._count_key)  # a failure: the decider lost to it
        return self._own(verdict)

    def _publish(self, verdict: Verdict) -> Verdict:
        """Write ``verdict`` unless one is there already; return the one in force (``verdict`` itself if it won)."""
        text = verdict.encode()
        current = self.store.compare_set(self._verdict_key, "", text)
        return verdict if current == text.encode() else Verdict.decode(current)

    def _missing(self) -> list[int]:
        roster = diagnosis.roster_of(self.store, self.prefix)[0]
        return [rank for rank in self.participants if rank not in roster]
