"""Communicator economy, torch side: the sharing pool, and ``Communicators``: its sharing and ``communicators()``.

A grid and its views keep one ``GroupPool``. Every family a grid creates is
*held* under its registry key; the pool maps a sharing key — the family's
partition signature (``hypergrid.layout.economy``), backend, options description and
tag — to one process group object and the keys that hold it. Families with the
same sharing key get the same object; ``destroy`` releases keys, and a group is
destroyed once, when its last key is released (never the default group).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch.distributed as dist

from hypergrid.binding.facet import Facet
from hypergrid.binding.options import describe_options
from hypergrid.binding.registry import PgKey, guard_key
from hypergrid.binding.trivial import trivial_group, trivial_kind
from hypergrid.layout import GridLayout
from hypergrid.layout.economy import PartitionSignature, partition_signature

__all__ = ["Communicators", "GroupPool", "PoolEntry", "share_key"]


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
        self._release_listeners: list[Callable[[list[Hashable]], None]] = []

    def on_release(self, listener: Callable[[list[Hashable]], None]) -> None:
        """Call ``listener(holders)`` on every ``release`` (the grid's DeviceMeshes forget what they held)."""
        self._release_listeners.append(listener)

    def shared(
        self,
        layout: GridLayout,
        dims: Sequence[str],
        key: PgKey,
        backend: str | None,
        options: dict[str, Any],
        tag: str | None,
        share_groups: bool,
    ) -> tuple[Hashable, PoolEntry | None]:
        """The pool key of a family, and the entry of the group already made for it, if any.

        With sharing off (``share_groups`` False), the pool key is the family's registry key: nothing shares.
        """
        partition = partition_signature(layout, list(dims)) if share_groups else key
        # group_desc only labels a group: it takes no part in sharing.
        sharing = share_key(partition, backend, describe_options(options, skip=("group_desc",)), tag)
        return sharing, self.find(sharing)

    def keep(
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
        if shared is not None:
            return self.hold(sharing, key).group
        group = _without_communicator(sharing, backend, tag, options)
        if group is _CREATE:
            group = create()
        self.add(sharing, group, key, backend=backend, tag=tag, options=describe_options(options))
        return group

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

    def release_registry(self, registry: dict[Any, Any], keys: Sequence[Hashable]) -> list[Any]:
        """Drop ``keys`` from ``registry`` and the pool; return the groups to destroy, each once.

        Those are the pooled groups no key holds any more, and the groups placed in
        the registry from outside the pool (Megatron's code and tests assign
        ``_pgs``; creations before ``init_process_group`` are not pooled), never
        ``None``, ``NON_GROUP_MEMBER`` or the default group.

        Examples:
            >>> pool, registry, group = GroupPool(), {}, object()
            >>> registry.update({"tp": group, "dp": group, "pp": None})  # placed from outside
            >>> pool.release_registry(registry, ["tp", "dp", "pp"]) == [group], registry
            (True, {})
        """
        outside = [registry[key] for key in keys if key not in self._share_key_of]
        for key in keys:
            del registry[key]
        freed = self.release(keys)
        for group in outside:
            if _is_group(group) and all(group is not other for other in freed):
                freed.append(group)
        return freed

    def release(self, holders: Iterable[Hashable]) -> list[Any]:
        """Drop ``holders``; return the groups no key holds any more (each once, to destroy).

        Never returns the default group, ``None`` or a non-member marker.
        """
        holders = list(holders)
        for listener in self._release_listeners:
            listener(holders)
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


def _is_group(value: Any) -> bool:
    """A registry value that may be a group to destroy: not None, not a non-member marker, not the default group."""
    return value is not None and value is not dist.GroupMember.NON_GROUP_MEMBER and value is not dist.group.WORLD


def share_key(
    signature: PartitionSignature | Hashable, backend: str | None, options: str, tag: str | None
) -> tuple[Hashable, str | None, str, str | None]:
    """The pool key: groups share exactly when partition, backend, options and tag are all equal.

    With sharing off, pass a signature unique to the family (its registry key).
    """
    return (signature, backend, options, tag)


_CREATE = object()


def _without_communicator(sharing: Hashable, backend: str | None, tag: str | None, options: dict[str, Any]) -> Any:
    """The group of a shared family that needs no new communicator (``hypergrid.binding.trivial``), else _CREATE.

    Only with sharing on (the pool key then holds the family's partition): with
    it off every family gets groups of its own, as Megatron makes them.
    """
    signature = sharing[0] if isinstance(sharing, tuple) else None
    if not isinstance(signature, PartitionSignature) or not dist.is_initialized():
        return _CREATE
    kind = trivial_kind(signature, world=dist.get_world_size(), backend=backend, tag=tag, options=options)
    return _CREATE if kind is None else trivial_group(kind, signature, options.get("group_desc"))


class Communicators(Facet):
    """The pool's report (a facet object)."""

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
        for entry in self._core.registry.pool.entries():
            if not isinstance(entry.group, dist.ProcessGroup):
                continue
            ranks = dist.get_process_group_ranks(entry.group)
            report.append(
                {
                    "ranks": ranks,
                    "size": len(ranks),
                    "backend": str(dist.get_backend(entry.group)),
                    "tag": entry.tag,
                    "keys": [guard_key(key) for key in entry.holders.values()],
                    "options": entry.options,
                }
            )
        return report
