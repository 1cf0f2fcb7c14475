"""Bookkeeping that lives as long as the current default process group."""

from __future__ import annotations

import weakref
from typing import Any

import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

__all__ = ["PerWorld", "held_group_count"]


class PerWorld:
    """A dict that empties itself when the default group changes (destroyed and re-initialized).

    Examples:
        >>> state = PerWorld()
        >>> state.get()["seen"] = 1
        >>> state.get()  # no world: one shared, empty-at-first state per "no world"
        {'seen': 1}
    """

    def __init__(self) -> None:
        self._world: weakref.ref[Any] | None = None
        self._data: dict[Any, Any] = {}

    def get(self) -> dict[Any, Any]:
        world = dist.group.WORLD if dist.is_initialized() else None
        current = None if self._world is None else self._world()
        if current is not world:
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
