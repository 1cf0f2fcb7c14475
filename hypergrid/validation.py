"""One rule for arguments: every public call refuses a bad argument before any work, in one line naming the call.

The rule: a public function or method checks each argument before it
communicates, creates anything, or allocates in proportion to a value, and
raises a ``HyperGridError`` (that is also the built-in a caller expects:
``ValueError`` for a bad value, ``TypeError`` for a bad type) whose message is
one line: the call, the argument, the value (shortened by
`hypergrid.values.shown`) and what was expected::

    shift: periodic=10: expected True or False

The ``check_*`` helpers here write that line; `public` and `public_methods`
(kept with the exceptions, in `hypergrid.errors`, re-exported here) make sure
the call named is the one the user made: an error raised anywhere below a
public call (a layout helper, a nested public call) leaves it with that call's
name in front, once (``is_first: dim=['tp', 'dp']: expected one dim name
...``, never the name of a helper it went through).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

import numpy as np

from hypergrid.errors import HyperGridError, InvalidArgumentError, public, public_methods
from hypergrid.values import as_int, as_number, check_timeout, shown

__all__ = [
    "check_bool",
    "check_choice",
    "check_int",
    "check_ints",
    "check_number",
    "check_str",
    "check_timeout",
    "public",
    "public_methods",
    "refuse",
]


def refuse(
    call: str, argument: str, value: object, expected: str, error: type[HyperGridError] = InvalidArgumentError
) -> HyperGridError:
    """The error for one bad argument: ``call: argument=value: expected ...`` (raise it).

    A helper that does not know the call passes ``call=""``: the public call
    it runs under puts its own name in front (`public`).

    Examples:
        >>> refuse("shift", "periodic", 10**5000, "True or False")
        InvalidArgumentError('shift: periodic=<an int of 16610 bits>: expected True or False')
    """
    return error(f"{call + ': ' if call else ''}{argument}={shown(value)}: expected {expected}")


def check_bool(call: str, argument: str, value: object) -> bool:
    """``value`` if it is ``True`` or ``False`` (numpy's too), else `refuse`.

    Examples:
        >>> check_bool("shift", "periodic", False)
        False
        >>> check_bool("shift", "periodic", 1)
        Traceback (most recent call last):
          ...
        hypergrid.errors.InvalidArgumentError: shift: periodic=1: expected True or False
    """
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    raise refuse(call, argument, value, "True or False")


def check_int(
    call: str,
    argument: str,
    value: object,
    minimum: int | None = None,
    maximum: int | None = None,
    error: type[HyperGridError] = InvalidArgumentError,
) -> int:
    """``value`` as an int (Python or numpy, not a bool) in ``minimum .. maximum``, else `refuse`.

    Examples:
        >>> check_int("spawn", "nprocs", 4, 1, 8)
        4
        >>> check_int("spawn", "nprocs", 2**31, 1, 1024)
        Traceback (most recent call last):
          ...
        hypergrid.errors.InvalidArgumentError: spawn: nprocs=2147483648: expected an int in 1..1024
    """
    number = as_int(value)
    if number is None or (minimum is not None and number < minimum) or (maximum is not None and number > maximum):
        raise refuse(call, argument, value, f"an int{_span(minimum, maximum)}", error)
    return number


def check_number(
    call: str,
    argument: str,
    value: object,
    minimum: float | None = None,
    maximum: float | None = None,
    *,
    positive: bool = False,
) -> float:
    """``value`` as a finite float (an int, float or numpy number; not a bool) within the bounds, else `refuse`.

    ``positive``: also above 0 (``minimum`` is then inclusive as usual).

    Examples:
        >>> check_number("Tier", "latency", 1e-6, 0)
        1e-06
        >>> check_number("average_gradients", "bucket_mb", float("nan"), positive=True)
        Traceback (most recent call last):
          ...
        hypergrid.errors.InvalidArgumentError: average_gradients: bucket_mb=nan: expected a finite number > 0
    """
    number = as_number(value)
    low_ok = number is not None and (minimum is None or number >= minimum) and (not positive or number > 0)
    if number is None or not low_ok or (maximum is not None and number > maximum):
        bounds = ["> 0" if positive else "", f">= {minimum:g}" if minimum is not None and not positive else ""]
        bounds.append(f"<= {maximum:g}" if maximum is not None else "")
        said = " and ".join(part for part in bounds if part)
        raise refuse(call, argument, value, f"a finite number{' ' + said if said else ''}")
    return number


def check_str(call: str, argument: str, value: object, pattern: str | None = None, expected: str = "a str") -> str:
    """``value`` if it is a str (matching ``pattern`` in full, if given), else `refuse` saying ``expected``.

    Examples:
        >>> check_str("rank_repr", "inner_sep", "_")
        '_'
        >>> check_str("rank_repr", "inner_sep", 3)
        Traceback (most recent call last):
          ...
        hypergrid.errors.InvalidArgumentError: rank_repr: inner_sep=3: expected a str
    """
    if isinstance(value, str) and (pattern is None or re.fullmatch(pattern, value)):
        return value
    raise refuse(call, argument, value, expected)


def check_choice(
    call: str, argument: str, value: object, choices: Sequence[str], error: type[HyperGridError] = InvalidArgumentError
) -> str:
    """``value`` if it is one of ``choices`` (strs), else `refuse` listing them.

    Examples:
        >>> check_choice("shrink", "policy", "drop", ["drop", "spare"])
        'drop'
        >>> check_choice("shrink", "policy", ["drop"], ["drop", "spare"])
        Traceback (most recent call last):
          ...
        hypergrid.errors.InvalidArgumentError: shrink: policy=['drop']: expected one of 'drop', 'spare'
    """
    if isinstance(value, str) and value in choices:
        return value
    raise refuse(call, argument, value, "one of " + ", ".join(repr(choice) for choice in choices), error)


def check_ints(
    call: str,
    argument: str,
    value: object,
    minimum: int | None = None,
    maximum: int | None = None,
    limit: int = 2**31,
    ordered: bool = False,
    error: type[HyperGridError] = InvalidArgumentError,
) -> list[int]:
    """``value`` as a list of ints within the bounds: a list, tuple, range, set or 1-D array (not a str), else `refuse`.

    ``limit``: the most items read (a longer value is refused before it is read in full).
    ``ordered``: the order means something (no sets).

    Examples:
        >>> check_ints("shrink", "dead", {3, 1}, 0)
        [1, 3]
        >>> check_ints("shrink", "dead", 3, 0)
        Traceback (most recent call last):
          ...
        hypergrid.errors.InvalidArgumentError: shrink: dead=3: expected a list of ints >= 0
    """
    words = f"a list of ints{_span(minimum, maximum)}"
    if isinstance(value, np.ndarray) and value.ndim == 1:
        items: Iterable[object] = value.tolist()
    elif isinstance(value, (list, tuple, range)) or (not ordered and isinstance(value, (set, frozenset))):
        items = value
    else:
        raise refuse(call, argument, value, words, error)
    if len(value) > limit:
        raise refuse(call, argument, value, f"{words}, at most {limit} of them", error)
    out = []
    for item in items:
        number = as_int(item)
        if number is None or (minimum is not None and number < minimum) or (maximum is not None and number > maximum):
            raise refuse(call, argument, value, f"{words}; {shown(item)} is not", error)
        out.append(number)
    return sorted(out) if isinstance(value, (set, frozenset)) else out


def _span(minimum: int | None, maximum: int | None) -> str:
    if minimum is not None and maximum is not None:
        return f" in {minimum}..{maximum}"
    if minimum is not None:
        return f" >= {minimum}"
    return "" if maximum is None else f" <= {maximum}"
