"""Options of a family's groups: tags, grid-wide and per-call options, backends, stable descriptions (no torch).

``create_pg(dims, tag=..., backend=..., timeout=..., pg_options=..., group_desc=...)``
and ``HyperCommGrid(..., group_options=...)`` are checked here; the guard and the
sharing pool compare options by the descriptions made here, never by object
identity, so they are equal on every rank that asks for the same settings.
"""

from __future__ import annotations

import datetime
import re
from collections.abc import Iterable, Mapping
from typing import Any

from hypergrid.errors import BackendError, InvalidArgumentError, UnexpectedArgumentError

__all__ = [
    "GROUP_OPTIONS",
    "check_group_options",
    "check_tag",
    "describe_options",
    "describe_pg_options",
    "family_options",
    "normalize_backend",
]

#: Options a family's groups accept (passed on to torch), grid-wide or per call.
GROUP_OPTIONS = ("timeout", "pg_options", "group_desc")

_TAG = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,31}")

# Attributes torch writes into a pg_options object when it creates a group with it (NCCL, torch
# 2.13): describing them would make the same options look different before and after first use.
_SET_BY_TORCH = frozenset({"global_ranks_in_group", "group_name", "_timeout", "split_from", "split_color"})


def check_tag(tag: object) -> str | None:
    """Validate a communicator tag: ``None`` or a short identifier (letters, digits, ``_``; at most 32).

    Raises:
        InvalidArgumentError: anything else.

    Examples:
        >>> check_tag("ag"), check_tag(None)
        ('ag', None)
        >>> check_tag("all gather")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
          ...
        hypergrid.errors.InvalidArgumentError: tag must be None or a short identifier ...
    """
    if tag is None or (isinstance(tag, str) and _TAG.fullmatch(tag)):
        return tag
    raise InvalidArgumentError(
        "tag must be None or a short identifier (a letter or '_', then up to 31 letters, digits "
        f"or '_'), such as 'ag' or 'cpu'; got {tag!r}"
    )


def check_group_options(options: Mapping[str, Any] | None, what: str = "group_options") -> dict[str, Any]:
    """Validate options for a family's groups: names among ``GROUP_OPTIONS``, values of the right kind.

    Args:
        options: ``timeout`` (a positive ``datetime.timedelta``), ``pg_options``
            (a backend options object) and ``group_desc`` (a str); ``None``
            values are dropped.
        what: how the caller names them, for messages.

    Raises:
        UnexpectedArgumentError: ``options`` is not a mapping, or has an unknown name.
        InvalidArgumentError: a bad ``timeout`` or ``group_desc``.

    Examples:
        >>> import datetime
        >>> check_group_options({"timeout": datetime.timedelta(seconds=60), "group_desc": None})
        {'timeout': datetime.timedelta(seconds=60)}
        >>> check_group_options({"timout": 1})  # doctest: +ELLIPSIS
        Traceback (most recent call last):
          ...
        hypergrid.errors.UnexpectedArgumentError: group_options has unknown option(s) ['timout']; accepted: [...]
    """
    if options is None:
        return {}
    if not isinstance(options, Mapping):
        raise UnexpectedArgumentError(f"{what} must be a dict of {list(GROUP_OPTIONS)}, got {options!r}")
    unknown = sorted(map(str, set(options) - set(GROUP_OPTIONS)))
    if unknown:
        raise UnexpectedArgumentError(f"{what} has unknown option(s) {unknown}; accepted: {list(GROUP_OPTIONS)}")
    checked = {name: options[name] for name in GROUP_OPTIONS if options.get(name) is not None}
    timeout = checked.get("timeout")
    if timeout is not None and not (isinstance(timeout, datetime.timedelta) and timeout.total_seconds() > 0):
        raise InvalidArgumentError(f"timeout must be a positive datetime.timedelta or None, got {timeout!r}")
    desc = checked.get("group_desc")
    if desc is not None and not isinstance(desc, str):
        raise InvalidArgumentError(f"group_desc must be a str or None, got {desc!r}")
    return checked


def normalize_backend(backend: object, what: str) -> str | None:
    """``None``, or a backend name in lower case.

    Raises:
        BackendError: anything else.

    Examples:
        >>> normalize_backend("NCCL", "backend"), normalize_backend(None, "backend")
        ('nccl', None)
    """
    if backend is None:
        return None
    if not isinstance(backend, str) or not backend:
        raise BackendError(f"{what} must be None or a backend name such as 'nccl' or 'gloo', got {backend!r}")
    return backend.lower()


