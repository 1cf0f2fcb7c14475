"""The registry of worlds (`WORLDS`): hypergrid's one module-level mutable object, and the world size hint.

A *world* is one default process group. What this rank keeps for the current
world is in its `WorldState` (fresh for a new default group); the registry
holds the ``World`` of each live default group (``hypergrid.agreement.world``)
and what outlives every world.
"""

from __future__ import annotations

import datetime
import os
import threading
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

from hypergrid.errors import WorldSizeError

__all__ = ["WORLDS", "AlarmState", "News", "WorldState", "Worlds", "held_group_count", "world_size_hint"]

#: ``report(kind, text)``: a roll call of the world, for a ``"failure"`` or a ``"probe"`` (a wait lasts long); the
#: dead ranks it found, or None when no verdict came in time.
Reporter = Callable[[str, str], "Sequence[int] | None"]
#: ``excluded()``: whether the others ended the current world without this rank (read from the store; it fences it).
Excluded = Callable[[], bool]


@dataclass(frozen=True)
class News:
    """A failure of the current world, as the roll call settled it."""

    dead: tuple[int, ...]
    reason: str


@dataclass
class AlarmState:
    """The alarm's part of a world's state (`hypergrid.binding.alarm`), changed under ``WORLDS.alarm_lock``."""

    news: News | None = None  # the world's failure, once the roll call settled it
    waiters: set[threading.Event] = field(default_factory=set)  # the grid waits it wakes
    listeners: list[Callable[[], object]] = field(default_factory=list)  # what ends a wait on a store key
    reporter: Reporter | None = None  # installed by the world's watcher
    excluded: Excluded | None = None  # installed with the reporter; asked only once the world failed


class WorldState:
    """What this rank keeps for one world: the current default group's, or "no world"'s before one exists.

    Examples:
        >>> state = WorldState()
        >>> state.alarm.news, state.local_names
        (None, {})
    """

    def __init__(self) -> None:
        self.alarm = AlarmState()  # binding.alarm: the world's failure news, the waits to wake, the watcher's
        self.local_names: dict[tuple[tuple[int, ...], int], str] = {}  # creation: (ranks, groups held) -> name
        self.guard_leftovers: dict[str, list[str]] = {}  # guard: scope family -> its failed rounds' prefixes
        self.guard_last_commits: dict[str, str] = {}  # guard: scope family -> its last passed commit's prefix
        self.p2p_sentry: Any = None  # binding.waiting: the thread that probes a lasting point-to-point wait


class Worlds:
    """The registry of worlds on this rank: each live default group's ``World``, the current world's `WorldState`.

    Examples:
        >>> registry = Worlds()
        >>> registry.state() is registry.state(), registry.current() is None
        (True, True)
    """

    def __init__(self) -> None:
        self.lock = threading.RLock()  # held while a world is made or registered (agreement.world)
        self.live: dict[int, Any] = {}  # id(default group) -> its World, until the group is released
        self.alarm_lock = threading.Lock()
        # What outlives every world: why this rank was fenced; torch's error that showed the store gone;
        # works a grid wait gave up on that torch still runs, and the aborted groups they need (binding.failures).
        self.fence: str | None = None
        self.store_lost: BaseException | None = None
        self.abandoned: list[Any] = []
        self.graveyard: list[Any] = []
        # How hypergrid formed the default group (binding.reform): its group (weakly) and epoch, the torn-down
        # world's backend and timeout; grids built per description, guard rounds failed (agreement.guard).
        self.formed: dict[str, Any] = {"world": None, "epoch": None, "backend": "gloo"}
        self.formed["timeout"] = datetime.timedelta(minutes=30)
        self.grid_ordinals: dict[str, int] = {}
        self.guard_failures = 0
        self.exit_registered = False  # the atexit handler that closes every world
        self._group: weakref.ref[Any] | None = None  # None: the state belongs to "no world"
        self._state = WorldState()
        self._state_lock = threading.Lock()

    def state(self) -> WorldState:
        """The current world's state; a fresh one when the default group changed (destroyed, re-initialized)."""
        group = dist.group.WORLD if dist.is_initialized() else None
        with self._state_lock:
            if self._group is None:
                same = group is None
            else:
                held = self._group()
                same = held is not None and held is group  # a group torch dropped is never the current one
            if not same:
                self._group = None if group is None else weakref.ref(group)
                self._state = WorldState()
            return self._state

    def current(self) -> Any:
        """The current default group's ``World``, if one was made (None without an initialized default group)."""
        if not (dist.is_available() and dist.is_initialized()):
            return None
        with self.lock:
            return self.live.get(id(dist.group.WORLD))


#: The registry of worlds on this rank: hypergrid's one piece of module-level mutable state.
WORLDS = Worlds()


def held_group_count() -> int:
    """How many process groups this rank holds, as torch counts them.

    torch names a group created with ``use_local_synchronization=True`` from its
    ranks *and* this count (``len(_world.pg_names)`` in torch 2.4 to 2.13), so members
    that hold different numbers of groups would wait on different store keys.
    """
    return len(c10d._world.pg_names)


def world_size_hint() -> int | None:
    """The world size, if known: from ``WORLD_SIZE``, else from torch.distributed (Megatron's order).

    Returns ``None`` when neither is available (a grid planned offline).

    Raises:
        WorldSizeError: ``WORLD_SIZE`` is set but is not a positive int.

    Examples:
        >>> import os
        >>> os.environ["WORLD_SIZE"] = "16"
        >>> world_size_hint()
        16
        >>> del os.environ["WORLD_SIZE"]
    """
    value = os.environ.get("WORLD_SIZE")
    if value is None:
        return dist.get_world_size() if dist.is_available() and dist.is_initialized() else None
    try:
        world = int(value)
    except ValueError:
        world = 0
    if world < 1:
        raise WorldSizeError(f"environment variable WORLD_SIZE={value!r} is not a positive int")
    return world
