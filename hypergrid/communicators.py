"""Communicator economy, torch side: tags, per-family options, the sharing pool and ``communicators()``.

A grid and its views keep one ``GroupPool``. Every family a grid creates is
*held* under its registry key; the pool maps a sharing key — the family's
partition signature (``hypergrid.economy``), backend, options description and
tag — to one process group object and the keys that hold it. Families with the
same sharing key get the same object; ``destroy`` releases keys, and a group is
destroyed once, when its last key is released (never the default group).
"""

from __future__ import annotations

import datetime
import re
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch.distributed as dist

from hypergrid.economy import PartitionSignature, partition_signature
from hypergrid.errors import BackendError, InvalidArgumentError, UnexpectedArgumentError
from hypergrid.facet import GridFacet
from hypergrid.layout import GridLayout
from hypergrid.registry import PgKey, guard_key

__all__ = [
    "GROUP_OPTIONS",
    "Communicators",
    "GroupPool",
    "PoolEntry",
    "check_group_options",
    "check_tag",
    "describe_options",
    "describe_pg_options",
    "family_options",
    "normalize_backend",
    "share_key",
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


@dataclass
class PoolEntry:
    """One process group object and what it serves.

    Attributes:
        group: the caller's group (``None`` or a non-member marker where it holds none).
        backend: the backend asked for (``None``: the default group's).
        tag: the communicator tag, or ``None``.
        options: the options description.
        holders: who holds the group (a grid and one of its keys), each with the
            registry key to show for it, in the order they were added.
    """

    group: Any
    backend: str | None
    tag: str | None
    options: str
    holders: dict[Hashable, Hashable] = field(default_factory=dict)


def _destroyable(group: Any) -> bool:
    return isinstance(group, dist.ProcessGroup) and group is not dist.GroupMember.WORLD


class GroupPool:
    """Process group objects shared by the families of a grid and its views, reference-counted by key.

    Examples:
        >>> pool = GroupPool()
        >>> pool.find("share") is None
        True
        >>> entry = pool.add("share", "sentinel", "dp", backend=None, tag=None, options="defaults")
        >>> pool.hold("share", "cp-dp").group, pool.keys_of("share")
        ('sentinel', ['dp', 'cp-dp'])
        >>> pool.release(["dp"]), pool.find("share") is None  # still held by "cp-dp"
        ([], False)
        >>> pool.release(["cp-dp"]), pool.find("share") is None  # (a str is no group to destroy)
        ([], True)
    """

    def __init__(self) -> None:
        self._entries: dict[Hashable, PoolEntry] = {}
        self._share_key_of: dict[Hashable, Hashable] = {}

    def find(self, share_key: Hashable) -> PoolEntry | None:
        """The entry for ``share_key``, if a group was created for it."""
        return self._entries.get(share_key)

    def add(
        self,
        share_key: Hashable,
        group: Any,
        holder: Hashable,
        label: Hashable = None,
        *,
        backend: str | None,
        tag: str | None,
        options: str,
    ) -> PoolEntry:
        """Record a newly created group under ``share_key``, held by ``holder`` (shown as ``label``)."""
        self._entries[share_key] = PoolEntry(group, backend, tag, options)
        return self.hold(share_key, holder, label)

    def hold(self, share_key: Hashable, holder: Hashable, label: Hashable = None) -> PoolEntry:
        """Let ``holder`` use the group of ``share_key``; ``label`` (default: ``holder``) names it in reports."""
        entry = self._entries[share_key]
        entry.holders[holder] = holder if label is None else label
        self._share_key_of[holder] = share_key
        return entry

    def keys_of(self, share_key: Hashable) -> list[Hashable]:
        """The labels of the keys the group of ``share_key`` serves, in the order they were added."""
        return list(self._entries[share_key].holders.values())

    def entries(self) -> list[PoolEntry]:
        """Every entry, in creation order."""
        return list(self._entries.values())

    def release(self, holders: Iterable[Hashable]) -> list[Any]:
        """Drop ``holders``; return the groups no key holds any more (each once, to destroy).

        Never returns the default group, ``None`` or a non-member marker.
        """
        freed = []
        for holder in holders:
            share_key = self._share_key_of.pop(holder, None)
            if share_key is None:
                continue
            entry = self._entries[share_key]
            del entry.holders[holder]
            if not entry.holders:
                del self._entries[share_key]
                if _destroyable(entry.group):
                    freed.append(entry.group)
        return freed


def share_key(
    signature: PartitionSignature | Hashable, backend: str | None, options: str, tag: str | None
) -> tuple[Hashable, str | None, str, str | None]:
    """The pool key: groups share exactly when partition, backend, options and tag are all equal.

    With sharing off, pass a signature unique to the family (its registry key).
    """
    return (signature, backend, options, tag)


class Communicators(GridFacet):
    """The report of the communicators a rank holds through a grid (a mixin of ``HyperCommGrid``)."""

    if TYPE_CHECKING:  # provided by HyperCommGrid (hypergrid.grid)
        _root: Communicators
        _pool: GroupPool
        share_groups: bool

    def _shared(
        self,
        layout: GridLayout,
        dims: Sequence[str],
        key: PgKey,
        backend: str | None,
        options: dict[str, Any],
        tag: str | None,
    ) -> tuple[Hashable, PoolEntry | None]:
        """The pool key of a family, and the entry of the group already made for it, if any.

        With sharing off, the pool key is the family's registry key: nothing shares.
        """
        partition = partition_signature(layout, list(dims)) if self.share_groups else key
        # group_desc only labels a group: it takes no part in sharing.
        sharing = share_key(partition, backend, describe_options(options, skip=("group_desc",)), tag)
        return sharing, self._root._pool.find(sharing)

    def _keep(
        self,
        sharing: Hashable,
        shared: PoolEntry | None,
        key: PgKey,
        create: Callable[[], Any],
        backend: str | None,
        tag: str | None,
        options: dict[str, Any],
    ) -> Any:
        """The shared group, now held by ``key`` too, or a new one from ``create()``, pooled."""
        pool = self._root._pool
        if shared is not None:
            return pool.hold(sharing, key).group
        group = create()
        pool.add(sharing, group, key, backend=backend, tag=tag, options=describe_options(options))
        return group

    def communicators(self) -> list[dict[str, Any]]:
        """One entry per distinct process group this rank holds through the grid and its views.

        Tagged groups are included; families whose groups are shared appear
        once, with every key they serve. Entries come in creation order.

        Returns:
            Dicts with ``ranks``, ``size``, ``backend``, ``tag``, ``keys`` (the
            canonical keys served; a view's as ``"view:dims"``) and ``options``
            (the options description).

        Examples:
            >>> import torch.distributed as dist
            >>> from hypergrid import HyperCommGrid
            >>> dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
            >>> grid = HyperCommGrid([1, 1], ["tp", "dp"])
            >>> grid.pg("tp") is grid.pg("dp-tp")
            True
            >>> [(c["ranks"], c["keys"]) for c in grid.communicators()]
            [([0], ['tp', 'dp-tp'])]
            >>> grid.destroy(); dist.destroy_process_group()
        """
        report = []
        for entry in self._root._pool.entries():
            if not isinstance(entry.group, dist.ProcessGroup):
                continue
            ranks = dist.get_process_group_ranks(entry.group)
            report.append(
                {
                    "ranks": ranks,
                    "size": len(ranks),
                    "backend": str(dist.get_backend(entry.group)),
                    "tag": entry.tag,
                    "keys": [guard_key(key) for key in entry.holders.values()],  # type: ignore[arg-type]
                    "options": entry.options,
                }
            )
        return report