def family_options(
    kwargs: Mapping[str, Any], defaults: Mapping[str, Any], grid_backend: str | None, tag: str | None
) -> tuple[str | None, dict[str, Any]]:
    """The backend and checked options of one ``create_pg`` call: the grid's defaults, overridden by the call.

    Args:
        kwargs: the call's keyword arguments (``GROUP_OPTIONS`` and ``backend``).
        defaults: the grid's checked ``group_options``.
        grid_backend: the grid's backend (``None``: the default group's).
        tag: the family's tag; only a tagged family may use another backend.

    Raises:
        UnexpectedArgumentError: an unknown keyword argument.
        BackendError: a bad backend, or another backend than the grid's on an untagged family.
        InvalidArgumentError: a bad option value.

    Examples:
        >>> family_options({"backend": "gloo"}, {"group_desc": "DP"}, "nccl", "cpu")
        ('gloo', {'group_desc': 'DP'})
    """
    unknown = sorted(set(kwargs) - set(GROUP_OPTIONS) - {"backend"})
    if unknown:
        raise UnexpectedArgumentError(
            f"create_pg got unexpected keyword argument(s) {unknown}; accepted: "
            f"{[*GROUP_OPTIONS, 'backend', 'tag', 'strategy']}"
        )
    options = check_group_options({**defaults, **{name: kwargs[name] for name in GROUP_OPTIONS if name in kwargs}})
    asked = normalize_backend(kwargs.get("backend"), "create_pg's backend")
    if asked is None or asked == grid_backend:
        return grid_backend, options
    if tag is None and grid_backend is not None:
        raise BackendError(
            f"create_pg was asked for backend {kwargs['backend']!r} but this grid was built with backend "
            f"{grid_backend!r}; give the family a tag (create_pg(..., backend={kwargs['backend']!r}, tag='cpu')) "
            "for a second communicator on another backend"
        )
    return asked, options


def describe_pg_options(pg_options: object, depth: int = 2) -> str:
    """A stable description of a backend options object: its type and settable values, not its identity.

    Two options objects with the same settings describe alike on every rank;
    the attributes torch writes into it at group creation are left out.

    Examples:
        >>> import torch.distributed as dist
        >>> options = dist.ProcessGroupGloo._Options()
        >>> describe_pg_options(options) == describe_pg_options(dist.ProcessGroupGloo._Options())
        True
        >>> describe_pg_options(None)
        'None'
    """
    if pg_options is None or isinstance(pg_options, (bool, int, float, str)):
        return repr(pg_options)
    if isinstance(pg_options, datetime.timedelta):
        return f"{pg_options.total_seconds():g}s"
    if isinstance(pg_options, (list, tuple)):
        return "[" + ", ".join(describe_pg_options(item, depth - 1) for item in pg_options) + "]"
    kind = type(pg_options).__qualname__
    if depth <= 0:
        return kind
    fields = []
    for name in sorted(dir(pg_options)):
        if name.startswith("__") or name in _SET_BY_TORCH or name == "_pybind11_conduit_v1_":
            continue
        try:
            value = getattr(pg_options, name)
        except Exception:  # a property that cannot be read is not part of the description
            continue
        if callable(value):
            continue
        fields.append(f"{name}={describe_pg_options(value, depth - 1)}")
    return f"{kind}({', '.join(fields)})"


def describe_options(options: Mapping[str, Any], skip: Iterable[str] = ()) -> str:
    """The description of checked group options that ranks compare and the pool keys on.

    Args:
        options: checked options (``check_group_options``).
        skip: option names to leave out (``group_desc``, a mere label, takes no
            part in sharing).

    Examples:
        >>> import datetime
        >>> describe_options({"timeout": datetime.timedelta(minutes=2), "group_desc": "DP"})
        "timeout=120s group_desc='DP'"
        >>> describe_options({})
        'defaults'
    """
    parts = []
    for name in GROUP_OPTIONS:
        if name in options and name not in skip:
            parts.append(f"{name}={describe_pg_options(options[name])}")
    return " ".join(parts) or "defaults"
