"""Each rank's watcher: one thread, blocked on one store key, that answers for its rank and spreads failure news.

The thread waits on the call key of its world's next incident
(`hypergrid.agreement.liveness`) on a store connection of its own (a store
client serves one call at a time, and the main thread's may be blocked); a
second connection, `Watcher.side`, serves short calls from any thread
(reports, probes, a barrier failed from outside). When any rank calls the incident, every watcher
wakes at once, answers the roll call, reads the verdict and acts on it:

- a failure (or a probe that found dead ranks): `hypergrid.binding.alarm.sound`
  ends every grid wait of its rank with ``RankFailure`` naming the dead, and
  the callbacks registered with `Watcher.on_failure` run (``shrink`` uses them
  to end its own waits in a world being formed);
- its own rank declared dead, or on the minority side, or the incident gone
  (the others moved on without it): `hypergrid.binding.alarm.fence`.

`Watcher.report` is what a rank calls when it sees a failure (or, with
``probe``, when a wait lasts too long): it opens the current incident and
returns the verdict. Nothing runs on a healthy step: the thread is blocked in
one ``wait``, which never times out (torch logs each store wait that does).
A stopped watcher (its rank left the world) ends when the world's current
incident is called, or with its process: ``shrink`` wakes the watchers of the
worlds it leaves with `pulse_end`, which writes the call key and deletes it.

A watcher starts with the first grid of a world (`ensure_watching`, called by
``HyperCommGrid``) when the world has more than one rank, a backend other than
torch's ``fake``, a store that can open a second connection (``Store.clone``)
and ``HYPERGRID_WATCH`` is not ``0``.
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch.distributed as dist

from hypergrid.agreement import connections, diagnosis
from hypergrid.agreement.liveness import END, PROBE, Incident, Verdict, bound_s, end_text, incident_prefix
from hypergrid.binding import alarm
from hypergrid.binding.failures import abort_world_groups
from hypergrid.binding.reform import current_epoch
from hypergrid.binding.worldstate import PerWorld

__all__ = ["Watcher", "current_watcher", "ensure_watching", "watching_enabled"]

LOGGER = logging.getLogger("hypergrid")

#: How long one ``wait`` of the watcher lasts (a week: in practice, until the key is written).
SLICE_S = 7 * 24 * 3600.0
#: How long past the roll call's bound a reporter waits for its watcher's verdict.
_GRACE_S = 2.0

_worlds = PerWorld()  # the current world's watcher, under "watcher"


def watching_enabled() -> bool:
    """Whether ``HYPERGRID_WATCH`` allows watchers (anything but ``0``, the default on).

    Examples:
        >>> watching_enabled() in (True, False)
        True
    """
    return os.environ.get("HYPERGRID_WATCH", "1") != "0"


class Watcher:
    """The watcher of one rank in one world (see the module's docstring).

    Args:
        store: a store connection for the watcher's thread alone (``Store.clone()`` of the world's base store).
        side: a second connection, for short calls from any thread (`report`, probes, failing a barrier).
        world: the world's epoch number (0: the job's first world).
        rank: this rank in that world.
        size: the world's size.
        liveness_s: how long live ranks have to answer (default: `hypergrid.agreement.liveness.LIVENESS_S`).
        slice_s: how long one ``wait`` lasts before the stop flag is looked at again.
        on_fence: what fencing this rank does (default: `hypergrid.binding.alarm.fence`, for the whole process).
    """

    def __init__(
        self,
        store: Any,
        side: Any,
        world: int,
        rank: int,
        size: int,
        liveness_s: float | None = None,
        slice_s: float = SLICE_S,
        on_fence: Callable[[str], None] = alarm.fence,
    ) -> None:
        self.store = store
        self.side = side
        self.world = world
        self.rank = rank
        self.expected: list[int] = list(range(size))
        self.dead: list[int] = []
        self.liveness_s = liveness_s
        self.slice_s = slice_s
        self.on_fence = on_fence
        self.number = 0  # the incident the thread waits on (or is handling)
        self._answered = -1  # the last incident it answered (a report never writes into one it did)
        self.end_dead: tuple[int, ...] | None = None  # the dead the world's end named, once read
        self.verdicts: dict[int, Verdict] = {}
        self.failure: Verdict | None = None  # the first verdict that failed the world
        self.fenced = False
        self.stopped = False
        self._callbacks: list[Callable[[Verdict], None]] = []
        self._changed = threading.Condition()
        self._thread = threading.Thread(target=self._run, name=f"hypergrid-watcher-{world}-{rank}", daemon=True)

    # -- life ------------------------------------------------------------------

    def start(self) -> Watcher:
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop answering (this rank leaves the world); the thread ends at its next wake-up."""
        with self._changed:
            self.stopped = True
            self._changed.notify_all()

    def join(self, timeout_s: float) -> bool:
        """Wait until the (stopped) thread ended; whether it did within ``timeout_s``.

        A thread still blocked in the store when the process exits is harmless,
        unless its key is written while the interpreter finalizes: the thread
        then wakes into a torch frame that cannot unwind, and the process ends
        with ``std::terminate``. A rank that leaves a world with the others
        (``shrink``) therefore waits here until the world's end pulse woke it.
        """
        self._thread.join(timeout_s)
        return not self._thread.is_alive()

    def leave(self) -> None:
        """This rank's process ends normally: say so (it is not dead), then stop."""
        if self.stopped or self.fenced:
            return
        self.stop()
        with contextlib.suppress(RuntimeError):  # the store is gone already: the job is over
            Incident(self.side, incident_prefix(self.world, 0), self.rank, self.expected).leave()

    def end_world(self, dead: Sequence[int], size: int) -> None:
        """This rank's world of ``size`` ranks ended (``shrink`` moved its live ranks on, ``dead`` left behind).

        Writes the end (`hypergrid.agreement.liveness.end_text`) as the call
        of the incident every live watcher waits on, after any probe still
        open there: each reads it and stops, the last deletes it; a rank that
        ``dead`` names (alive, but excluded) fences itself. Every survivor may
        call it: the first write counts.
        """
        text = end_text(dead, size)
        while True:
            with self._changed:
                if self.stopped or self.fenced:
                    return
                number = self.number
                current = b""
                if self._answered < number:  # (as in `report`: never into an incident the others finished)
                    try:
                        current = self.side.compare_set(f"{incident_prefix(self.world, number)}/call", "", text)
                    except RuntimeError:  # the store is gone
                        return
            if current.startswith(END.encode()):
                return
            deadline = time.monotonic() + bound_s(len(self.expected), self.liveness_s) + _GRACE_S
            if self._await(number, deadline) is None:  # a probe holds this incident: its verdict, then the next
                return

    def pulse_end(self) -> None:
        """This rank left the world with the others (``shrink``): wake the world's stopped watchers, leave no key.

        Writes the call key of the incident they wait on and deletes it at once:
        a watcher that was stopped ends; one that was not (a rank the others
        excluded, still waiting) finds the call gone and fences its rank.
        """
        self.stop()
        key, text = f"{incident_prefix(self.world, self.number)}/call", end_text([], 0)
        with contextlib.suppress(RuntimeError):  # the store is gone: nobody is left to wake
            if self.side.compare_set(key, "", text) == text.encode():
                self.side.delete_key(key)

    def on_failure(self, callback: Callable[[Verdict], None]) -> None:
        """Run ``callback(verdict)`` (on the watcher's thread) when the world fails; at once if it already did."""
        with self._changed:
            failed = self.failure
            if failed is None:
                self._callbacks.append(callback)
        if failed is not None:
            callback(failed)

    # -- the thread --------------------------------------------------------------

    def _run(self) -> None:
        try:
            while not self.stopped:
                prefix = incident_prefix(self.world, self.number)
                if not diagnosis.wait_for(self.store, f"{prefix}/call", time.monotonic() + self.slice_s):
                    continue
                if self.stopped:
                    break
                if not self._handle(prefix):
                    break
        except RuntimeError as error:  # the store is gone: the job is over (or this rank is cut off)
            if not self.stopped:
                LOGGER.debug("hypergrid watcher of world %s rank %s stops: %s", self.world, self.rank, error)

    def _handle(self, prefix: str) -> bool:
        """Answer one incident and act on its verdict; False once this rank is out (fenced) or the world ended."""
        seen = time.monotonic()
        incident = Incident(self.store, prefix, self.rank, list(self.expected))
        with self._changed:  # from here on a report joins this incident or calls the next
            self._answered = self.number
        call = incident.answer()
        if call is not None and call.startswith(END):
            dead = incident.read_end(call)
            with self._changed:
                self.end_dead = dead
            if self.rank in dead:
                self._fence(f"world {self.world} ended without this rank (declared dead)")
            else:
                self.stop()
            return False
        verdict = None if call is None else incident.close(call, seen + bound_s(len(self.expected), self.liveness_s))
        if verdict is None:
            self._fence(
                f"world {self.world} went on without this rank (incident {self.number} ended without its answer)"
            )
            return False
        incident.conclude(verdict)
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
            self._changed.notify_all()
        if verdict.excludes(self.rank):
            side = "on the minority side" if verdict.kind == "minority" else "declared dead"
            self._fence(f"{side} in world {self.world}'s roll call ({verdict.text})")
            return False
        for callback in callbacks:
            callback(self.failure)  # type: ignore[arg-type]  # set above whenever callbacks were taken
        return True

    def _fence(self, reason: str) -> None:
        with self._changed:
            self.fenced = True
            self._changed.notify_all()
        self.on_fence(reason)

    # -- reporting ----------------------------------------------------------------

    def report(self, kind: str, text: str) -> Verdict | None:
        """Call a roll call now (``"failure"`` or ``"probe"``); its verdict, with every rank found dead so far.

        The incident the watcher waits on is called (or joined, if another
        rank called it first); a failure that meets another rank's probe which
        failed nothing calls the next one. The verdict's ``dead`` holds every
        rank of the world found dead up to it. None when no verdict came in
        time (the watcher stopped, or this rank was fenced:
        `hypergrid.binding.alarm` says which).
        """
        while True:
            with self._changed:
                if self.fenced or self.stopped:
                    return None
                number = self.number
                # Called while the watcher has not answered it, the incident cannot be over (its end needs this
                # rank's answer), so the call never writes into an incident the others finished and deleted.
                if self._answered < number:
                    Incident(self.side, incident_prefix(self.world, number), self.rank, ()).call(kind, text)
            deadline = time.monotonic() + bound_s(len(self.expected), self.liveness_s) + _GRACE_S
            verdict = self._await(number, deadline)
            if verdict is None:
                return None
            if kind == PROBE or verdict.failed:
                with self._changed:
                    return Verdict(verdict.kind, tuple(self.dead), verdict.text)

    def _await(self, number: int, deadline: float) -> Verdict | None:
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


