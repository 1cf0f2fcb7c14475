"""Each rank's watcher: one thread per world, blocked on one store key, that answers for its rank and acts on verdicts.

`Watcher` waits on its block's wake key (`hypergrid.agreement.liveness.wake_key`) on a store connection of its
own; `Watcher.side` serves short calls from other threads. When any rank calls an incident, it answers, reads the
verdict and acts on it (under ``hypergrid.run`` the node's agent answers and reads: `hypergrid.agreement.relay`):
a failure (or a probe that found dead ranks) runs `Watcher.on_failure`'s callbacks (the alarm sounds) and
`Watcher.on_dead`'s (``shrink``'s attempts); its own rank dead, on the minority side, or left behind fences the
rank (``on_fence``). `Watcher.report` opens an incident and returns its verdict. docs/design/rollcall.md.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch.distributed as dist

from hypergrid.agreement import diagnosis
from hypergrid.agreement.liveness import (
    END,
    FAILURE,
    PROBE,
    Incident,
    Verdict,
    bound_s,
    done_key,
    end_text,
    ended_key,
    incident_prefix,
    left_behind,
    record_member,
    wake_key,
    watching_enabled,
)
from hypergrid.agreement.relay import Relay
from hypergrid.binding.alarm import Job, is_store_loss
from hypergrid.timing import FOREVER_S, Timing
from hypergrid.values import described

__all__ = ["Verdict", "Watcher", "watching_enabled"]

LOGGER = logging.getLogger("hypergrid")


class Watcher:
    """The watcher of one rank in one world (see the module's docstring).

    Args:
        store: a store connection for the watcher's thread alone (``Store.clone()`` of the world's base store).
        side: a second connection, for short calls from any thread (`report`, probes, failing a barrier).
        world: the world's epoch number (0: the job's first world).
        rank: this rank in that world.
        size: the world's size.
        on_fence: what fencing this rank does (its world's: the alarm's fence, then its groups severed).
        job: the job the world belongs to (a store loss the thread meets is the job's).
        first: the incident to wait on first (a rank that joins a watched world: the one after its ``done``).
        liveness_s: how long live ranks have to answer (default: ``HYPERGRID_LIVENESS_S``, 0.5 s).
        relay: the line from the node's agent that answers for this rank (`hypergrid.agreement.relay`): the thread
            reads its roll calls' verdicts there instead of answering on the store (None, or the agent stopped: itself).
    """

    def __init__(
        self,
        store: Any,
        side: Any,
        world: int,
        rank: int,
        size: int,
        *,
        on_fence: Callable[[str], None] = lambda reason: None,
        job: Job | None = None,
        first: int = 0,
        liveness_s: float | None = None,
        relay: Relay | None = None,
    ) -> None:
        self.relay, self.store, self.side = relay, store, side  # (relay: None once the agent stopped running)
        self.world, self.rank = world, rank
        self.expected: list[int] = list(range(size))
        self.dead: list[int] = []
        self.liveness_s = liveness_s
        self.on_fence = on_fence
        self.job = job
        self.number = first  # the incident the thread waits on (or is handling)
        self.joined = False  # whether this rank is listed in the world's watch (`start`)
        self._answered = -1  # the last incident it answered (a report never writes into one it did)
        self.end_dead: tuple[int, ...] | None = None  # the dead the world's end named, once read
        self.verdicts: dict[int, Verdict] = {}
        self.failure: Verdict | None = None  # the first verdict that failed the world
        self.fenced = self.stopped = False
        self._incident: Incident | None = None  # the one the thread handles (`halt` interrupts its waits)
        self._callbacks: list[Callable[[Verdict], None]] = []
        self._on_dead: list[Callable[[tuple[int, ...]], None]] = []  # `on_dead`'s, run at each verdict with dead
        self._changed = threading.Condition()
        self._thread = threading.Thread(target=self._run, name=f"hypergrid-watcher-{world}-{rank}", daemon=True)

    # -- life ------------------------------------------------------------------

    @property
    def thread(self) -> threading.Thread:
        """The watcher's thread (it calls through ``store`` alone: `CallStore.lend`)."""
        return self._thread

    def start(self) -> Watcher:
        """Start the thread, then list this rank in the world's watch (`record_member`): from now on a roll call
        that it does not answer names it dead (before, it is *late*). With a relay, the agent answers for it from
        before that listing on (where the agent does not acknowledge in time, the watcher answers itself)."""
        if self.relay is not None:
            self.number, self.relay = self.relay.attach(self.number)
        self._thread.start()
        record_member(self.side, self.world, self.rank, joined=True)
        self.joined = True  # (from now on the world's watch lists it: its absence means the world ended)
        done = diagnosis.read(self.side, done_key(self.world))  # an incident that closed since `first` was read
        with self._changed:  # (it called this rank absent): the thread moves past it
            if done is not None and int(done) >= self.number and self._answered < 0:
                stale, self.number = self.number, int(done) + 1
                if self.relay is not None:
                    self.relay.catch_up(self.number)  # (the agent's thread waits there)
                else:
                    diagnosis.read(self.side, wake_key(self.world, stale, self.rank))  # wakes it where it waits
        return self

    def stop(self) -> str:
        """Stop answering (this rank leaves the world); the thread ends at its next wake-up. Its block's wake key."""
        with self._changed:  # (`_handle` moves to the next incident under it: the thread waits on this key, or stops)
            self.stopped = True
            self._changed.notify_all()
            if self.relay is not None:
                self.relay.close()  # (the agent answers for it no more)
            return wake_key(self.world, self.number, self.rank)

    def halt(self, store: Any, timeout_s: float) -> bool:
        """Stop, wake the thread and join it; whether it ended within ``timeout_s``.

        ``store``: a connection other than the thread's (the world's call store; one already gone is no error).
        Every 0.1 s until the thread ended, a read of its block's wake key (the block's other watchers wait again:
        `_handle`), and in an incident `Incident.interrupt` (see `join`; docs/design/rollcall.md, "A watcher's life").
        """
        key = self.stop()
        deadline = time.monotonic() + timeout_s
        while not self.join(0.0):
            if time.monotonic() >= deadline:
                return False
            incident = self._incident
            with contextlib.suppress(RuntimeError):
                diagnosis.read(store, key)
                if incident is not None:
                    incident.interrupt(store)
            self.join(min(0.1, max(deadline - time.monotonic(), 0.0)))
        return True

    def forget(self) -> None:
        """The thread ended: drop its connections and callbacks (no cycle through them keeps a socket open)."""
        with self._changed:
            self.store = self.side = None
            self._callbacks, self._on_dead = [], []
        if self.relay is not None:
            self.relay.release()

    def join(self, timeout_s: float) -> bool:
        """Wait until the (stopped) thread ended; whether it did within ``timeout_s`` (a thread whose store wait ends
        while the interpreter finalizes wakes into a torch frame that cannot unwind: ``std::terminate``)."""
        self._thread.join(timeout_s)
        return not self._thread.is_alive()

    def leave(self) -> None:
        """This rank's process ends normally: once an incident it answered has its verdict (its read counted; at most
        the roll call's bound and its grace), it leaves the watch, answered for until then (its agent), then stops."""
        if self.stopped or self.fenced:
            return
        deadline = time.monotonic() + bound_s(len(self.expected), self.liveness_s) + Timing.from_env().report_grace_s
        while self._incident is not None and self._thread.is_alive() and time.monotonic() < deadline:
            time.sleep(0.005)  # (with a relay, none: the agent reads for this rank)
        self.joined = False  # (from now on its absence from the watch is its own leave: no fence)
        with contextlib.suppress(RuntimeError):  # the store is gone already: the job is over
            record_member(self.side, self.world, self.rank, joined=False, dead=len(self.dead))
        self.stop()

    def end_world(self, dead: Sequence[int], size: int) -> None:
        """This rank's world of ``size`` ranks ended (``shrink`` moved its live ranks on, ``dead`` left behind).

        Writes the end (`hypergrid.agreement.liveness.end_text`) as the call of the incident every live watcher
        waits on, after any probe still open there; every survivor may call it: the first write counts. Before it,
        the record of the world's end (`hypergrid.agreement.liveness.ended_key`): docs/design/recovery.md ("The
        record of a world's end").
        """
        text = end_text(dead, size, self.rank)
        with contextlib.suppress(RuntimeError):  # (the store is gone)
            if dead:  # written before the end: a rank it names finds it even once the end's call is deleted
                self.side.compare_set(ended_key(self.world), "", json.dumps(sorted(dead)))
            while (called := self._call(END.strip(), text[len(END) :])) is not None and not called[1].startswith(END):
                if self._await(called[0]) is None:  # a probe holds this incident: its verdict, then the next
                    return

    def on_failure(self, callback: Callable[[Verdict], None]) -> None:
        """Run ``callback(verdict)`` (on the watcher's thread) when the world fails; at once if it already did."""
        with self._changed:
            failed = self.failure
            if failed is None:
                self._callbacks.append(callback)
        if failed is not None:
            callback(failed)

    def on_dead(self, callback: Callable[[tuple[int, ...]], None]) -> Callable[[], None]:
        """Run ``callback(dead)`` (watcher's thread) at each verdict naming dead ranks; at once if any are; its undo.

        ``dead``: all found dead so far. Unlike `on_failure`, at every roll call (``shrink``'s attempts use it).
        """
        with self._changed:
            self._on_dead.append(callback)
            dead = tuple(self.dead)
        if dead:
            callback(dead)
        return lambda: self._on_dead.remove(callback)  # (`_handle` copies the list under the lock)

    # -- the thread --------------------------------------------------------------

    def _may_call(self, number: int) -> bool:
        """Whether incident ``number`` is not over (a call never goes into one the others finished and deleted): one
        this watcher has not answered cannot be; with a relay (the agent answers), ``done`` says (one read)."""
        incident = Incident(self.side, incident_prefix(self.world, number), self.rank, ())
        return self._answered < number if self.relay is None else not incident.over()

    def _run(self) -> None:
        try:
            follow = (lambda: self.number, self._apply, self._ended, self._fence, self.job)
            if self.relay is not None and self.relay.follow(*follow):  # the agent stopped running (it was released):
                self.relay = None  # this rank answers itself from here on
            while not self.stopped and self.relay is None and self._answer_next():
                continue
        except RuntimeError as error:  # the store is gone: the job is over (or this rank is cut off)
            if self.stopped:
                return
            if is_store_loss(error) and self.job is not None:  # every grid wait of this rank ends with StoreLostError
                self.job.lose_store(error)
            else:  # never expected, so said aloud: its rank no longer answers roll calls, the others find it dead
                LOGGER.warning(
                    "hypergrid watcher of world %s rank %s stops on %s", self.world, self.rank, described(error)
                )

    def _answer_next(self) -> bool:
        """One blocking wait on the wake key (set by a call written before the wait: kept), then the incident; False
        once the thread ends: a close's wake (`halt`), this rank's own call (`depart`: it is dead), or `_handle`."""
        with contextlib.suppress(dist.DistStoreError):  # (the slice ended first: it waits again)
            self.store.wait([wake_key(self.world, self.number, self.rank)], datetime.timedelta(seconds=FOREVER_S))
            return not self.stopped and self._handle(incident_prefix(self.world, self.number))
        return True

    def _left_behind(self, store: Any) -> bool:
        """Whether the others went on without this rank: the world's end names it (`ended_key`), or the world's
        watch is gone although this rank is in it (`members_key`: deleted once the world ended, or once every live
        member left; this rank never left, so it was named dead). It fences it then. One read, one check."""
        if self.end_dead is not None:  # it read the world's end: it knows whether the end left it behind
            return self.fenced
        if not left_behind(store, self.world, self.rank, lambda: self.joined):
            return False
        self._fence(f"world {self.world} ended without this rank (the others shrank while it was stopped or cut off)")
        return True

    def excluded(self) -> bool:
        """Whether the others went on without this rank (it is fenced then): what the world's alarm asks once the
        world failed, so that a rank stopped through the others' whole shrink raises ``FencedError`` at once."""
        return self.fenced or self._left_behind(self.side)

    def depart(self, text: str) -> None:
        """This rank's process ends on an error: stop answering, then call a roll call that finds it gone (the
        others' waits end with ``RankFailure`` naming it, instead of waiting for it)."""
        with contextlib.suppress(RuntimeError):  # the store is gone already
            self._call(FAILURE, f"rank {self.rank} exited on an error: {text}", depart=True)

    def _handle(self, prefix: str) -> bool:
        """Answer one incident and act on its verdict; False once this rank is out (fenced) or the world ended."""
        seen = time.monotonic()
        incident = Incident(self.store, prefix, self.rank, list(self.expected))
        incident.stop, incident.waker = (lambda: self.stopped), self.side
        call = incident.answer()
        if call is None:  # stopped (a close's wake), the world's end names it (fenced there), a neighbour's close,
            if self.stopped or self._left_behind(self.store):  # or the others finished this incident without it
                return False
            if not incident.over():  # `Incident.over`: 3 reads, then it waits again (at most 7 watchers per close)
                return True
            self._fence(f"world {self.world} went on without this rank (incident {self.number} ended without it)")
            return False
        with self._changed:  # from here on a report joins this incident or calls the next (it answered)
            self._answered = self.number
            self._incident = incident
        if call.startswith(END):  # (known before it counts its read: the world's keys go after the last read)
            self._ended(tuple(json.loads(call[len(END) :])[0]))
            incident.read_end(call, seen + bound_s(len(self.expected), self.liveness_s))
            return False
        verdict = incident.close(call, seen, self.liveness_s)
        self._incident = None
        if verdict is None:  # no verdict: stopped (its process ends: `halt`), or the incident ended without it
            if not self.stopped and not self._left_behind(self.store):  # (the world's end names it: fenced there)
                self._fence(f"world {self.world} went on without this rank (incident {self.number} ended without it)")
            return False
        incident.conclude(verdict)
        return self._apply(verdict)

    def _ended(self, dead: tuple[int, ...]) -> None:
        """This rank read the world's end, naming ``dead``: it is fenced (among them) or its watch stops."""
        with self._changed:
            self.end_dead = dead
        if self.rank in dead:
            self._fence(f"world {self.world} ended without this rank (declared dead)")
        else:
            self.stop()

    def _apply(self, verdict: Verdict) -> bool:
        """This rank read the verdict of the incident it waits on: act on it; False once the rank is out."""
        with self._changed:
            self.verdicts[self.number] = verdict
            self.verdicts.pop(self.number - 8, None)
            self.number += 1
            if verdict.dead:
                self.dead = sorted({*self.dead, *verdict.dead})
                self.expected = [rank for rank in self.expected if rank not in set(verdict.dead)]
            callbacks: list[Callable[[Verdict], None]] = []
            if verdict.failed and self.failure is None and not verdict.excludes(self.rank):
                self.failure = Verdict(verdict.kind, tuple(self.dead), verdict.text)
                callbacks, self._callbacks = self._callbacks, []
            on_dead, dead = (list(self._on_dead) if verdict.dead else []), tuple(self.dead)
            self._changed.notify_all()
        if verdict.excludes(self.rank):
            side = "on the minority side" if verdict.kind == "minority" else "declared dead"
            self._fence(f"{side} in world {self.world}'s roll call ({verdict.text})")
            return False
        for callback in callbacks:
            callback(self.failure)  # type: ignore[arg-type]  # set above whenever callbacks were taken
        for each in on_dead:
            each(dead)
        return True

    def _fence(self, reason: str) -> None:
        self.on_fence(reason)  # first: a thread that sees ``fenced`` finds the rank fenced already
        with self._changed:
            self.fenced = True
            self._changed.notify_all()

    # -- reporting ----------------------------------------------------------------

    def report(self, kind: str, text: str) -> Verdict | None:
        """Call a roll call now (``"failure"`` or ``"probe"``): the incident the watcher waits on (or joined, if
        another rank called it first; a failure that meets a probe which failed nothing calls the next one). Its
        verdict, ``dead`` holding every rank found dead so far; None when none came in time (stopped, fenced). A
        world that ended without this rank is never called again: the rank is fenced instead."""
        if self.fenced or self.stopped or self._left_behind(self.side):
            return None
        while (called := self._call(kind, text)) is not None:
            verdict = self._await(called[0])
            if verdict is None:
                return None
            if kind == PROBE or verdict.failed:
                with self._changed:
                    return Verdict(verdict.kind, tuple(self.dead), verdict.text)
        return None

    def _call(self, kind: str, text: str, depart: bool = False) -> tuple[int, str] | None:
        """Call ``kind text`` into the incident the watcher waits on: its number and the call in force there (""
        where it is over: never into an incident the others finished and deleted); None once stopped or fenced.
        ``depart``: stop answering first (this rank's process ends: the call finds it gone)."""
        with self._changed:
            if self.stopped or self.fenced:
                return None
            if depart:
                self.stopped = True
                if self.relay is not None:
                    self.relay.close()
            number = self.number
            if not self._may_call(number):
                return number, ""
            return number, Incident(self.side, incident_prefix(self.world, number), self.rank, ()).call(
                kind, text, self.expected
            )

    def _await(self, number: int) -> Verdict | None:
        """Incident ``number``'s verdict, once the thread read it; None past the roll call's bound and its grace."""
        deadline = time.monotonic() + bound_s(len(self.expected), self.liveness_s) + Timing.from_env().report_grace_s
        with self._changed:
            while number not in self.verdicts and not self.fenced and not self.stopped:
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self._changed.wait(left)
            return self.verdicts.get(number)

    def probe(self, text: str) -> tuple[int, ...]:
        """A roll call now (unless the world already failed): every rank of the world found dead so far."""
        self.report(PROBE, text)
        return tuple(self.dead)

    def alarm_reporter(self, kind: str, text: str) -> Sequence[int] | None:
        """The reporter `hypergrid.binding.alarm` calls (a torch failure, a long wait): the dead, or None."""
        verdict = self.report(kind, text)
        return None if verdict is None else verdict.dead
