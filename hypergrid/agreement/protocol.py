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
- ``P/verdict``: ``ok``, or the failure as JSON.

A participant adds 1 to the count of its request's digest, appends its roster
line and adds 1 to ``P/arrived`` (plus bit 30 if its count came back N: then
every participant sent its request). The one whose add makes the arrivals N,
the *decider*, sees in the value whether all agree (bit 30 set) and writes
``P/verdict``, then deletes the counts and the roster. The others wait for
``P/verdict`` and add 1 to ``P/arrived`` again: the value tells them that all
agree (a failure is read from ``P/verdict``), and the last of them deletes
``P/arrived`` and ``P/verdict``. A participant whose timeout passes adds one
timeout to ``P/arrived``: if it is the first and not everyone has arrived, it
reads the roster, names the missing ranks and writes that verdict; whichever
comes first, the decider's arrival or that timeout, decides for everyone.
"""

from __future__ import annotations

import datetime
import logging
import time
from collections.abc import Sequence
from typing import Any

from hypergrid.agreement.request import CreationRequest, Verdict, mismatch_verdict, shown_ranks, timeout_verdict

__all__ = ["LOGGER", "Round", "round_keys"]

#: The logger of the progress lines (``logging.getLogger("hypergrid")``).
LOGGER = logging.getLogger("hypergrid")

_FIELD = 1 << 30  # P/arrived: arrivals and completions count below this (rounds of up to 2**29 ranks)
_AGREE = _FIELD  # one request's count reached the number of participants: all agree
_TIMEOUT = _FIELD << 1  # one participant gave up waiting

#: compare_set's expected value in a read that must never write (no key of the guard holds it).
_ABSENT = "\x00absent\x00"


def round_keys(prefix: str) -> list[str]:
    """The keys a round under ``prefix`` may leave after a timeout (each participant deletes its count)."""
    return [f"{prefix}/arrived", f"{prefix}/roster", f"{prefix}/verdict"]


def _fields(value: int) -> tuple[int, bool, int]:
    """``P/arrived`` split: (arrivals and completions, all agree, timeouts)."""
    return value % _FIELD, bool(value & _AGREE), value // _TIMEOUT


class Round:
    """One participant's side of one guard round over ``store`` under the key prefix ``prefix``.

    `run` is the whole round. Its steps are separate so that one thread
    can act for many participants: `arrive` for each (it returns True on
    the one participant that decides), then `decide` on that one and
    `await_verdict` on the others. Each returns the round's `Verdict`.

    Args:
        store: the store (any ``torch.distributed.Store``, or an object with its methods).
        prefix: the round's key prefix, equal on every participant and new for each round.
        rank: this participant's rank.
        participants: every participating rank (the caller among them; at least 2).
        request: what this participant asks for.
        timeout_s: how long to wait for the others.
        progress_s: how often to log a progress line while waiting.
        stale: prefixes of earlier rounds (timed out) whose keys the decider deletes.
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
        self._readers_key = f"{prefix}/readers"
        self._started = 0.0
        self._arrival = 0  # what P/arrived said when this participant arrived

    def run(self) -> Verdict:
        """The whole round for this participant."""
        return self.decide() if self.arrive() else self.await_verdict()

    # -- steps ----------------------------------------------------------------

    def arrive(self) -> bool:
        """Count this participant's request and arrival; True on the last to arrive (the decider)."""
        self._started = time.monotonic()
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
            return self._follow(decider=True)  # a participant gave up first: its timeout verdict stands
        if agree:  # every count was added before this arrival: a count of N means all agree
            verdict, digests = Verdict("ok"), [self.request.digest]
        else:
            roster, requests = self._roster()
            verdict, digests = mismatch_verdict(self.size, roster, requests), sorted(set(roster.values()))
        verdict = self._publish(verdict)
        if verdict.kind == "timeout":
            self.store.delete_key(self._count_key)
            return verdict
        for digest in digests:
            self.store.delete_key(f"{self.prefix}/count/{digest}")
        self.store.delete_key(self._roster_key)
        for prefix in self.stale:
            for key in round_keys(prefix):
                self.store.delete_key(key)
        return verdict

    def await_verdict(self) -> Verdict:
        """On the others: wait for the verdict (logging progress), then count this participant done."""
        if not self._wait(self._started + self.timeout_s, progress=True):
            return self._give_up()
        return self._conclude()

    # -- waiting and failures -------------------------------------------------

    def _conclude(self) -> Verdict:
        """The verdict exists: count this participant done (the count tells an agreement); the last cleans up."""
        done, agree, timeouts = _fields(self.store.add(self._arrived_key, 1))
        if agree and not timeouts:
            if done == 2 * self.size - 1:  # the last to conclude: nobody needs the round's keys any more
                self.store.delete_key(self._arrived_key)
                self.store.delete_key(self._verdict_key)
            return Verdict("ok")
        # A failure: read the verdict before counting this reader, so the last reader deletes it only
        # once every waiter has read it (the failure path may spend more operations than success).
        verdict = self._read()
        if verdict.kind == "timeout":
            self.store.delete_key(self._count_key)
        elif self.store.add(self._readers_key, 1) == self.size - 1:  # the decider reads nothing
            for key in (self._arrived_key, self._verdict_key, self._readers_key):
                self.store.delete_key(key)
        return verdict

    def _wait(self, deadline: float, progress: bool) -> bool:
        """Wait until the verdict exists (True) or ``deadline`` passes (False), logging progress."""
        start = self._started
        next_line = start + min(self.progress_s, self.timeout_s / 4)
        while True:
            now = time.monotonic()
            if now >= deadline:
                return False
            until = min(next_line, deadline) if progress else deadline
            try:
                self.store.wait([self._verdict_key], datetime.timedelta(seconds=max(until - now, 0.001)))
                return True
            except RuntimeError:  # the slice ended without a verdict (DistStoreError is a RuntimeError)
                pass
            now = time.monotonic()
            if progress and next_line <= now < deadline:
                self._log_progress(now - start)
                next_line += self.progress_s

    def _log_progress(self, waited: float) -> None:
        arrived = min(_fields(self.store.add(self._arrived_key, 0))[0], self.size)
        text = (
            f"hypergrid: waiting {waited:.0f} s for {self.request.call()} on grid {self.request.grid}: "
            f"{arrived}/{self.size} ranks arrived"
        )
        if self.rank == self.participants[0]:  # only the first participant reads the roster
            missing = self._missing()
            if missing:
                text += f"; missing {shown_ranks(missing)}"
        LOGGER.warning("%s (timeout %g s)", text, self.timeout_s)

    def _give_up(self) -> Verdict:
        """This participant's timeout passed without a verdict: declare the timeout, unless a decision was first."""
        arrived, _, timeouts = _fields(self.store.add(self._arrived_key, _TIMEOUT))
        if arrived >= self.size or timeouts > 1:  # the decider arrived, or another participant gave up, first
            return self._follow(decider=False)
        verdict = self._publish(self._timeout_verdict())
        if verdict.kind == "timeout":
            self.store.delete_key(self._count_key)
        return verdict

    def _follow(self, decider: bool) -> Verdict:
        """Another participant decided first: wait briefly for its verdict and take it."""
        grace = min(max(2.0, self.timeout_s / 4), 60.0)
        if not self._wait(time.monotonic() + grace, progress=False):
            self._publish(self._timeout_verdict())  # it stopped before writing: judge from the roster
        if not decider:
            return self._conclude()
        verdict = self._read()  # a timeout: the decider lost to it
        self.store.delete_key(self._count_key)
        return verdict

    def _publish(self, verdict: Verdict) -> Verdict:
        """Write ``verdict`` unless one is there already; return the one in force."""
        text = verdict.encode()
        current = self.store.compare_set(self._verdict_key, "", text)
        return verdict if current == text.encode() else Verdict.decode(current)

    def _read(self) -> Verdict:
        data = self.store.compare_set(self._verdict_key, _ABSENT, _ABSENT)  # a read that never blocks
        if data == _ABSENT.encode():
            return Verdict(
                "timeout",
                f"the guard's verdict for {self.request.call()} vanished from the store before rank "
                f"{self.rank} read it: something else deleted hypergrid's keys",
            )
        return Verdict.decode(data)

    def _roster(self) -> tuple[dict[int, str], dict[str, str]]:
        """(rank -> digest, digest -> encoded request) from the roster; read on failure paths only."""
        data = self.store.compare_set(self._roster_key, _ABSENT, _ABSENT)
        entries: dict[int, str] = {}
        requests: dict[str, str] = {}
        if data == _ABSENT.encode():
            return entries, requests
        for line in data.decode().splitlines():
            rank, digest, *request = line.split(" ", 2)
            entries[int(rank)] = digest
            if request:
                requests[digest] = request[0]
        return entries, requests

    def _missing(self) -> list[int]:
        roster = self._roster()[0]
        return [rank for rank in self.participants if rank not in roster]

    def _timeout_verdict(self) -> Verdict:
        return timeout_verdict(self.request, self.size, self._missing(), self.timeout_s)
