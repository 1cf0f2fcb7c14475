"""What this rank knows of failures in its world: the alarm that ends every grid wait at once.

The grid's communication calls wait here (`wait`): until the torch work
completes, or until this rank learns that its world failed, whichever comes
first. A wait that lasts `PROBE_S` (then twice as long, and so on) asks for
a roll call: a peer that is stopped or cut off, which no connection error
reveals, is found then rather than at the group's timeout. The news comes from this rank's watcher
(`hypergrid.agreement.watcher`): one thread per rank, blocked on one store key,
which runs the roll call when another rank reports a failure and then calls
`sound` with the ranks that did not answer. Every wait of the grid then ends
with ``RankFailure`` naming them; torch's own operation is left behind (a gloo
collective cannot be interrupted: it ends when its peer's connection closes
or at its timeout, and the group is aborted by ``shrink``).

A rank that the others declared dead (it answered no roll call in time: it was
stopped, or cut off) is *fenced* (`fence`): from then on every grid call
raises ``FencedError``; it never rejoins. The fence outlives the world; the
failure news belongs to one world (a new default group starts clean).

The job's store dying (the process hosting it, rank 0 under a plain
``env://`` launch or the launcher's agent) is news for good as well
(`lose_store`): every grid call and wait from then on raises
``StoreLostError`` carrying torch's error, whether the watcher's thread met
the loss or a store call of the main thread did (`store_calls`).

The layer below the watcher: ops and the grid import this module, the
watcher installs itself here (`install`), so nothing imports upward.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from hypergrid.binding.worldstate import WORLDS
from hypergrid.errors import FencedError, HyperGridError, RankFailure, StoreLostError
from hypergrid.values import format_ranks

__all__ = [
    "News",
    "abandoned",
    "check",
    "check_fence",
    "failure",
    "fence",
    "fenced",
    "install",
    "is_store_loss",
    "lose_store",
    "news",
    "sound",
    "store_calls",
    "store_lost",
    "wait",
]

#: ``report(kind, text)``: call a roll call of the whole world, ``"failure"`` (this rank saw one) or
#: ``"probe"`` (a wait lasts long), and return the dead ranks it found (None when no verdict came in
#: time). Installed by the watcher of the current world.
Reporter = Callable[[str, str], "Sequence[int] | None"]

#: How long a grid wait lasts before this rank asks for a roll call (``HYPERGRID_PROBE_S``, default 30 s);
#: the next after twice as long, and so on. A stopped or cut-off peer is found then, not at the group timeout.
PROBE_S = float(os.environ.get("HYPERGRID_PROBE_S", "30"))


@dataclass(frozen=True)
class News:
    """A failure of the current world, as the roll call settled it."""

    dead: tuple[int, ...]
    reason: str


def install(reporter: Reporter | None) -> None:
    """Set (or clear, with None) the current world's reporter: the watcher does, when it starts."""
    WORLDS.state().alarm["reporter"] = reporter


def news() -> News | None:
    """The current world's failure, once the roll call settled it; else None."""
    found: News | None = WORLDS.state().alarm["news"]
    return found


def fenced() -> str | None:
    """Why this rank was fenced (declared dead by the others), or None."""
    return WORLDS.fence


def sound(dead: Sequence[int], reason: str) -> None:
    """The current world failed (``dead`` did not answer the roll call): end every grid wait at once."""
    data = WORLDS.state().alarm
    with WORLDS.alarm_lock:
        if data["news"] is None:
            data["news"] = News(tuple(sorted(dead)), reason)
        waiters = list(data["waiters"])
    for event in waiters:
        event.set()


def fence(reason: str) -> None:
    """This rank was declared dead by the others: every grid call from now on raises ``FencedError``."""
    with WORLDS.alarm_lock:
        if WORLDS.fence is None:
            WORLDS.fence = reason
    sound((), reason)


def _fenced_error(what: str) -> FencedError:
    return FencedError(
        f"{what}: this rank was excluded by the others ({WORLDS.fence}); it cannot take part in the job any more "
        "(its grid and groups are gone for it): exit, and let the launcher start a new process if one is needed"
    )


def check_fence(what: str) -> None:
    """Raise ``FencedError`` on a fenced rank; else nothing (failure news does not count here)."""
    if WORLDS.fence is not None:
        raise _fenced_error(what)


def is_store_loss(error: BaseException) -> bool:
    """Whether torch's ``error`` says the connection to the job's store is gone (not a slow or missing key).

    torch raises ``DistNetworkError`` when the store's socket closes under a
    call ("Failed to recv, got 0 bytes", "Connection reset by peer", "Broken
    pipe"); a wait that times out is a ``DistStoreError``, which is not a loss.

    Examples:
        >>> import torch.distributed as dist
        >>> is_store_loss(dist.DistNetworkError("Failed to recv, got 0 bytes")), is_store_loss(ValueError("x"))
        (True, False)
    """
    import torch.distributed as dist  # (torch is imported by then: only torch's stores raise these)

    return isinstance(error, dist.DistNetworkError)


