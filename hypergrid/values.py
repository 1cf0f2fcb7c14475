"""Small pure helpers for checking values and writing messages (no torch)."""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np

from hypergrid.errors import InvalidArgumentError, public

__all__ = [
    "MAX_TIMEOUT_S",
    "as_int",
    "as_number",
    "is_int",
    "check_timeout",
    "described",
    "first_line",
    "format_ranks",
    "shown",
]

#: The longest timeout hypergrid passes on (100 years, in seconds). torch and gloo turn a
#: timeout into a deadline, now + timeout, in int64 nanoseconds since 1970, which overflows at
#: 2262-04-11: measured on gloo (torch 2.13, late 2026), 85,000 days works, 86,000 days hangs
#: and 106,752 days fails at once. 100 years stays clear of that until about 2160.
MAX_TIMEOUT_S = 100 * 365.25 * 86400


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


def shown(value: object, limit: int = 120) -> str:
    """``repr(value)`` for a message: on one line, shortened past ``limit`` characters, and never an error.

    Python refuses to print an int of more than 4,300 digits (``ValueError``);
    a message that quotes one must not fail in its place.

    Examples:
        >>> shown(3), shown("x"), shown(10**5000), shown([10**5000])
        ('3', "'x'", '<an int of 16610 bits>', '<a list too long to print>')
        >>> shown(10**400)  # doctest: +ELLIPSIS
        '1000000000...(401 characters)'
    """
    try:
        text = repr(value)
    except ValueError:  # an int beyond the digit limit, or a container holding one
        if isinstance(value, int):
            return f"<an int of {value.bit_length()} bits>"
        return f"<a {type(value).__name__} too long to print>"
    if "\n" in text:  # a numpy array's repr: one line in a message
        text = " ".join(text.split())
    return text if len(text) <= limit else f"{text[: limit - 30]}...({len(text)} characters)"


def first_line(error: BaseException) -> str:
    """The first line of an error's message, or its class name when it has none (for one-line messages).

    Examples:
        >>> first_line(RuntimeError("Connection closed by peer\\nat pair.cc")), first_line(KeyError())
        ('Connection closed by peer', 'KeyError')
    """
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def described(error: BaseException) -> str:
    """An error as one line: its class and the first line of its message (torch's store errors carry C++ frames
    after it, which a launcher's report must not print).

    Examples:
        >>> described(RuntimeError("Connection reset by peer\\nException raised from recvBytes\\nframe #0: ..."))
        'RuntimeError: Connection reset by peer'
    """
    return f"{type(error).__name__}: {first_line(error)}"


def as_number(value: object) -> float | None:
    """``value`` as a finite float if it is a real number (int, float or numpy; not a bool), else None.

    Ints too large for a float (``10**400``), NaN and infinities are not numbers here.

    Examples:
        >>> as_number(3), as_number(np.float32(0.5)), as_number(10**400), as_number(float("nan")), as_number(True)
        (3.0, 0.5, None, None, None)
    """
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


@public
def check_timeout(value: object, name: str) -> float:
    """A timeout in seconds: a positive, finite number (not a bool) of at most `MAX_TIMEOUT_S`.

    Raises:
        InvalidArgumentError: anything else (the message names the value and the limit).

    Examples:
        >>> check_timeout(2, "timeout_s")
        2.0
        >>> check_timeout(1e12, "timeout_s")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
          ...
        hypergrid.errors.InvalidArgumentError: check_timeout: timeout_s=1000000000000.0: expected a positive number ...
    """
    if not isinstance(name, str):
        raise InvalidArgumentError(f"name={shown(name)}: expected the argument's name (a str)")
    number = as_number(value)
    if number is None or not 0 < number <= MAX_TIMEOUT_S:
        raise InvalidArgumentError(
            f"{name}={shown(value)}: expected a positive number of seconds up to {MAX_TIMEOUT_S:.0f} (100 years; "
            "longer deadlines overflow inside torch)"
        )
    return number


@public
def format_ranks(ranks: Iterable[int]) -> str:
    """A compact, readable list of ranks: runs of consecutive ranks become ``a-b``.

    Examples:
        >>> format_ranks([7, 0, 1, 2, 3, 5])
        '0-3,5,7'
        >>> format_ranks([])
        'none'
    """
    if not isinstance(ranks, (list, tuple, range, set, frozenset)) or not all(
        is_int(rank) and abs(rank) < 2**63 for rank in ranks
    ):
        raise InvalidArgumentError(f"ranks={shown(ranks)}: expected a list of ints (ranks)")
    ordered = sorted({int(rank) for rank in ranks})
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
