"""The world size hint: how many ranks a grid may span before (or without) an initialized world."""

from __future__ import annotations

import os

import torch.distributed as dist

from hypergrid.errors import WorldSizeError

__all__ = ["world_size_hint"]


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