def lose_store(error: BaseException) -> None:
    """The job's store is gone (``error``: torch's): every grid wait ends, every grid call raises from now on."""
    with WORLDS.alarm_lock:
        if WORLDS.store_lost is None:
            WORLDS.store_lost = error
    sound((), "the job's store is gone")


def store_lost(what: str) -> StoreLostError | None:
    """The ``StoreLostError`` for ``what`` once the job's store is known gone (its ``__cause__``: torch's error)."""
    cause = WORLDS.store_lost
    if cause is None:
        return None
    said = str(cause).strip().splitlines()[0] if str(cause).strip() else type(cause).__name__
    error = StoreLostError(
        f"{what} failed: the job's store is gone ({type(cause).__name__}: {said}); its host (rank 0 under a plain "
        "env:// launch, else the launcher's agent) died or was cut off, so no rank can agree, recover or re-form a "
        "world: exit, and restart the job from its last checkpoint"
    )
    error.__cause__ = cause
    return error


@contextlib.contextmanager
def store_calls(what: str) -> Iterator[None]:
    """Run hypergrid's store calls of ``what``; torch's error for a lost store becomes ``StoreLostError``.

    Examples:
        >>> with store_calls("a guard round"):
        ...     pass
    """
    try:
        yield
    except RuntimeError as error:
        if isinstance(error, HyperGridError) or not is_store_loss(error):
            raise
        lose_store(error)
        raise (store_lost(what) or StoreLostError(f"{what} failed: the job's store is gone")) from error


def check(what: str) -> None:
    """Raise ``StoreLostError`` once the store is gone, ``FencedError`` on a fenced rank, ``RankFailure`` once the
    current world failed; else nothing."""
    lost = store_lost(what)
    if lost is not None:
        raise lost
    if WORLDS.fence is not None:
        raise _fenced_error(what)
    found = news()
    if found is not None:
        raise _failure_of(what, found)


def _failure_of(what: str, found: News) -> RankFailure:
    who = f"rank(s) {format_ranks(list(found.dead))} stopped answering" if found.dead else "a peer reported a failure"
    return RankFailure(
        f"{what} failed: {who} ({found.reason}); catch RankFailure and call grid.shrink() on every survivor to "
        "carry on",
        list(found.dead),
    )


def failure(what: str, said: str, dead: Sequence[int] = ()) -> HyperGridError:
    """The ``RankFailure`` for a torch error this rank saw; first reported to the world (roll call) if it can be.

    With a watcher installed the failure is reported (every rank's waits end)
    and the roll call names the dead; without one, ``dead`` as given.
    """
    data = WORLDS.state().alarm
    reporter: Reporter | None = data["reporter"]
    if WORLDS.fence is None and data["news"] is None and reporter is not None:
        try:
            with store_calls(what):
                found = reporter("failure", f"{what}: {said}")
        except StoreLostError as gone:
            return gone
        if found is not None:
            sound(found, f"{what}: {said}")
    lost = store_lost(what)
    if lost is not None:
        return lost
    if WORLDS.fence is not None:
        return _fenced_error(what)
    known = news()
    if known is not None:
        return _failure_of(what, known)
    return RankFailure(
        f"{what} failed: a peer is gone ({said}); catch RankFailure and call grid.shrink() on every survivor to "
        "carry on",
        list(dead),
    )


def wait(work: Any, what: str, stream: bool = False) -> None:
    """Wait for torch's ``work``; return early with ``RankFailure`` if the world fails meanwhile.

    Without a watcher (a world of one, the fake backend) it is ``work.wait()``.
    With ``stream=True`` (tensors on an accelerator: NCCL) it is ``work.wait()``
    between two checks too: there ``wait`` only orders the current stream after
    the collective and never blocks the host, so waiting on the host for the
    work's future would stall every step; a failed world is ended by aborting
    its communicators instead (`hypergrid.binding.failures.abort_world_groups`).
    torch's error, if the work failed, propagates as torch raised it.
    """
    check(what)
    data = WORLDS.state().alarm
    if data["reporter"] is None or stream:
        work.wait()
        check(what)
        return
    try:
        future = work.get_future()
    except RuntimeError:  # a work without a future (some point-to-point works): a plain wait
        work.wait()
        return
    event = threading.Event()
    with WORLDS.alarm_lock:
        data["waiters"].add(event)
    try:
        future.add_done_callback(lambda _: event.set())
        waited, probe_after = 0.0, PROBE_S
        while data["news"] is None and WORLDS.fence is None and not event.wait(probe_after):
            waited += probe_after
            reporter = data["reporter"]
            if reporter is not None:  # this wait lasts: is a peer gone (stopped, cut off)? The answer ends it if so
                with store_calls(what):
                    reporter("probe", f"{what} waited {waited:g} s")
            probe_after *= 2
    finally:
        with WORLDS.alarm_lock:
            data["waiters"].discard(event)
    if not future.done():
        WORLDS.abandoned.append(work)  # torch still runs it: its group must outlive it (binding.failures.abort_groups)
        check(what)
    work.wait()


def abandoned() -> list[Any]:
    """The works still running that a grid wait gave up on (completed ones are dropped here)."""
    WORLDS.abandoned[:] = [work for work in WORLDS.abandoned if not work.is_completed()]
    return list(WORLDS.abandoned)