def current_watcher() -> Watcher | None:
    """The current world's watcher on this rank, if one runs."""
    found: Watcher | None = _worlds.get().get("watcher")
    return found


def start_watcher(world: int, rank: int, size: int, base_store: Any) -> Watcher | None:
    """A watcher for ``rank`` of world ``world`` of ``size`` ranks over ``base_store``; None where it cannot run."""
    if size < 2 or not watching_enabled():
        return None
    try:
        store, side = connections.take(base_store, 2)  # prepared in the background: a connect can take seconds
    except (RuntimeError, AttributeError):  # a store that cannot open a second connection (torch's FakeStore)
        return None
    return Watcher(store, side, world, rank, size).start()


def adopt(watcher: Watcher | None) -> None:
    """Make ``watcher`` the current world's (it answers for it, sounds its alarm and fences its rank)."""
    state = _worlds.get()
    previous: Watcher | None = state.get("watcher")
    if previous is not None and previous is not watcher:
        previous.stop()
    state["watcher"] = watcher
    alarm.install(None if watcher is None else watcher.alarm_reporter)
    if watcher is not None:
        watcher.on_failure(_world_failed)
        atexit.register(watcher.leave)
        _collect_at_exit()


def _world_failed(verdict: Verdict) -> None:
    """The current world failed: end every pending operation of this rank, then every grid wait."""
    abort_world_groups()
    alarm.sound(verdict.dead, verdict.text)


