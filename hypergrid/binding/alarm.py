"""What this rank knows of failures in its world: the alarm that ends every grid wait at once.

The grid's communication calls wait on what this module knows
(`hypergrid.binding.waiting`): until the torch work completes, or until
this rank learns that its world failed, whichever comes first; a wait that
lasts asks for a roll call (`probe`). The news comes from this rank's watcher
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

Waits that are not torch works listen too (`listening`): a guard round, a
commit barrier, registers what ends its wait (a verdict written into the key
it blocks on), and the alarm runs it when the world fails. Once the
world failed, every check first asks whether the others ended it without this
rank (``excluded``, installed with the reporter): a rank stopped through the
others' whole shrink learns it on its first call after it resumes, and raises
``FencedError``.

The layer below the watcher: ops and the grid import this module, the
watcher installs itself here (`install`), so nothing imports upward.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator, Sequence

from hypergrid.binding.worldstate import WORLDS, Excluded, News, Reporter
from hypergrid.errors import FencedError, HyperGridError, RankFailure, StoreLostError
from hypergrid.values import format_ranks

__all__ = [
    "News",
    "check",
    "check_fence",
    "failure",
    "fence",
    "fenced",
    "install",
    "is_store_loss",
    "listening",
    "lose_store",
    "news",
    "pending",
    "probe",
    "sound",
    "store_calls",
    "store_lost",
    "waking",
    "watched",
]


def install(reporter: Reporter | None, excluded: Excluded | None = None) -> None:
    """Set (or clear, with None) the current world's reporter and exclusion check: the watcher does, when it starts."""
    state = WORLDS.state().alarm
    state.reporter, state.excluded = reporter, excluded


def news() -> News | None:
    """The current world's failure, once the roll call settled it; else None."""
    return WORLDS.state().alarm.news


def fenced() -> str | None:
    """Why this rank was fenced (declared dead by the others), or None."""
    return WORLDS.fence


def sound(dead: Sequence[int], reason: str) -> None:
    """The current world failed (``dead`` did not answer the roll call): end every grid wait at once."""
    state = WORLDS.state().alarm
    with WORLDS.alarm_lock:
        if state.news is None:
            state.news = News(tuple(sorted(dead)), reason)
        waiters, listeners = list(state.waiters), list(state.listeners)
    for event in waiters:
        event.set()
    for listener in listeners:
        with contextlib.suppress(RuntimeError):  # the store is gone: its waits end with the loss
            listener()


@contextlib.contextmanager
def listening(on_news: Callable[[], object]) -> Iterator[None]:
    """While inside, run ``on_news()`` when the current world fails (at once if it already has).

    For a wait that blocks on a store key: ``on_news`` writes into that key
    what ends the wait (a failure verdict, with ``compare_set``: the first
    outcome written stands), through a connection of its own (it runs on the
    thread that heard the news, usually the watcher's). It may run more than
    once (a fence after the failure), and must not raise but a store's error.

    Examples:
        >>> with listening(lambda: None):
        ...     pass
    """
    state = WORLDS.state().alarm
    with WORLDS.alarm_lock:
        state.listeners.append(on_news)
        sounded = state.news is not None
    try:
        if sounded:
            with contextlib.suppress(RuntimeError):
                on_news()
        yield
    finally:
        with WORLDS.alarm_lock:
            state.listeners[:] = [listener for listener in state.listeners if listener is not on_news]


@contextlib.contextmanager
def waking(event: threading.Event) -> Iterator[None]:
    """While inside, the world's failure sets ``event`` (a thread that waits on it wakes at once)."""
    state = WORLDS.state().alarm
    with WORLDS.alarm_lock:
        state.waiters.add(event)
    try:
        yield
    finally:
        with WORLDS.alarm_lock:
            state.waiters.discard(event)


def watched() -> bool:
    """Whether a watcher reports for the current world (else waits are plain: a world of one, the fake backend)."""
    return WORLDS.state().alarm.reporter is not None


def probe(what: str, text: str) -> None:
    """A wait of ``what`` lasts: ask for a roll call (a peer found gone sounds the alarm); nothing without a watcher."""
    reporter = WORLDS.state().alarm.reporter
    if reporter is not None:
        with store_calls(what):
            reporter("probe", text)


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
    """Raise ``FencedError`` on a fenced rank (or one the others left behind); else nothing (news does not count)."""
    _confirm(what)
    if WORLDS.fence is not None:
        raise _fenced_error(what)


def _confirm(what: str) -> None:
    """The world failed: ask whether the others ended it without this rank (which fences it); else nothing.

    One store read, on failure paths only: a rank stopped (or cut off)
    through the others' whole shrink learns here, on its first call, that it
    was left behind, whatever its watcher has read by then.
    """
    state = WORLDS.state().alarm
    excluded = state.excluded
    if excluded is not None and state.news is not None and WORLDS.fence is None and WORLDS.store_lost is None:
        with store_calls(what):
            excluded()


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
    if WORLDS.fence is None and news() is None:
        return  # the healthy path: no store call
    _confirm(what)
    if WORLDS.fence is not None:
        raise _fenced_error(what)
    found = news()
    if found is not None:
        raise _failure_of(what, found)


def pending(what: str) -> HyperGridError | None:
    """The error `check` would raise for ``what`` now (no store call), or None.

    Examples:
        >>> pending("a wait") is None or True
        True
    """
    lost = store_lost(what)
    if lost is not None:
        return lost
    if WORLDS.fence is not None:
        return _fenced_error(what)
    found = news()
    return None if found is None else _failure_of(what, found)


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
    state = WORLDS.state().alarm
    reporter = state.reporter
    if WORLDS.fence is None and state.news is None and reporter is not None:
        try:
            with store_calls(what):
                found = reporter("failure", f"{what}: {said}")
        except StoreLostError as gone:
            return gone
        if found is not None:
            sound(found, f"{what}: {said}")
    try:
        _confirm(what)
    except StoreLostError as gone:
        return gone
    known = pending(what)
    if known is not None:
        return known
    return RankFailure(
        f"{what} failed: a peer is gone ({said}); catch RankFailure and call grid.shrink() on every survivor to "
        "carry on",
        list(dead),
    )
