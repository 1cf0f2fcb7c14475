"""What this rank knows of failures in one world: its `Alarm`, held by the world (`hypergrid.agreement.world`).

The grid's waits (`hypergrid.binding.waiting`) end when torch's work completes or when the alarm learns that the
world failed: the world's watcher (`hypergrid.agreement.watcher`) calls `Alarm.sound` with the ranks that did not
answer, and every wait of the world's grids ends with ``RankFailure``; a wait that lasts asks for a roll call
(`Alarm.probe`). A rank the others declared dead is fenced (`Alarm.fence`: ``FencedError`` from then on). What
the worlds of one job share is their `Job`: the store and its loss (``StoreLostError``), the works a wait gave up
on, the guard's counters. Waits that are not torch works listen too (`Alarm.listening`). docs/design/rollcall.md
("The world object") and docs/design/recovery.md ("What the verdict does").
"""

from __future__ import annotations

import contextlib
import os
import re
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from hypergrid.binding.cpplog import quiet_cpp_log
from hypergrid.errors import FencedError, HyperGridError, RankFailure, StoreLostError
from hypergrid.launch.answerer import NODE_WATCH_ENV
from hypergrid.timing import Timing
from hypergrid.values import format_ranks

__all__ = ["Alarm", "Job", "News", "is_store_loss", "peer_gone", "quoted"]

#: ``report(kind, text)``: a roll call of the world, for a ``"failure"`` or a ``"probe"``; the dead ranks it
#: found, or None when no verdict came in time.
Reporter = Callable[[str, str], "Sequence[int] | None"]

#: What a backend writes around its message: gloo's source location and its sign-off (torch 2.13).
_DECORATIONS = (
    re.compile(r"^\[[^\]]*\.(?:cc|cpp|h|hpp):\d+\]\s*"),
    re.compile(r"\s*This is typically caused by a remote worker crashing\..*$"),
    re.compile(r"\s*GLHF!.*$"),
)


def quoted(error: BaseException) -> str:
    """``error``'s first line without the backend's decorations (source location, advice, sign-off).

    Examples:
        >>> quoted(RuntimeError("[/x/gloo/pair.cc:553] Connection closed by peer [h]:1. This is typically caused"
        ...                     " by a remote worker crashing. Check the logs. GLHF! x"))
        'Connection closed by peer [h]:1.'
        >>> quoted(ValueError(""))
        'ValueError'
    """
    text = str(error).strip()
    line = text.splitlines()[0] if text else ""
    for pattern in _DECORATIONS:
        line = pattern.sub("", line)
    return line or type(error).__name__


def is_store_loss(error: BaseException) -> bool:
    """Whether torch's ``error`` says the connection to the job's store is gone (not a slow or missing key).

    torch raises ``DistNetworkError`` when the store's socket closes under a
    call; a wait that times out is a ``DistStoreError``, which is not a loss.

    Examples:
        >>> import torch.distributed as dist
        >>> is_store_loss(dist.DistNetworkError("Failed to recv, got 0 bytes")), is_store_loss(ValueError("x"))
        (True, False)
    """
    import torch.distributed as dist  # (torch is imported by then: only torch's stores raise these)

    return isinstance(error, dist.DistNetworkError)


@dataclass(frozen=True)
class News:
    """A failure of a world, as the roll call settled it."""

    dead: tuple[int, ...]
    reason: str


