"""Validation of a grid description (shape, dim names, offset) and of rank arrays (no torch).

Every check names the bad value and what was expected; the layout calls these
once, when a grid is built.

Examples:
    >>> check_shape([2, 4])
    (2, 4)
    >>> resolve_shape([2, -1], world=8)
    [2, 4]
"""

from __future__ import annotations

import keyword
import math
from collections.abc import Sequence
from typing import Union

import numpy as np

from hypergrid.errors import GridSpecError, RankError, public
from hypergrid.values import as_int, is_int, shown

__all__ = ["MAX_WORLD_SIZE", "Dims", "check_dim_names", "check_offset", "check_shape", "int_array", "resolve_shape"]

#: World sizes and ranks are 32-bit signed integers in torch.distributed and
#: NCCL: a grid's ``rank_offset + size`` (the world it needs) may not exceed this.
MAX_WORLD_SIZE = 2**31 - 1

#: A dims request: one name, a canonical key such as ``"dp-tp"``, or a list/tuple of names.
Dims = Union[str, Sequence[str]]  # noqa: UP007 - a runtime alias must work on Python 3.10


def check_shape(shape: object) -> tuple[int, ...]:
    if isinstance(shape, (str, bytes)) or not isinstance(shape, (Sequence, np.ndarray)):
        raise GridSpecError(f"shape must be a list or tuple of positive ints, got {shown(shape)}")
    sizes = list(shape)
    if not sizes:
        raise GridSpecError("shape must have at least one dim, got an empty shape")
    for position, size in enumerate(sizes):
        if not is_int(size) or not 1 <= size <= MAX_WORLD_SIZE:
            raise GridSpecError(
                f"shape[{position}]={shown(size)}: expected an int in 1..{MAX_WORLD_SIZE} (2**31-1, the largest "
                f"world) in shape {shown(sizes)}"
            )
    return tuple(int(size) for size in sizes)


@public
def resolve_shape(shape: Sequence[int], world: int | None, rank_offset: int = 0) -> list[int]:
    """Replace one size of ``-1`` by what fills the world (as ezpz infers dp).

    Examples:
        >>> resolve_shape([2, -1, 4], world=64)
        [2, 8, 4]
        >>> resolve_shape([2, 4], world=None)
        [2, 4]
    """
    if isinstance(shape, (str, bytes)) or not isinstance(shape, (Sequence, np.ndarray)):
        check_shape(shape)  # names the problem
    sizes = list(shape)
    wild = [i for i, size in enumerate(sizes) if as_int(size) == -1]
    if len(wild) > 1:
        raise GridSpecError(f"shape {shown(sizes)} has {len(wild)} sizes of -1; at most one can be inferred")
    known = [size for i, size in enumerate(sizes) if i not in wild]
    fixed = check_shape(known) if known else ()
    offset = check_offset(rank_offset)
    if world is not None and (as_int(world) is None or not 0 < world <= MAX_WORLD_SIZE):
        raise GridSpecError(f"world must be None or an int in 1..{MAX_WORLD_SIZE} (2**31-1), got {shown(world)}")
    if not wild:
        return sizes
    if world is None:
        raise GridSpecError(
            f"shape {shown(sizes)} has a -1 to infer, but the world size is unknown: initialize "
            "torch.distributed or set WORLD_SIZE"
        )
    product = math.prod(fixed)
    room = world - offset
    if room < product or room % product:
        raise GridSpecError(
            f"cannot infer the -1 in shape {shown(sizes)}: the world of {world} ranks (offset {offset}) "
            f"leaves {room} ranks, not a positive multiple of the other sizes' product {shown(product)}"
        )
    sizes[wild[0]] = room // product
    return sizes


def check_dim_names(dim_names: object, ndim: int) -> tuple[str, ...]:
    if isinstance(dim_names, (str, bytes)) or not isinstance(dim_names, Sequence):
        raise GridSpecError(f"dim_names must be a list or tuple of str, got {shown(dim_names)}")
    names = list(dim_names)
    if len(names) != ndim:
        raise GridSpecError(
            f"len(shape) {ndim} != len(dim_names) {len(names)}: dim_names {shown(names)} has {len(names)} names "
            f"but shape has {ndim} dims; give one name per dim"
        )
    for position, name in enumerate(names):
        # Names become keyword arguments and named-tuple fields (rank_of(tp=0)),
        # and canonical keys join them with "-": so they must be identifiers.
        if not isinstance(name, str):
            raise GridSpecError(f"dim_names[{position}] must be a str, got {shown(name)}")
        if not name.isidentifier() or keyword.iskeyword(name) or name.startswith("_"):
            raise GridSpecError(
                f"dim_names[{position}] = {shown(name)} is not a valid dim name: use a Python "
                "identifier that is not a keyword and does not start with '_' (e.g. 'tp', 'dp')"
            )
    seen: set[str] = set()
    for name in names:
        if name in seen:
            raise GridSpecError(f"dim_names {shown(names)} repeats {shown(name)}; every dim needs its own name")
        seen.add(name)
    return tuple(names)


def check_offset(rank_offset: object) -> int:
    offset = as_int(rank_offset)
    if offset is None or not 0 <= offset < MAX_WORLD_SIZE:
        raise GridSpecError(f"rank_offset must be an int in 0..{MAX_WORLD_SIZE - 1} (a rank), got {shown(rank_offset)}")
    return offset


def _holds_bool(data: object) -> bool:
    if isinstance(data, (bool, np.bool_)):
        return True
    return isinstance(data, (list, tuple)) and any(_holds_bool(item) for item in data)


def int_array(data: object, ndim: int, message: str) -> np.ndarray:
    """``data`` as an integer array of ``ndim`` dims (empty allowed), else RankError(message)."""
    if not isinstance(data, np.ndarray) and _holds_bool(data):
        raise RankError(message)  # numpy would silently read True as 1
    try:
        array = np.asarray(data)
    except (ValueError, TypeError):  # ragged or otherwise not array-like
        raise RankError(message) from None
    if array.ndim != ndim or not (array.size == 0 or np.issubdtype(array.dtype, np.integer)) or array.dtype == bool:
        raise RankError(message)
    return array.astype(np.int64)
