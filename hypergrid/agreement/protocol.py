"""One round of the consistency guard on a store: O(1) store operations per participant.

`hypergrid.agreement.guard` decides who takes part and under which key prefix; this module is the protocol
itself, one `Round` object per participant and round, whose steps (`Round.arrive`, `Round.decide`,
`Round.await_verdict`) can be driven one at a time, so a benchmark can play many participants over a few store
connections. Each participant counts its request's digest and appends its roster line; the one whose count makes
N (the *decider*) publishes the verdict, the others wait for it. The keys, the costs and the slow paths:
docs/design/reliability.md ("The guard round").
"""

from __future__ import annotations

import datetime
import logging
import time
from collections.abc import Callable, Sequence
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
from hypergrid.timing import Timing

__all__ = ["LOGGER", "Round", "round_keys"]

#: The logger of the progress lines (``logging.getLogger("hypergrid")``).
LOGGER = logging.getLogger("hypergrid")


def round_keys(prefix: str) -> list[str]:
    """The keys a round under ``prefix`` may leave when it fails (each participant deletes its count)."""
    names = ("arrived", "roster", "verdict", "alive", "alive-count", "alive-done", "released", "count", "read",
             "commit/count", "commit/verdict", "commit/read", "commit/released")  # fmt: skip
    return [f"{prefix}/{name}" for name in names]


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
        liveness: the world's roll call (every rank it found dead so far), where a watcher runs: a waiting
            participant asks it after the probe (then twice as long, and so on), so a peer stopped or cut off
            is found as in a collective (its verdict ends the round, `hypergrid.agreement.guard.agree`), and a
            timeout never names dead a missing rank that it finds alive.
        timing: the world's `hypergrid.timing.Timing` (default: the defaults), with ``timeout_s`` as its group
            timeout: when the first participant of each request probes the round
            (`hypergrid.timing.Timing.guard_probe_s`), when a waiting one first asks ``liveness`` (the probe), how
            long past the timeout one waits for another's verdict (`hypergrid.timing.Timing.guard_grace_s`).
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
        liveness: Callable[[], Sequence[int]] | None = None,
        timing: Timing | None = None,
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
        self.liveness = liveness
        self.timing = (Timing() if timing is None else timing).with_group_timeout(timeout_s)
        self._count_key = f"{prefix}/count/{request.digest}"
        self._roster_key = f"{prefix}/roster"
        self._verdict_key = f"{prefix}/verdict"
        self._alive_key = f"{prefix}/alive"
        self._started = 0.0
        self._counted = 0  # what this participant's count add returned (1: the first of its request)
        self._marked_alive = False
        self._announced = False

    def run(self) -> Verdict:
        """The whole round for this participant."""
        return self.decide() if self.arrive() else self.await_verdict()

    # -- steps ----------------------------------------------------------------

    def arrive(self) -> bool:
        """Count this participant's request and list it in the roster; True on the decider (its count made N)."""
        self._started = time.monotonic()
        self._counted = self.store.add(self._count_key, 1)
        line = f"{self.rank} {self.request.digest}"
        if self._counted == 1:
            line += f" {self.request.encoded}"  # the first with this digest records the request
        self.store.append(self._roster_key, line + "\n")
        return self._counted == self.size

    def decide(self) -> Verdict:
        """On the decider (every participant sent its request): publish the verdict, delete the count."""
        published = self._publish(Verdict("ok"))
        self.store.delete_key(self._count_key)
        if published.kind != "ok":  # a timeout was published first: it stands
            return self._own(published)
        for prefix in self.stale:
            for key in round_keys(prefix):
                self.store.delete_key(key)
        return published

    def await_verdict(self) -> Verdict:
        """On the others: wait for the verdict (announcing and probing if slow), or give up at the timeout."""
        verdict = self._wait(self._started + self.timeout_s, progress=True)
        if verdict is None:
            return self._give_up()
        if verdict.kind != "ok":
            self.store.delete_key(self._count_key)  # the decider deletes the count only of its own verdicts
        elif self._marked_alive:
            self.store.delete_key(self._alive_key)  # a slow round's roll call: nobody reads it after an ok
        return self._own(verdict)

    # -- waiting and failures -------------------------------------------------

    def _own(self, verdict: Verdict) -> Verdict:
        """``verdict`` as this participant must see it: about its own request, never another's."""
        if verdict.kind != "ok" and verdict.about and self.request.digest not in verdict.about:
            return foreign_verdict(self.request, self.rank, verdict)
        return verdict

    def _announce(self) -> None:
        """Say where this participant waits (once per round; slow and failure paths only)."""
        if not self._announced:
            announcement = Announcement(self.prefix, runs_text(self.participants), self.request)
            self.store.set(announce_key(self.rank), announcement.encode())
            self._announced = True

    def _wait(self, deadline: float, progress: bool) -> Verdict | None:
        """Wait until the verdict exists and read it, or return None once ``deadline`` passes.

        Announces, logs progress and probes on the way. A ``wait`` that returns
        without the key (torch's store client can, when its timeout ends as
        another client writes) is taken for what it is: the wait goes on.
        """
        start = self._started
        probe_after = self.timing.guard_probe_s(self.size)
        next_line = start + min(self.progress_s, self.timeout_s / 4)
        next_announce = start + probe_after / 2 if progress else float("inf")
        first = self._counted == 1  # the first of each request probes
        next_probe = start + probe_after if first and progress else float("inf")
        ask_after = self.timing.probe_s
        next_ask = start + ask_after if progress and self.liveness is not None else float("inf")
        while True:
            now = time.monotonic()
            if now >= deadline:
                return None
            until = min(next_line, next_probe, next_announce, next_ask, deadline) if progress else deadline
            try:
                self.store.wait([self._verdict_key], datetime.timedelta(seconds=max(until - now, 0.001)))
                data = diagnosis.read(self.store, self._verdict_key)
                if data is not None:
                    return Verdict.decode(data)
            except RuntimeError:  # the slice ended without a verdict (DistStoreError is a RuntimeError)
                pass
            now = time.monotonic()
            if progress and next_announce <= now:
                self._announce()
                next_announce = float("inf")
            if progress and next_probe <= now < deadline:
                next_probe = float("inf") if next_probe < next_line else next_line + self.progress_s
                self._probe()
            if next_ask <= now < deadline and self.liveness is not None:
                ask_after *= 2
                next_ask = now + ask_after
                self.liveness()  # a peer found dead fails the world, whose news ends this round
            if progress and next_line <= now < deadline:
                self._mark_alive()  # for a roll call, should a participant stop before the verdict
                self._log_progress(now - start)
                next_line += self.progress_s

    def _mark_alive(self) -> None:
        """Append this participant to the round's roll call, once (slow and failure paths only)."""
        if not self._marked_alive:
            self.store.append(self._alive_key, f"{self.rank}\n")
            self._marked_alive = True

    def _probe(self) -> None:
        """On a first participant, a round open past its probe time: end it if requests differ or ranks are stuck."""
        self._announce()
        roster, requests = diagnosis.roster_of(self.store, self.prefix)
        if len(roster) >= self.size and len(set(roster.values())) > 1:  # everyone came, with different requests
            self._publish(mismatch_verdict(self.size, roster, requests))
            return
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
        roster = diagnosis.roster_of(self.store, self.prefix)[0]
        text = (
            f"hypergrid: waiting {waited:.0f} s for {self.request.call()} on grid {self.request.grid}: "
            f"{min(len(roster), self.size)}/{self.size} ranks arrived"
        )
        missing = [rank for rank in self.participants if rank not in roster]
        if missing and self._counted == 1:  # only a first participant names them
            text += f"; missing {shown_ranks(missing)}"
        LOGGER.warning("%s (timeout %g s)", text, self.timeout_s)

    def _give_up(self) -> Verdict:
        """This participant's timeout passed without a verdict: publish why, unless a verdict was first.

        Everyone came (the decider, or a waiter, stopped before the verdict):
        a grace for it, then the roll call names who stopped answering. Ranks
        missing: a timeout (or out-of-step) verdict naming them.
        """
        self._announce()
        self._mark_alive()
        roster, requests = diagnosis.roster_of(self.store, self.prefix)
        missing = [rank for rank in self.participants if rank not in roster]
        if not missing:
            if len(set(roster.values())) > 1:
                verdict = self._publish(mismatch_verdict(self.size, roster, requests))
            else:
                verdict = self._follow()
        else:
            stuck, _ = self._stuck_verdict()  # out of step, found only now if the first arrival is elsewhere
            if stuck is None:
                verdict = self._timed_out(missing, [], diagnosis.last_seen(self.store, self.prefix, missing))
            else:
                verdict = self._publish(stuck)
        if verdict.kind != "ok":
            self.store.delete_key(self._count_key)
        else:
            self.store.delete_key(self._alive_key)  # this rank marked itself: nobody reads it after an ok
        return self._own(verdict)

    def _follow(self) -> Verdict:
        """Everyone arrived but no verdict came: wait a grace for it; else the roll call names who stopped."""
        verdict = self._wait(time.monotonic() + self.timing.guard_grace_s, progress=False)
        if verdict is None:
            alive = diagnosis.alive_of(self.store, self.prefix)
            verdict = self._timed_out([], [rank for rank in self.participants if rank not in alive])
        return verdict

    def _timed_out(self, missing: list[int], silent: list[int], last_seen: dict[int, str] | None = None) -> Verdict:
        """Publish the timeout verdict for ``missing`` (did not come) and ``silent`` (came, then stopped answering).

        Where the world's roll call runs (``liveness``), it is asked first: a
        rank it finds alive is never named dead; one it finds dead failed the
        world, whose verdict ends this round (written into it on every rank's
        behalf): that verdict is awaited (a grace) rather than raced.
        """
        answering = None
        if self.liveness is not None:
            dead = set(self.liveness())
            answering = [rank for rank in self.participants if rank not in dead]
            if dead & ({*missing, *silent}):
                found = self._wait(time.monotonic() + self.timing.guard_grace_s, progress=False)
                if found is not None:
                    return found
        verdict = timeout_verdict(
            self.request, self.size, missing, self.timeout_s, dead=silent, last_seen=last_seen, answering=answering
        )
        return self._publish(verdict)

    def _publish(self, verdict: Verdict) -> Verdict:
        """Write ``verdict`` unless one is there already; return the one in force (``verdict`` itself if it won)."""
        text = verdict.encode()
        current = self.store.compare_set(self._verdict_key, "", text)
        return verdict if current == text.encode() else Verdict.decode(current)