class Job:
    """What the worlds of one job share on this rank (each world holds it; a shrink hands it to the next).

    Args:
        base_store: the store every world of the job is made on (the first world's).

    Examples:
        >>> job = Job(base_store=None)
        >>> job.store_lost is None, job.ordinal("2x2"), job.ordinal("2x2")
        (True, 0, 1)
    """

    def __init__(self, base_store: Any) -> None:
        self.base_store = base_store
        self.store_lost: BaseException | None = None  # torch's error that showed the store gone
        self.abandoned: list[Any] = []  # works a grid wait gave up on that torch still runs
        self.graveyard: list[Any] = []  # aborted groups those works need (hypergrid.binding.failures)
        self.ordinals: dict[str, int] = {}  # grids of each description built on the job's worlds
        self.guard_failures = 0  # guard rounds failed, on any grid of the job
        self.lock = threading.Lock()
        self.alarms: list[Any] = []  # the alarms of the job's open worlds (a store loss sounds them all)
        self.idle_link: Any = None  # a closed world's watcher connection, for the next world to watch with
        self._node_watch: str | None = None  # where the node's agent answers for this process (`node_watch`)
        self._node_watch_read = False

    def ordinal(self, description: str, forget: int | None = None) -> int:
        """A new grid of ``description``'s ordinal (0 for the first), or hand back ``forget``, the one just given
        (a grid built only as a view of another, which creates nothing itself)."""
        with self.lock:
            if forget is not None:
                if self.ordinals.get(description) == forget + 1:
                    self.ordinals[description] = forget
                return forget
            number = self.ordinals.get(description, 0)
            self.ordinals[description] = number + 1
        return number

    def node_watch(self) -> str | None:
        """The directory of the launcher's agent that answers the roll call for this process (`NODE_WATCH_ENV`),
        or None. Taken out of the environment by the first job that asks: a process this one starts (a job of its
        own) does not inherit it."""
        with self.lock:
            if not self._node_watch_read:
                self._node_watch_read = True
                self._node_watch = os.environ.pop(NODE_WATCH_ENV, None) or None
            return self._node_watch

    def lose_store(self, error: BaseException) -> None:
        """The job's store is gone (``error``: torch's): every open world's operations and waits end (its groups
        severed, as on a failure: a gloo peer that went with the store cannot abort the process later), and
        every call raises."""
        with self.lock:
            if self.store_lost is None:
                self.store_lost = error
            alarms = list(self.alarms)
        quiet_cpp_log()  # each other connection's failure would log its C++ stack: hypergrid says it once
        for alarm in alarms:
            if alarm.sever is not None:
                alarm.sever()
            alarm.sound((), "the job's store is gone")

    def store_error(self, what: str) -> StoreLostError | None:
        """The ``StoreLostError`` for ``what`` once the job's store is known gone (its ``__cause__``: torch's)."""
        cause = self.store_lost
        if cause is None:
            return None
        error = StoreLostError(
            f"{what} failed: the job's store is gone ({type(cause).__name__}: {quoted(cause)}); its host (rank 0 "
            "under a plain env:// launch, else the launcher's agent) died or was cut off, so no rank can agree, "
            "recover or re-form a world: exit, and restart the job from its last checkpoint"
        )
        error.__cause__ = cause
        return error

    @contextlib.contextmanager
    def store_calls(self, what: str) -> Iterator[None]:
        """Run hypergrid's store calls of ``what``; torch's error for a lost store becomes ``StoreLostError``.

        Examples:
            >>> with Job(None).store_calls("a guard round"):
            ...     pass
        """
        try:
            yield
        except RuntimeError as error:
            if isinstance(error, HyperGridError) or not is_store_loss(error):
                raise
            self.lose_store(error)
            raise (self.store_error(what) or StoreLostError(f"{what} failed: the job's store is gone")) from error


