"""The registry of worlds (`WORLDS`): hypergrid's one module-level mutable object, and the world size hint.

A *world* is one default process group. Everything this rank keeps for the
current world is a field of its `WorldState` (the alarm's news and waiters,
the members-only names creation gave, the guard's leftover rounds); a new
default group gets a fresh one. The registry holds the agreement's `World`
of each live default group (its watcher and store connections,
``hypergrid.agreement.world``), and what outlives every world: the fence,
the abandoned works and the aborted groups they need, how the world was
formed, the grids' ordinals and the guard's failure count.
"""

from __future__ import annotations

import datetime
import os
import threading
import weakref
from typing import Any

import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

from hypergrid.errors import WorldSizeError

__all__ = ["WORLDS", "WorldState", "Worlds", "held_group_count", "world_size_hint"]


class WorldState:
    """What this rank keeps for one world: the current default group's, or "no world"'s before one exists.

    Attributes:
        alarm: the world's failure news, the grid waits to wake and the reporter (``hypergrid.binding.alarm``).
        local_names: members-only groups made: (ranks, groups held then) -> torch's name (``creation``).
        guard_leftovers: scope family -> prefixes of its failed rounds, whose keys are still stored (the guard).
        guard_last_commits: scope family -> the prefix of its last passed commit (the guard).

    Examples:
        >>> state = WorldState()
        >>> state.alarm["news"], state.local_names
        (None, {})
    """

    def __init__(self) -> None:
        self.alarm: dict[str, Any] = {"news": None, "waiters": set(), "reporter": None}
        self.local_names: dict[tuple[tuple[int, ...], int], str] = {}
        self.guard_leftovers: dict[str, list[str]] = {}
        self.guard_last_commits: dict[str, str] = {}


class Worlds:
    """The registry of worlds on this rank: each live default group's ``World``, the current world's `WorldState`.

    Attributes:
        live: id(default group) -> its ``World`` (``hypergrid.agreement.world``), until the group is released.
        lock: held while a world is made or registered (``hypergrid.agreement.world``).
        alarm_lock: the alarm's (``hypergrid.binding.alarm``).
        fence: why this rank was fenced (declared dead by the others), for good; None until then.
        store_lost: torch's error that showed the job's store gone; None until then.
        abandoned: works a grid wait gave up on (the world failed first) that torch's threads still run.
        graveyard: aborted groups kept alive while an abandoned work runs (``binding.failures``).
        formed: how hypergrid formed the current default group (``binding.reform``): its group (a weak
            reference) and epoch, and the backend and timeout of the world it tore down.
        grid_ordinals: grid description -> grids of it built in this process (the guard's rounds).
        guard_failures: guard rounds that failed in this process, on any grid.
        exit_registered: the ``atexit`` handler that closes every world is registered.

    Examples:
        >>> registry = Worlds()
        >>> registry.state() is registry.state(), registry.current() is None
        (True, True)
    """

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.live: dict[int, Any] = {}
        self.alarm_lock = threading.Lock()
        self.fence: str | None = None
        self.store_lost: BaseException | None = None
        self.abandoned: list[Any] = []
        self.graveyard: list[Any] = []
        self.formed: dict[str, Any] = {
            "world": None,
            "epoch": None,
            "backend": "gloo",
            "timeout": datetime.timedelta(minutes=30),
        }
        self.grid_ordinals: dict[str, int] = {}
        self.guard_failures = 0
        self.exit_registered = False
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
