"""Waiting for torch's works while listening to the alarm: every grid wait ends when the world fails.

`wait` waits for one work until it completes or this rank learns that its world failed
(`hypergrid.binding.alarm`), whichever comes first; a wait that lasts the probe (``HYPERGRID_PROBE_S``, from the
alarm's `hypergrid.timing.Timing`), then twice as long, and so on, asks for a roll call. gloo's point-to-point works
have no future: the caller blocks in torch's ``wait()`` (`wait_all`), one thread per world (`_Sentry`) asks for the
roll call when such a wait lasts, and the world's failure severs their connections
(`hypergrid.binding.failures.abort_groups`). Why: docs/design/recovery.md ("What the verdict does").
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

from hypergrid.binding.alarm import Alarm, Job
from hypergrid.errors import HyperGridError

__all__ = ["abandoned", "wait", "wait_all"]


def wait(alarm: Alarm | None, work: Any, what: str, stream: bool = False) -> None:
    """Wait for torch's ``work``; return early with ``RankFailure`` if ``alarm``'s world fails meanwhile.

    Without a watcher (no alarm, a world of one, the fake backend) it is ``work.wait()``. With ``stream=True`` (tensors
    on an accelerator: NCCL) it is ``work.wait()`` between two checks too: there ``wait`` only orders the current stream
    after the collective and never blocks the host, so waiting on the host for the work's future would stall every step;
    a failed world is ended by aborting its communicators instead (`hypergrid.binding.failures.abort_groups`). A work
    without a future is waited on as `wait_all` says. torch's error, if the work failed, propagates as torch raised it.
    """
    if alarm is None or not alarm.watched() or stream:
        if alarm is not None:
            alarm.check(what)
        work.wait()
        if alarm is not None:
            alarm.check(what)
        return
    alarm.check(what)
    try:
        future = work.get_future()
    except RuntimeError:  # a work without a future: blocked on here, a lasting wait probed by the sentry
        wait_all(alarm, [work], what)
        return
    woken = threading.Event()
    future.add_done_callback(lambda _: woken.set())
    _listen(alarm, woken, what)
    if not future.done():
        alarm.job.abandoned.append(work)  # torch still runs it: its group must outlive it (failures.abort_groups)
        alarm.check(what)
    work.wait()


def wait_all(alarm: Alarm | None, works: Sequence[Any], what: str) -> None:
    """Wait for every work of ``works`` (point-to-point ones, say) as `wait` does.

    A work without a future is waited on by this thread itself, in torch's blocking ``wait()`` (nothing added to a
    healthy step but two attribute writes), while the world's `_Sentry` watches the clock (see the module's
    docstring); once the world failed and its connections are severed, the blocked wait raises, and
    `hypergrid.binding.failures` turns torch's error into ``RankFailure`` naming the dead.
    """
    if alarm is not None:
        alarm.check(what)
    plain = []
    for work in works:
        try:
            work.get_future()
        except RuntimeError:
            plain.append(work)
            continue
        wait(alarm, work, what)
    if not plain:
        return
    if alarm is None or not alarm.watched():
        for work in plain:
            work.wait()
        return
    with alarm.job.lock:
        if alarm.sentry is None:
            alarm.sentry = _Sentry(alarm)
            alarm.sentry.start()  # once it is the world's: its thread runs while the world is watched
        sentry: _Sentry = alarm.sentry
    with sentry.watching(what):
        for work in plain:
            work.wait()


class _Sentry:
    """While a blocking wait lasts, asks for a roll call after the probe (then twice as long, and so on).

    One thread per world, started by the world's first wait without a future; it looks at the clock every quarter of
    the probe (never on a healthy step's path) and ends once its world is no longer watched (closed).
    """

    def __init__(self, alarm: Alarm) -> None:
        self.alarm = alarm
        self.current: list[Any] | None = None  # [what, started, next probe at, interval] of the wait in progress

    def start(self) -> None:
        """Start the thread; it ends once its world's alarm is no longer watched (`Alarm.watched`)."""
        threading.Thread(target=self._run, name="hypergrid-p2p-sentry", daemon=True).start()

    @contextlib.contextmanager
    def watching(self, what: str) -> Iterator[None]:
        now = time.monotonic()
        interval = self.alarm.timing.probe_s
        self.current = [what, now, now + interval, interval]
        try:
            yield
        finally:
            self.current = None

    def _run(self) -> None:
        tick = max(self.alarm.timing.probe_s / 4, self.alarm.timing.poll_s)
        while self.alarm.sentry is self and self.alarm.watched():
            time.sleep(tick)
            current = self.current
            if current is None or time.monotonic() < current[2] or self.alarm.pending(current[0]) is not None:
                continue
            current[3] *= 2
            current[2] = time.monotonic() + current[3]
            with contextlib.suppress(HyperGridError, RuntimeError):  # the waiting thread meets the error itself
                self.alarm.probe(current[0], f"{current[0]} waited {time.monotonic() - current[1]:.0f} s")


def _listen(alarm: Alarm, woken: threading.Event, what: str) -> None:
    """Block until ``woken`` is set (the work ended) or the world fails; a wait that lasts asks for a roll call."""
    with alarm.waking(woken):
        waited, probe_after = 0.0, alarm.timing.probe_s
        while alarm.pending(what) is None and not woken.wait(probe_after):
            waited += probe_after
            alarm.probe(what, f"{what} waited {waited:g} s")  # is a peer gone (stopped, cut off)? Then it ends
            probe_after *= 2


def abandoned(job: Job) -> list[Any]:
    """The works still running that a grid wait of ``job`` gave up on (completed ones are dropped here)."""
    job.abandoned[:] = [work for work in job.abandoned if not work.is_completed()]
    return list(job.abandoned)