class Alarm:
    """One world's failure news on this rank, the waits it ends, and the fence (see the module's docstring).

    ``timing``: the world's `hypergrid.timing.Timing` (default: read from the environment now), whose probe its
    waits ask after.

    Examples:
        >>> alarm = Alarm(Job(None))
        >>> alarm.check("a call"), alarm.watched()
        (None, False)
        >>> alarm.sound([3], "rank 3 is gone"); alarm.pending("all_reduce").dead
        [3]
    """

    def __init__(self, job: Job, timing: Timing | None = None) -> None:
        self.job = job
        self.timing = Timing.from_env() if timing is None else timing
        self.news: News | None = None  # the world's failure, once the roll call settled it
        self.fenced: str | None = None  # why this rank was excluded by the others
        self.reporter: Reporter | None = None  # the world's watcher: runs a roll call
        self.excluded: Callable[[], bool] | None = None  # asks the store whether the others went on without it
        self.sentry: Any = None  # hypergrid.binding.waiting: the thread that probes a lasting point-to-point wait
        self.sever: Callable[[], object] | None = None  # ends the world's pending operations (its World's)
        self._waiters: set[threading.Event] = set()
        self._listeners: list[tuple[Callable[[], object], bool]] = []
        self._lock = threading.Lock()
        with job.lock:
            job.alarms.append(self)

    def retire(self) -> None:
        """The world closed: a store loss no longer sounds this alarm."""
        with self.job.lock:
            if self in self.job.alarms:
                self.job.alarms.remove(self)

    def install(self, reporter: Reporter | None, excluded: Callable[[], bool] | None = None) -> None:
        """Set the world's reporter and exclusion check (its watcher, once it started)."""
        self.reporter, self.excluded = reporter, excluded

    def watched(self) -> bool:
        """Whether a watcher reports for the world (else waits are plain: a world of one, the fake backend)."""
        return self.reporter is not None

    # -- news ------------------------------------------------------------------

    def sound(self, dead: Sequence[int], reason: str) -> None:
        """The world failed (``dead`` did not answer the roll call): end every wait at once."""
        with self._lock:
            if self.news is None:
                self.news = News(tuple(sorted(dead)), reason)
            waiters, listeners = list(self._waiters), list(self._listeners)
        for event in waiters:
            event.set()
        for listener, fence_only in listeners:
            if fence_only and self.fenced is None:
                continue
            with contextlib.suppress(RuntimeError):  # the store is gone: its waits end with the loss
                listener()

    def fence(self, reason: str) -> None:
        """This rank was declared dead by the others: every call on the world from now on raises ``FencedError``."""
        with self._lock:
            if self.fenced is None:
                self.fenced = reason
        self.sound((), reason)

    @contextlib.contextmanager
    def listening(self, on_news: Callable[[], object], fence_only: bool = False) -> Iterator[None]:
        """While inside, run ``on_news()`` when the world fails (``fence_only``: when this rank is fenced).

        At once if that happened already. For a wait that blocks on a store key: ``on_news`` writes into that key what
        ends the wait (a failure verdict, with ``compare_set``), or for a fence only wakes it (a read of the absent
        key), through a connection of its own. It may run more than once, and must not raise but a store's error.

        Examples:
            >>> with Alarm(Job(None)).listening(lambda: None):
            ...     pass
        """
        entry = (on_news, fence_only)
        with self._lock:
            self._listeners.append(entry)
            now = self.fenced is not None if fence_only else self.news is not None
        try:
            if now:
                with contextlib.suppress(RuntimeError):
                    on_news()
            yield
        finally:
            with self._lock:
                self._listeners.remove(entry)

    @contextlib.contextmanager
    def waking(self, event: threading.Event) -> Iterator[None]:
        """While inside, the world's failure sets ``event`` (a thread that waits on it wakes at once)."""
        with self._lock:
            self._waiters.add(event)
        try:
            yield
        finally:
            with self._lock:
                self._waiters.discard(event)

    def probe(self, what: str, text: str) -> None:
        """A wait of ``what`` lasts: ask for a roll call (a peer found gone sounds the alarm); nothing unwatched."""
        reporter = self.reporter
        if reporter is not None:
            with self.job.store_calls(what):
                reporter("probe", text)

    # -- checks ------------------------------------------------------------------

    def _fenced_error(self, what: str) -> FencedError:
        return FencedError(
            f"{what}: this rank was excluded by the others ({self.fenced}); it cannot take part in the job any more "
            "(its grid and groups are gone for it): exit, and let the launcher start a new process if one is needed"
        )

    def _confirm(self, what: str) -> None:
        """The world failed: ask whether the others ended it without this rank (which fences it); else nothing.

        One store read, on failure paths only: a rank stopped (or cut off) through the others' whole shrink learns here,
        on its first call, that it was left behind, whatever its watcher has read by then.
        """
        excluded = self.excluded
        if excluded is not None and self.news is not None and self.fenced is None and self.job.store_lost is None:
            with self.job.store_calls(what):
                excluded()

    def check_fence(self, what: str) -> None:
        """Raise ``FencedError`` on a fenced rank (or one the others left behind); else nothing."""
        self._confirm(what)
        if self.fenced is not None:
            raise self._fenced_error(what)

    def check(self, what: str) -> None:
        """Raise ``StoreLostError`` once the store is gone, ``FencedError`` on a fenced rank, ``RankFailure``
        once the world failed; else nothing (no store call on the healthy path)."""
        lost = self.job.store_error(what)
        if lost is not None:
            raise lost
        if self.fenced is None and self.news is None:
            return
        self._confirm(what)
        error = self.pending(what)
        if error is not None:
            raise error

    def pending(self, what: str) -> HyperGridError | None:
        """The error `check` would raise for ``what`` now (no store call), or None."""
        lost = self.job.store_error(what)
        if lost is not None:
            return lost
        if self.fenced is not None:
            return self._fenced_error(what)
        found = self.news
        if found is None:
            return None
        who = (
            f"rank(s) {format_ranks(list(found.dead))} stopped answering" if found.dead else "a peer reported a failure"
        )
        return RankFailure(
            f"{what} failed: {who} ({found.reason}); catch RankFailure and call grid.shrink() on every survivor to "
            "carry on",
            list(found.dead),
        )

    def failure(self, what: str, said: str, dead: Sequence[int] = ()) -> HyperGridError:
        """The ``RankFailure`` for a torch error this rank saw; first reported to the world (roll call) if it can be.

        With a watcher the failure is reported (every rank's waits end) and the
        roll call names the dead; without one, ``dead`` as given.
        """
        reporter = self.reporter
        if self.fenced is None and self.news is None and reporter is not None:
            try:
                with self.job.store_calls(what):
                    found = reporter("failure", f"{what}: {said}")
            except StoreLostError as gone:
                return gone
            if found is not None:
                self.sound(found, f"{what}: {said}")
        try:
            self._confirm(what)
        except StoreLostError as gone:
            return gone
        known = self.pending(what)
        return peer_gone(what, said, dead) if known is None else known


def peer_gone(what: str, said: str, dead: Sequence[int] = ()) -> RankFailure:
    """The ``RankFailure`` for a torch error that no roll call settled (``said``: torch's words, `quoted`)."""
    return RankFailure(
        f"{what} failed: a peer is gone ({said}); catch RankFailure and call grid.shrink() on every survivor to "
        "carry on",
        list(dead),
    )
