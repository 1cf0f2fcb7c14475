"""Bookkeeping that lives as long as the current default process group."""

from __future__ import annotations

import os
import weakref
from typing import Any

import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

from hypergrid.errors import WorldSizeError

__all__ = ["PerWorld", "held_group_count", "world_size_hint"]


class PerWorld:
    """A dict that empties itself when the default group changes (destroyed and re-initialized).

    Examples:
        >>> state = PerWorld()
        >>> state.get()["seen"] = 1
        >>> state.get()  # no world: one shared, empty-at-first state per "no world"
        {'seen': 1}
    """

    def __init__(self) -> None:
        self._world: weakref.ref[Any] | None = None  # None: the data belongs to "no world"
        self._data: dict[Any, Any] = {}

    def get(self) -> dict[Any, Any]:
        world = dist.group.WORLD if dist.is_initialized() else None
        if self._world is None:
            same = world is None
        else:
            held = self._world()
            same = held is not None and held is world  # a world torch dropped is never the current one
        if not same:
            self._world = None if world is None else weakref.ref(world)
            self._data = {}
        return self._data


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
