"""One `World` per world, held by every grid on it: its watcher, its alarm, its keys, and a lifecycle.

A *world* is one default process group: the job's first, or one that ``shrink`` formed (its number: the epoch).
`World` owns what this rank keeps for it: its `hypergrid.binding.alarm.Alarm`, its watcher
(`hypergrid.agreement.watcher`) and store connections, and the guard's bookkeeping; what the worlds of one job
share is their `hypergrid.binding.alarm.Job`. `World.current` is the one place a world is looked up. A world is
*open*, then *replaced* (`World.replace`) or *closed* (`World.close`): docs/design/rollcall.md ("The world
object").

Examples:
    >>> import torch.distributed as dist
    >>> from hypergrid.binding.alarm import Job
    >>> store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    >>> world = World(0, 0, 2, Job(store))
    >>> world.watcher is None, world.state
    (True, 'open')
    >>> world.close(); world.state
    'closed'
"""

from __future__ import annotations

import atexit
import gc
import multiprocessing.util
import sys
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

from hypergrid.agreement import diagnosis
from hypergrid.agreement.arrivals import Arrivals
from hypergrid.agreement.connections import CallStore, Within
from hypergrid.agreement.liveness import done_key, members_key
from hypergrid.agreement.relay import Relay
from hypergrid.agreement.rollkeys import member_status
from hypergrid.agreement.watcher import Verdict, Watcher, watching_enabled
from hypergrid.binding.alarm import Alarm, Job
from hypergrid.binding.failures import sever_torch_groups
from hypergrid.errors import GridReplacedError, NotInitializedError
from hypergrid.launch import sockets
from hypergrid.launch.memberlog import publish_liveness
from hypergrid.timing import Timing

__all__ = ["CLOSED", "OPEN", "REPLACED", "World"]

#: A world's states (`World.state`).
OPEN, REPLACED, CLOSED = "open", "replaced", "closed"


