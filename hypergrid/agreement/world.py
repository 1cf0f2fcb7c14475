"""One object per world: the rank's watcher, its one store connection, and an explicit close.

A *world* is one default process group: the job's first, or one that
``shrink`` formed (its epoch number). `World` owns everything this rank keeps
for it: the watcher thread (`hypergrid.agreement.watcher`), the one extra
store connection the watcher blocks on, and a second connection opened only
when a thread other than the main one must call the store while the main
thread is blocked on its own (a prober during a slow barrier).

A world closes at the first of (not when its last grid is destroyed: a
destroy-and-create loop, as Megatron's tests run, would then pay a thread and
a connection per cycle, and an idle watcher costs nothing):

- ``torch.distributed.destroy_process_group()`` (its default group is
  released: `World` holds a ``weakref.finalize`` on it);
- interpreter exit (an ``atexit`` handler, which runs before torch tears its
  store down); on an uncaught error the rank does not leave but departs
  (`hypergrid.agreement.watcher.Watcher.depart`): the others find it gone at once;
- ``shrink``: the survivors' new world takes the watcher's connection over
  (`World.take_over`), so recovery opens no connection on its critical path.

Closing says the rank left normally (it is not dead), wakes the watcher with
a read of its block's wake key (`hypergrid.agreement.liveness.wake_key`: the
key's waiters wake and nothing is written; the block's at most 7 other
watchers look for a call and wait again) and joins the thread, so no hypergrid
thread is blocked in the store when the process exits: a thread that returns from torch's store client while
the interpreter finalizes ends the process with ``std::terminate``.

The registry of worlds (``WORLDS``, ``hypergrid.binding.worldstate``) holds
the world of the live default group on this rank in its `WorldState`.

Examples:
    >>> import torch.distributed as dist
    >>> store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    >>> world = World(0, 0, 2, store)
    >>> world.watcher is None, world.closed
    (True, False)
    >>> world.close(); world.closed
    True
"""

from __future__ import annotations

import atexit
import gc
import sys
import threading
import weakref
from typing import Any

import torch.distributed as dist

from hypergrid.agreement.watcher import Verdict, Watcher, watching_enabled
from hypergrid.binding import alarm
from hypergrid.binding.failures import abort_world_groups
from hypergrid.binding.reform import current_epoch
from hypergrid.binding.worldstate import WORLDS

__all__ = ["WORLDS", "World", "adopt", "close_all", "current_watcher", "current_world", "ensure_watching", "register"]

#: How long `World.close` waits for the woken watcher thread to end.
JOIN_S = 5.0


class CallStore:
    """The store a short call uses: the rank's own connection on the main thread, else one opened on first need.

    The main thread's connection (torch's default store) is free whenever the
    main thread itself calls; a thread that calls while the main thread may be
    blocked on it (a prober in a slow barrier) gets a connection of its own,
    opened once and kept until the world closes.
    """

    def __init__(self, base: Any) -> None:
        self.base = base
        self._own: Any = None
        self._lock = threading.Lock()

    def connection(self) -> Any:
        if threading.current_thread() is threading.main_thread():
            return self.base
        with self._lock:
            if self._own is None:
                self._own = self.base.clone()
            return self._own

    def close(self) -> None:
        with self._lock:
            self._own = None  # torch closes the socket with the object

    def __getattr__(self, name: str) -> Any:
        return getattr(self.connection(), name)


class Within:
    """`CallStore`'s connections seen under a key prefix (the default group's store of a re-formed world).

    ``namespace`` None: the connections as they are.
    """

    def __init__(self, calls: CallStore, namespace: str | None) -> None:
        self.calls = calls
        self.namespace = namespace

    def __getattr__(self, name: str) -> Any:
        connection = self.calls.connection()
        store = connection if self.namespace is None else dist.PrefixStore(self.namespace, connection)  # type: ignore[attr-defined]
        return getattr(store, name)


