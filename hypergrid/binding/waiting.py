"""Waiting for torch's works while listening to the alarm: every grid wait ends when the world fails.

`wait` waits for one work until it completes or this rank learns that its
world failed (`hypergrid.binding.alarm`), whichever comes first. A wait
that lasts `PROBE_S` (then twice as long, and so on) asks for a roll call: a
peer that is stopped or cut off, which no connection error reveals, is found
then rather than at the group's timeout.

A work with a future (a gloo or NCCL collective) wakes the wait through the
future. gloo's point-to-point works have none: their ``is_completed()`` never
turns true, even after the data arrived, and a ``wait(timeout)`` that
expires closes the connection (torch 2.13). Those are waited on by a thread
of their own (`wait_all`), one per batch, whose end wakes the caller; the
caller meanwhile listens and probes as for a collective. A world that fails
severs its gloo connections (`hypergrid.binding.failures.abort_world_groups`),
so such a thread ends then too.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from typing import Any

from hypergrid.binding import alarm
from hypergrid.binding.worldstate import WORLDS

__all__ = ["PROBE_S", "abandoned", "wait", "wait_all"]

#: How long a grid wait lasts before this rank asks for a roll call (``HYPERGRID_PROBE_S``, default 30 s);
#: the next after twice as long, and so on. A stopped or cut-off peer is found then, not at the group timeout.
PROBE_S = float(os.environ.get("HYPERGRID_PROBE_S", "30"))


def wait(work: Any, what: str, stream: bool = False) -> None:
    """Wait for torch's ``work``; return early with ``RankFailure`` if the world fails meanwhile.

    Without a watcher (a world of one, the fake backend) it is ``work.wait()``.
    With ``stream=True`` (tensors on an accelerator: NCCL) it is ``work.wait()``
    between two checks too: there ``wait`` only orders the current stream after
    the collective and never blocks the host, so waiting on the host for the
    work's future would stall every step; a failed world is ended by aborting
    its communicators instead (`hypergrid.binding.failures.abort_world_groups`).
    A work without a future (gloo's point-to-point works: their
    ``is_completed()`` never turns true, and a timed ``wait`` closes the
    connection) is waited on by a thread of its own (`wait_all`).
    torch's error, if the work failed, propagates as torch raised it.
    """
    alarm.check(what)
    if not alarm.watched() or stream:
        work.wait()
        alarm.check(what)
        return
    try:
        future = work.get_future()
    except RuntimeError:  # a work without a future: waited on by a thread
        wait_all([work], what)
        return
    woken = threading.Event()
    future.add_done_callback(lambda _: woken.set())
    _listen(woken, what)
    if not future.done():
        WORLDS.abandoned.append(work)  # torch still runs it: its group must outlive it (binding.failures.abort_groups)
        alarm.check(what)
    work.wait()


def wait_all(works: Sequence[Any], what: str) -> None:
    """Wait for every work of ``works`` (point-to-point ones, say) as `wait` does, in one listening wait.

    The works without a future are waited on, in order, by one thread of
    their own (`_Waiter`), while this thread listens: a peer stopped or cut
    off is probed, and the world's failure ends the wait with ``RankFailure``,
    as in a collective. The thread ends with its works (a failed world's
    connections are severed, so they end then too).
    """
    alarm.check(what)
    plain = []
    for work in works:
        try:
            work.get_future()
        except RuntimeError:
            plain.append(work)
            continue
        wait(work, what)
    if not plain:
        return
    if not alarm.watched():
        for work in plain:
            work.wait()
        alarm.check(what)
        return
    waiter = _Waiter(plain)
    _listen(waiter.woken, what)
    if not waiter.is_completed():
        WORLDS.abandoned.append(waiter)
        alarm.check(what)
    if waiter.error is not None:
        raise waiter.error


class _Waiter:
    """torch's blocking ``wait()`` of works without a future, on a thread: ``woken`` is set once they ended."""

    def __init__(self, works: Sequence[Any]) -> None:
        self.works = works
        self.woken = threading.Event()
        self.error: Exception | None = None
        self._ended = threading.Event()
        threading.Thread(target=self._run, name="hypergrid-p2p-wait", daemon=True).start()

    def _run(self) -> None:
        try:
            for work in self.works:
                work.wait()
        except Exception as error:  # torch's: raised on the caller's thread
            self.error = error
        finally:
            self._ended.set()
            self.woken.set()

    def is_completed(self) -> bool:
        return self._ended.is_set()


def _listen(woken: threading.Event, what: str) -> None:
    """Block until ``woken`` is set (the work ended) or the world fails; a wait that lasts asks for a roll call."""
    with alarm.waking(woken):
        waited, probe_after = 0.0, PROBE_S
        while alarm.pending(what) is None and not woken.wait(probe_after):
            waited += probe_after
            alarm.probe(what, f"{what} waited {waited:g} s")  # is a peer gone (stopped, cut off)? Then it ends
            probe_after *= 2


def abandoned() -> list[Any]:
    """The works still running that a grid wait gave up on (completed ones are dropped here)."""
    WORLDS.abandoned[:] = [work for work in WORLDS.abandoned if not work.is_completed()]
    return list(WORLDS.abandoned)
