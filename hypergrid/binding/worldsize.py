"""The world size hint: how many ranks a grid may span before (or without) an initialized world."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import torch.distributed as dist

from hypergrid.errors import WorldSizeError

__all__ = ["planned_world", "world_size_hint"]


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


@contextlib.contextmanager
def planned_world(size: int) -> Iterator[None]:
    """Inside, `world_size_hint` is ``size``: a grid is built for a world not formed yet (a shrink's successor,
    which growing back makes larger than the world it is built in).

    Examples:
        >>> with planned_world(12):
        ...     world_size_hint()
        12
    """
    before = os.environ.get("WORLD_SIZE")
    os.environ["WORLD_SIZE"] = str(size)
    try:
        yield
    finally:
        if before is None:
            del os.environ["WORLD_SIZE"]
        else:
            os.environ["WORLD_SIZE"] = before
