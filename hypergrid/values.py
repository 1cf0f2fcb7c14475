"""Small pure helpers for checking values and writing messages (no torch)."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from hypergrid.errors import InvalidArgumentError

__all__ = ["as_int", "is_int", "check_timeout", "format_ranks"]


def as_int(value: object) -> int | None:
    """``value`` as a Python int if it is an integer (Python or numpy, not a bool), else None.

    Examples:
        >>> as_int(3), as_int(np.int64(3)), as_int(True), as_int(3.0)
        (3, 3, None, None)
    """
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        return None
    return int(value)


def is_int(value: object) -> bool:
    """Whether ``value`` is an integer (Python or numpy) and not a bool.

    Examples:
        >>> is_int(3), is_int(np.int64(3)), is_int(True), is_int(3.0)
        (True, True, False, False)
    """
    return as_int(value) is not None


def check_timeout(value: object, name: str) -> float:
    """A timeout in seconds: a positive int or float (not a bool).

    Examples:
        >>> check_timeout(2, "timeout_s")
        2.0
    """
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise InvalidArgumentError(f"{name} must be a positive number of seconds, got {value!r}")
    return float(value)


def format_ranks(ranks: Iterable[int]) -> str:
    """A compact, readable list of ranks: runs of consecutive ranks become ``a-b``.

    Examples:
        >>> format_ranks([7, 0, 1, 2, 3, 5])
        '0-3,5,7'
        >>> format_ranks([])
        'none'
    """
    ordered = sorted(set(ranks))
    if not ordered:
        return "none"
    parts = []
    start = previous = ordered[0]
    for rank in [*ordered[1:], None]:
        if rank is not None and rank == previous + 1:
            previous = rank
            continue
        parts.append(str(start) if start == previous else f"{start}-{previous}")
        if rank is not None:
            start = previous = rank
    return ",".join(parts)
