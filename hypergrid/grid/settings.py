"""A grid's settings, read from its constructor's signature: what the guard compares, and what a new grid keeps.

One place derives them, so a setting added to ``HyperCommGrid.__init__``
takes part in the guard's request (`settings`) and is kept by grids built from
another (a view, ``shrink``'s successor: `init_kwargs`) without anyone listing it.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping, Sequence
from typing import Any

from hypergrid.binding.options import describe_options

__all__ = ["LOCAL_SETTINGS", "describe", "init_kwargs", "settings"]

#: Constructor settings that take no part in the guard's request: they change nothing other ranks see.
LOCAL_SETTINGS = frozenset({"guard_progress_s"})
#: Constructor arguments that the grid's description already holds.
_DESCRIBED = frozenset({"shape", "dim_names", "rank_offset"})

_TIMES = "\u00d7"  # the multiplication sign (U+00D7) between the dims of a grid's short name

_SETTING_NAMES: dict[type, tuple[str, ...]] = {}


def _setting_names(cls: type) -> tuple[str, ...]:
    """The constructor's parameters that must agree across ranks, in signature order."""
    if cls not in _SETTING_NAMES:
        parameters = inspect.signature(cls).parameters
        _SETTING_NAMES[cls] = tuple(name for name in parameters if name not in _DESCRIBED | LOCAL_SETTINGS)
    return _SETTING_NAMES[cls]


def _setting_text(value: object) -> str:
    """A setting as text equal on every rank that has it equal (mappings in sorted order)."""
    if isinstance(value, Mapping):
        return describe_options(value)
    return repr(value)


def describe(dim_names: Sequence[str], shape: Sequence[int], rank_offset: int, backend: str | None) -> str:
    """A grid in a few characters: ``tp2``, ``dp4`` joined by U+00D7 (``name=size`` after a final digit).

    Examples:
        >>> describe(["tp", "dp"], [2, 4], 0, None) == "tp2" + chr(0xD7) + "dp4"
        True
        >>> describe(["x1"], [3], 8, "gloo")
        'x1=3 from rank 8 (gloo)'
    """
    text = _TIMES.join(
        f"{name}={size}" if name[-1].isdigit() else f"{name}{size}" for name, size in zip(dim_names, shape)
    )
    if rank_offset:
        text += f" from rank {rank_offset}"
    return text if backend is None else f"{text} ({backend})"


def init_kwargs(root: Any) -> dict[str, Any]:
    """Every constructor argument of ``root``'s class but the shape, names and offset, as ``root`` holds it."""
    names = inspect.signature(type(root)).parameters
    return {name: getattr(root, name) for name in names if name not in _DESCRIBED}


def settings(root: Any) -> tuple[tuple[str, str], ...]:
    """Every constructor setting of ``root`` that must agree across ranks, as (name, text), in signature order.

    The grid's description holds shape, names and offset; settings that
    change nothing the other ranks see (`LOCAL_SETTINGS`) take no part.
    """
    return tuple((name, _setting_text(getattr(root, name))) for name in _setting_names(type(root)))
