"""Options of a family's groups: tags, grid-wide and per-call options, backends, stable descriptions.

``create_pg(dims, tag=..., backend=..., timeout=..., pg_options=..., group_desc=...)``
and ``HyperCommGrid(..., group_options=...)`` are checked here, before any
communication; the guard and the sharing pool compare options by the
descriptions made here, never by object identity, so they are equal on every
rank that asks for the same settings. Backends are checked against what torch
accepts (a name, or ``"device:backend"`` pairs such as ``"cpu:gloo,cuda:nccl"``),
by name only: whether this machine's torch has it built in is torch's to say
when the groups are created (`unavailable_backend` then names it).
"""

from __future__ import annotations

import datetime
import re
from collections.abc import Iterable, Mapping
from typing import Any

import torch.distributed as dist

from hypergrid.errors import BackendError, InvalidArgumentError, UnexpectedArgumentError
from hypergrid.values import MAX_TIMEOUT_S, shown

__all__ = [
    "GROUP_OPTIONS",
    "check_group_options",
    "check_tag",
    "describe_options",
    "describe_pg_options",
    "family_options",
    "normalize_backend",
    "refuse_keywords",
    "unavailable_backend",
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
        f"or '_'), such as 'ag' or 'cpu'; got {shown(tag)}"
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
        raise UnexpectedArgumentError(f"{what} must be a dict of {list(GROUP_OPTIONS)}, got {shown(options)}")
    unknown = sorted(map(str, set(options) - set(GROUP_OPTIONS)))
    if unknown:
        raise UnexpectedArgumentError(f"{what} has unknown option(s) {unknown}; accepted: {list(GROUP_OPTIONS)}")
    checked = {name: options[name] for name in GROUP_OPTIONS if options.get(name) is not None}
    timeout = checked.get("timeout")
    if timeout is not None and not (
        isinstance(timeout, datetime.timedelta) and 0 < timeout.total_seconds() <= MAX_TIMEOUT_S
    ):
        raise InvalidArgumentError(
            f"timeout must be a positive datetime.timedelta of at most 100 years "
            f"({datetime.timedelta(seconds=MAX_TIMEOUT_S)}; torch's deadlines overflow beyond) or None, got "
            f"{shown(timeout)}"
        )
    desc = checked.get("group_desc")
    if desc is not None and not isinstance(desc, str):
        raise InvalidArgumentError(f"group_desc must be a str or None, got {shown(desc)}")
    return checked


_BACKEND_FORMS = "a backend name such as 'gloo' or 'nccl', or device:backend pairs such as 'cpu:gloo,cuda:nccl'"


def _known_backends() -> dict[str, tuple[str, ...]]:
    """Backend name -> the device types it serves, as this torch knows them (plugins included)."""
    known = {name: tuple(devices) for name, devices in dist.Backend.backend_capability.items()}
    for name in _plugins():
        known.setdefault(name, ("cpu", "cuda"))
    return known


def _plugins() -> set[str]:
    """Backends registered with ``dist.Backend.register_backend`` (torch keys them in upper case)."""
    return {str(name).lower() for name in getattr(dist.Backend, "_plugins", {})}


def normalize_backend(backend: object, what: str) -> str | None:
    """``None``, or a backend in a form torch accepts, in lower case: a name or ``device:backend`` pairs.

    Checks the spelling only (a grid may be planned for NCCL on a CPU machine);
    whether torch has it built in is torch's to say when groups are created.

    Raises:
        BackendError: not a str, an unknown backend name, ``"undefined"`` (use
            ``None``), or malformed, repeated or reversed (``"gloo:cpu"``) pairs.

    Examples:
        >>> normalize_backend("NCCL", "backend"), normalize_backend(None, "backend")
        ('nccl', None)
        >>> normalize_backend("CPU:gloo, cuda:nccl", "backend")
        'cpu:gloo,cuda:nccl'
        >>> normalize_backend("gloo:cpu", "backend")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
          ...
        hypergrid.errors.BackendError: backend 'gloo:cpu' has the pair 'gloo:cpu' reversed: ... such as 'cpu:gloo'
    """
    if backend is None:
        return None
    if not isinstance(backend, str) or not backend.strip():
        raise BackendError(f"{what} must be None or {_BACKEND_FORMS}; got {shown(backend)}")
    known = _known_backends()
    names = sorted(set(known) - {"undefined"})
    text = backend.strip().lower()
    if ":" not in text:
        if text not in names:
            raise BackendError(
                f"{what} {shown(backend)} is not a backend this torch knows; expected one of {names} or None"
            )
        return text
    devices = sorted({device for served in known.values() for device in served} | {"mps"})
    pairs: dict[str, str] = {}
    for pair in text.split(","):
        device, sep, name = (part.strip() for part in pair.partition(":"))
        if device in names and name in devices:
            raise BackendError(
                f"{what} {shown(backend)} has the pair {pair.strip()!r} reversed: pairs are device:backend, "
                f"such as {name + ':' + device!r}"
            )
        if not sep or ":" in name or device not in devices or name not in names:
            raise BackendError(
                f"{what} {shown(backend)}: {pair.strip()!r} is not a device:backend pair (devices {devices}, "
                f"backends {names}); expected {_BACKEND_FORMS}"
            )
        if device in pairs:
            raise BackendError(
                f"{what} {shown(backend)} names device {shown(device)} twice; give one backend per device"
            )
        pairs[device] = name
    return ",".join(f"{device}:{name}" for device, name in pairs.items())


def unavailable_backend(backend: str | None) -> str | None:
    """The first backend of a (normalized) backend string that this machine's torch was built without, or None.

    ``None`` (the default group's backend) is always available. Not a check
    before creation: a grid may name NCCL on a machine without it (planning,
    tests that stand in for torch's creation); torch refuses at creation time,
    and `hypergrid.binding.creation` uses this to say so in one line.

    Examples:
        >>> unavailable_backend("gloo"), unavailable_backend("cpu:gloo"), unavailable_backend(None)
        (None, None, None)
    """
    if backend is None:
        return None
    for name in sorted({pair.rpartition(":")[2] for pair in backend.split(",")}):
        probe = getattr(dist, f"is_{name}_available", None)
        if name not in _plugins() and (probe is None or not probe()):
            return name
    return None


def refuse_keywords(call: str, kwargs: Mapping[str, Any], hint: str) -> None:
    """Refuse keyword arguments a call does not take, naming them (a ``TypeError`` with a reason).

    Raises:
        UnexpectedArgumentError: ``kwargs`` is not empty.

    Examples:
        >>> refuse_keywords("get_pg", {}, "")
        >>> refuse_keywords("get_pg", {"ranks_per_node": 4}, "it only looks groups up")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
          ...
        hypergrid.errors.UnexpectedArgumentError: get_pg got unexpected keyword argument(s) ['ranks_per_node']: ...
    """
    if kwargs:
        raise UnexpectedArgumentError(f"{call} got unexpected keyword argument(s) {sorted(kwargs)}: {hint}")


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
        BackendError: a bad backend name, or another backend than the grid's on an
            untagged family (whether this machine's torch has it is torch's to say,
            when the groups are created).
        InvalidArgumentError: a bad option value.

    Examples:
        >>> family_options({"backend": "gloo"}, {"group_desc": "DP"}, "nccl", "cpu")
        ('gloo', {'group_desc': 'DP'})
    """
    unknown = {name: value for name, value in kwargs.items() if name not in (*GROUP_OPTIONS, "backend")}
    refuse_keywords("create_pg", unknown, f"accepted: {[*GROUP_OPTIONS, 'backend', 'tag', 'strategy']}")
    options = check_group_options({**defaults, **{name: kwargs[name] for name in GROUP_OPTIONS if name in kwargs}})
    asked = normalize_backend(kwargs.get("backend"), "create_pg's backend")
    if asked is None or asked == grid_backend:
        return grid_backend, options
    if tag is None and grid_backend is not None:
        raise BackendError(
            f"create_pg was asked for backend {shown(kwargs['backend'])} but this grid was built with backend "
            f"{shown(grid_backend)}; give the family a tag (create_pg(..., "
            f"backend={shown(kwargs['backend'])}, tag='cpu')) "
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