class World:
    """This rank's part in one world: its watcher, the watcher's connection, and `close`.

    Args:
        number: the world's epoch (0: the job's first world).
        rank: this rank in it.
        size: the world's size.
        base_store: the store of the job's first world (every epoch's keys live there).
        link: a connection to ``base_store`` for the watcher, handed over from the previous world.
        namespace: where the world's default group keeps its keys in ``base_store`` (None: at its root;
            `hypergrid.binding.reform.Epoch.namespace`).
    """

    def __init__(
        self, number: int, rank: int, size: int, base_store: Any, link: Any = None, namespace: str | None = None
    ) -> None:
        self.number = number
        self.rank = rank
        self.size = size
        self.base_store = base_store
        self.calls = CallStore(base_store)
        #: The default group's store (torch's ``_get_default_store()``) for a thread other than the main one: what
        #: ends a guard round's or a commit's wait is written through it while the main thread blocks there.
        self.default_calls = Within(self.calls, namespace)
        self.watcher: Watcher | None = None
        self.closed = False
        self.reforming = False  # set by shrink: the default group's teardown does not close this world
        self._link = link

    def start_watching(self) -> Watcher | None:
        """Start this rank's watcher (once); None where none can run (one rank, ``HYPERGRID_WATCH=0``, no clone)."""
        if self.watcher is not None or self.closed:
            return self.watcher
        if self.size < 2 or not watching_enabled():
            return None
        if self._link is None:
            try:
                self._link = self.base_store.clone()
            except (RuntimeError, AttributeError):  # a store that cannot open a second connection (torch's FakeStore)
                return None
        self.watcher = Watcher(self._link, self.calls, self.number, self.rank, self.size, on_fence=_fenced).start()
        return self.watcher

    def hand_over(self) -> Any:
        """The watcher's connection, for the next world (None if the thread still uses it); this world closes."""
        link = self._link if self.watcher is None or self.watcher.join(0.0) else None
        self._link = None
        self.close(leave=False)
        return link

    def take_over(self, previous: World) -> None:
        """Use ``previous``'s watcher connection from now on (``shrink`` formed this world after it); it closes."""
        if self._link is None and self.watcher is None:
            self._link = previous.hand_over()
        else:
            previous.close(leave=False)

    def close(self, leave: bool = True, error: str | None = None) -> None:
        """End this rank's part: say it left normally (``leave``), wake the watcher alone and join it. Idempotent.

        ``error``: the process ends on this uncaught error: it did not leave normally, and the others are told at
        once (`Watcher.depart`: their roll call finds this rank gone).
        """
        if self.closed:
            return
        self.closed = True
        watcher = self.watcher
        if watcher is not None:
            if error is not None:
                watcher.depart(error)
                watcher.join(JOIN_S)  # the call woke it: it ends on its own
            elif leave:
                watcher.leave()
            watcher.halt(self.calls, JOIN_S)
        self._link = None
        self.calls.close()


def _ensure_world() -> World | None:
    """The current default group's world, made (its watcher started) on first use; None without a world."""
    if not (dist.is_available() and dist.is_initialized()):
        return None
    with WORLDS.lock:
        found = current_world()
        if found is not None:
            return found
        epoch = current_epoch()
        world = World(epoch.number, dist.get_rank(), dist.get_world_size(), epoch.base_store, namespace=epoch.namespace)
        if dist.get_backend() != "fake":
            world.start_watching()
        adopt(world)
        return world


def adopt(world: World) -> None:
    """Make ``world`` the current default group's (its watcher answers, sounds the alarm, fences the rank)."""
    register(world)
    watcher = world.watcher
    if watcher is None:
        alarm.install(None)
    else:
        alarm.install(watcher.alarm_reporter, watcher.excluded)
    if watcher is not None:
        watcher.on_failure(_world_failed)


def register(world: World) -> None:
    """Hold ``world`` as the current default group's, until the group is released; the alarm is left as it is."""
    group: Any = dist.group.WORLD
    key = id(group)
    with WORLDS.lock:
        previous = WORLDS.live.get(key)
        if previous is not None and previous is not world:
            previous.close(leave=False)
        WORLDS.live[key] = world
        if not WORLDS.exit_registered:
            WORLDS.exit_registered = True
            atexit.register(close_all)
    weakref.finalize(group, _released, key, world)


def _released(key: int, world: World) -> None:
    """The default group of ``world`` was released (``destroy_process_group``, or a shrink's teardown)."""
    with WORLDS.lock:
        if WORLDS.live.get(key) is world:
            del WORLDS.live[key]
    if not world.reforming:
        world.close()
        alarm.install(None)


def close_all() -> None:
    """Close every world (interpreter exit), after collecting the garbage a failure left.

    A failure leaves reference cycles (an exception's frames) that hold
    torch's communication objects; destroyed during finalization, a gloo
    work whose peer died can end the process with ``std::terminate``.
    """
    with WORLDS.lock:
        worlds, WORLDS.live = list(WORLDS.live.values()), {}
    error = _uncaught()
    for world in worlds:
        world.close(error=error)
    gc.collect()


def _uncaught() -> str | None:
    """The error the interpreter exits on (an uncaught exception: ``sys.last_value``), as one line; else None."""
    error = getattr(sys, "last_value", None)
    if not isinstance(error, BaseException) or isinstance(error, (SystemExit, KeyboardInterrupt)):
        return None
    said = str(error).strip().splitlines()
    return f"{type(error).__name__}: {said[0]}" if said else type(error).__name__


def _fenced(reason: str) -> None:
    """The others went on without this rank: every grid call raises ``FencedError``, and every wait ends.

    The fence is recorded first (a wait that the severing ends finds the rank
    fenced), then the groups' connections are severed: a point-to-point wait,
    which nothing else wakes, would otherwise block until the group's timeout
    when the rank resumed inside it (a SIGSTOP through the others' shrink).
    """
    alarm.fence(reason)
    abort_world_groups()


def _world_failed(verdict: Verdict) -> None:
    """The current world failed: end every pending operation of this rank, then every grid wait."""
    abort_world_groups()
    alarm.sound(verdict.dead, verdict.text)


def current_world() -> World | None:
    """The current default group's world on this rank, if one was made."""
    found: World | None = WORLDS.current()
    return found


def current_watcher() -> Watcher | None:
    """The current world's watcher on this rank, if one runs."""
    world = current_world()
    return None if world is None else world.watcher


def ensure_watching() -> Watcher | None:
    """Start this rank's watcher for the current world, once; it, or None (see `_ensure_world`)."""
    world = _ensure_world()
    return None if world is None else world.watcher