def _collect_at_exit() -> None:
    """Collect garbage at interpreter exit, once: before finalization, not during it.

    A failure leaves reference cycles (an exception's frames) that hold torch's
    communication objects; destroyed during finalization, a gloo work whose
    peer died can end the process with ``std::terminate`` (seen on a retired
    rank that exits right after ``shrink``); collected here, they go quietly.
    """
    if not _worlds_exit["registered"]:
        _worlds_exit["registered"] = True
        atexit.register(gc.collect)


_worlds_exit = {"registered": False}


def ensure_watching() -> Watcher | None:
    """Start this rank's watcher for the current world, once (see the module's docstring); it, or None."""
    if not (dist.is_available() and dist.is_initialized()):
        return None
    state = _worlds.get()
    if "watcher" in state:
        found: Watcher | None = state["watcher"]
        return found
    if dist.get_backend() == "fake":
        state["watcher"] = None
        return None
    epoch = current_epoch()
    watcher = start_watcher(epoch.number, dist.get_rank(), dist.get_world_size(), epoch.base_store)
    adopt(watcher)
    return watcher


def stop_watching() -> None:
    """Stop the current world's watcher on this rank (it leaves the world)."""
    state = _worlds.get()
    watcher: Watcher | None = state.get("watcher")
    if watcher is not None:
        watcher.stop()
    with contextlib.suppress(KeyError):
        del state["watcher"]
    alarm.install(None)