class _Registry:
    """The one process-wide pointer: torch's default group -> its `World` (weakly: an entry dies with its group)."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.worlds: weakref.WeakKeyDictionary[Any, World] = weakref.WeakKeyDictionary()


_WORLDS = _Registry()


class World:
    """This rank's part in one world (see the module's docstring).

    Args:
        number: the world's epoch (0: the job's first world).
        rank: this rank in it.
        size: the world's size.
        job: what every world of the job shares (its ``base_store``: where every epoch's keys live).
        namespace: where the world's default group keeps its keys in ``base_store`` (None: at its root).
        group: the world's default group (None: a world without one, as in a test).
        timing: the world's bounds (`hypergrid.timing.Timing`; default: read from the environment now). A world that
            follows this one keeps them.
    """

    def __init__(
        self,
        number: int,
        rank: int,
        size: int,
        job: Job,
        namespace: str | None = None,
        group: Any = None,
        timing: Timing | None = None,
    ) -> None:
        self.number = number
        self.rank = rank
        self.size = size
        self.job = job
        self.namespace = namespace
        self.timing = Timing.from_env() if timing is None else timing
        self.alarm = Alarm(job, self.timing)
        self.alarm.sever = self._sever
        self.state = OPEN
        self.successor: World | None = None  # the world a shrink formed after it (None: this rank was retired)
        self.watcher: Watcher | None = None
        self.calls = CallStore(job.base_store)
        #: The default group's store (torch's ``_get_default_store()``) for a thread other than the main one: what
        #: ends a guard round's or a commit's wait is written through it while the main thread blocks there.
        self.default_calls = Within(self.calls, namespace)
        self.guard_leftovers: dict[str, list[str]] = {}  # the guard: scope family -> its failed rounds' prefixes
        self.guard_last_commits: dict[str, str] = {}  # the guard: scope family -> its last passed commit's prefix
        self.local_names: dict[tuple[tuple[int, ...], int], str] = {}  # creation: members-only groups' names
        self.reforming = False  # a shrink tears its default group down: that does not close it
        self._group = None if group is None else weakref.ref(group)
        self._holders: weakref.WeakSet[Any] = weakref.WeakSet()
        self._joined = False
        self._link: Any = None
        self._lock = threading.RLock()
        if group is not None:
            weakref.finalize(group, self._released)
        self._cancel_exit = _on_exit(self._at_exit)

    @property
    def base_store(self) -> Any:
        """The store every world of the job is made on."""
        return self.job.base_store

    # -- where a grid gets its world ------------------------------------------------

    @classmethod
    def current(cls) -> World:
        """The world of torch's current default group: the open one, made (or reopened) on first need.

        Raises:
            NotInitializedError: torch.distributed is not initialized.
        """
        if not (dist.is_available() and dist.is_initialized()):
            raise NotInitializedError(
                "a grid's communication needs torch.distributed to be initialized: call "
                "torch.distributed.init_process_group first"
            )
        group = dist.group.WORLD
        with _WORLDS.lock:
            world = _WORLDS.worlds.get(group)
            if world is None or world.state != OPEN:
                if world is None:
                    world = World(0, dist.get_rank(), dist.get_world_size(), Job(c10d._get_default_store()))
                else:
                    world = world.reopened()
                world.bind(group)
            return world

    def reopened(self) -> World:
        """This closed world, open again (its grids were destroyed, then a grid was built on its default group): the
        same number, job and namespace, and the bookkeeping that follows torch's default group (the names of the
        members-only groups this rank created, the guard's rounds), which a new grid must not repeat."""
        world = World(self.number, self.rank, self.size, self.job, self.namespace, timing=self.timing)
        world.local_names, world.guard_leftovers = self.local_names, self.guard_leftovers
        world.guard_last_commits = self.guard_last_commits
        return world

    def bind(self, group: Any) -> None:
        """Make this the world of ``group`` (torch's default group now): `current` finds it from now on."""
        self._group = weakref.ref(group)
        weakref.finalize(group, self._released)
        with _WORLDS.lock:
            _WORLDS.worlds[group] = self

    def is_current(self) -> bool:
        """Whether this world's default group is torch's default group now."""
        group = None if self._group is None else self._group()
        return group is not None and dist.is_initialized() and dist.group.WORLD is group

    # -- holding and joining ------------------------------------------------------

    def hold(self, holder: Any, join: bool = True) -> None:
        """``holder`` (a root grid) uses this world: with ``join``, this rank joins its watch (once)."""
        with self._lock:
            self._holders.add(holder)
        if join:
            self.join()

    def join(self) -> None:
        """Join the world's watch (once): this rank answers its roll calls from now on, and is never *late* again."""
        with self._lock:
            if self._joined or self.state != OPEN:
                return
            self._joined = True
            self._join()

    def release(self, holder: Any, close: bool = True) -> None:
        """``holder`` is done with this world (its grid's ``destroy()``): the last one closes it (``close``)."""
        with self._lock:
            self._holders.discard(holder)
            last = not self._holders
        if close and last and self.state == OPEN:
            self.close()

    def _join(self) -> None:
        """Start the watcher and list this rank in the world's watch (nothing for one rank or torch's fake)."""
        if self.size < 2 or not watching_enabled() or dist.get_backend() == "fake":
            return
        if self._link is None:
            self._link, self.job.idle_link = self.job.idle_link, None  # a closed world's: no new connection
        if self._link is None:
            try:
                self._link = self.base_store.clone()
            except (RuntimeError, AttributeError):  # a store that cannot open a second connection (torch's FakeStore)
                return
        with self.job.store_calls("joining the world's watch"):
            done = diagnosis.read(self.calls.connection(), done_key(self.number))
            first = 0 if done is None else int(done) + 1  # a watched world: its next incident
            if self.number == 0 and self.rank == 0:  # under hypergrid.run: where its agents write a death's call
                publish_liveness(self.base_store)  # (and answer for their workers: `nodewatch`)
            watcher = Watcher(
                self._link,
                self.calls,
                self.number,
                self.rank,
                self.size,
                on_fence=self.fence,
                job=self.job,
                first=first,
                relay=Relay.open(self.job.node_watch(), self.number, self.rank, self.size),
            )
            self.calls.lend(watcher.thread, self._link)  # its failure's path opens no connection
            watcher.start()
            if self.rank == 0:  # where a process that arrives later wakes the ranks (`arrivals.wake`)
                Arrivals(self.calls.connection()).publish_world(self.number, self.size)
        self.watcher = watcher
        self.alarm.install(watcher.alarm_reporter, watcher.excluded)
        watcher.on_failure(self._failed)

    def check(self, what: str) -> None:
        """Refuse a call on a world a shrink replaced (``GridReplacedError``); the alarm says the rest."""
        if self.state == REPLACED:
            after = (
                "this rank was retired by it"
                if self.successor is None
                else f"use the grid the shrink returned (world {self.successor.number})"
            )
            raise GridReplacedError(
                f"{what}: this grid was replaced by a shrink (its world {self.number} ended); {after}, not this one"
            )

    # -- failure ------------------------------------------------------------------

    def _sever(self) -> None:
        """End every operation pending on this world's groups, while it is torch's world."""
        if self.is_current():
            sever_torch_groups()

    def _failed(self, verdict: Verdict) -> None:
        """The world failed: end every pending operation of this rank, then every wait."""
        self._sever()
        self.alarm.sound(verdict.dead, verdict.text)

    def fence(self, reason: str) -> None:
        """The others went on without this rank: every call raises ``FencedError``, and every wait ends.

        The fence is recorded first (a wait that the severing ends finds the rank fenced), then the groups' connections
        are severed: a point-to-point wait, which nothing else wakes, would otherwise block until the group's timeout
        when the rank resumed inside it (a SIGSTOP through the others' shrink).
        """
        self.alarm.fence(reason)
        self._sever()

    # -- succession and the end ---------------------------------------------------------

    def successor_world(self, number: int, rank: int, size: int, namespace: str | None) -> World:
        """World ``number``, which a shrink formed after this one (torch's default group now): it takes the
        watcher's connection over once this world's watcher ended (`replace`), so recovery opens none."""
        world = World(number, rank, size, self.job, namespace, timing=self.timing)
        world.bind(dist.group.WORLD)
        return world

    def replace(self, successor: World | None) -> None:
        """A shrink ended this world: ``successor`` (None: this rank was retired) takes the watcher's connection;
        this world refuses every call from now on and closes without leaving (its end was read by every rank)."""
        self.successor = successor
        link = self._link if self.watcher is None or self.watcher.join(0.0) else None
        self._link = None
        self.close(leave=False)
        self.state = REPLACED
        if successor is not None and successor._link is None:
            successor._link = link

    def close(self, leave: bool = True, error: str | None = None) -> None:
        """End this rank's part: say it left (``leave``), wake the watcher alone and join it. Idempotent.

        ``error``: the process ends on this uncaught error: it did not leave normally, and the others are told at
        once (`Watcher.depart`: their roll call finds this rank gone).
        """
        with self._lock:
            if self.state != OPEN:
                return
            self.state = CLOSED
        self._cancel_exit()
        watcher = self.watcher
        if watcher is not None and self.job.store_lost is not None:  # nothing to say: the store is gone
            watcher.stop()
            watcher.join(self.timing.stop_s)  # (it met the loss: it has ended, or ends at once)
        elif watcher is not None:
            if error is not None:
                watcher.depart(error)
                watcher.join(self.timing.stop_s)  # the call woke it: it ends on its own
            elif leave:
                watcher.leave()
                if self.rank == 0:  # its arrivals' wake key goes with it (a successor's, written since, stays)
                    Arrivals(self.calls.connection()).unpublish_world(self.number, self.size)
                if sockets.hosts(self.base_store):  # its store dies with this process: not under the others
                    _on_exit(self.linger, tuple(watcher.dead))
            if watcher.halt(self.calls, self.timing.stop_s):
                watcher.forget()
                if self._link is not None and self.job.store_lost is None:  # (a successor took it over: None)
                    self.job.idle_link, self._link = self._link, None  # the world reopened next watches with it
        self.alarm.install(None)
        self.alarm.retire()
        self._link = None
        self.calls.close()

    def linger(self, dead: tuple[int, ...], bound_s: float | None = None) -> bool:
        """At the exit of the process that hosts the store: wait until every other rank of the world left its
        watch (or was found dead), at most ``bound_s`` (default: the probe), so that no rank's watcher sees the store
        die under it (torch would print its connection errors). Whether they all left."""
        deadline = time.monotonic() + (self.timing.probe_s if bound_s is None else bound_s)
        while time.monotonic() < deadline:
            try:
                status = member_status(diagnosis.read(self.base_store, members_key(self.number)))
            except RuntimeError:  # the store is gone already
                return False
            if not [rank for rank, watching in status.items() if watching and rank not in dead]:
                return True
            time.sleep(self.timing.poll_s)
        return False

    def _released(self) -> None:
        """The world's default group was released (``destroy_process_group``, or a shrink's teardown)."""
        if not self.reforming:
            self.close()

    def _at_exit(self) -> None:
        """Interpreter exit: close, after collecting the garbage a failure left.

        A failure leaves reference cycles (an exception's frames) that hold torch's communication objects; destroyed
        during finalization, a gloo work whose peer died can end the process with ``std::terminate``.
        """
        self.close(error=_uncaught())
        gc.collect()


def _on_exit(function: Callable[..., object], *args: Any) -> Callable[[], None]:
    """Run ``function(*args)`` once when the process ends: at interpreter exit (``atexit``), or at a
    ``multiprocessing`` worker's end, which runs no ``atexit`` handler but its finalizers. The cancel."""
    done = threading.Event()

    def once() -> None:
        if not done.is_set():
            done.set()
            function(*args)

    atexit.register(once)
    finalizer = multiprocessing.util.Finalize(None, once, exitpriority=100)

    def cancel() -> None:
        done.set()
        atexit.unregister(once)
        finalizer.cancel()

    return cancel


def _uncaught() -> str | None:
    """The error the interpreter exits on (an uncaught exception: ``sys.last_value``), as one line; else None."""
    error = getattr(sys, "last_value", None)
    if not isinstance(error, BaseException) or isinstance(error, (SystemExit, KeyboardInterrupt)):
        return None
    said = str(error).strip().splitlines()
    return f"{type(error).__name__}: {said[0]}" if said else type(error).__name__
