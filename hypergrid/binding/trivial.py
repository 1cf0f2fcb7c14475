"""Families that need no new communicator: groups of one rank, and one group that is the whole world.

A family whose every group holds one rank gets a local group of torch's ``"fake"`` backend (every collective the
identity); a family that is one group of every rank of the world is the default group itself; docs/communicators.md
says which families qualify (the default group's backend, no tag, no options of their own). In a world of one rank
the default group serves both kinds.

Examples:
    >>> from hypergrid.layout.economy import PartitionSignature
    >>> trivial_kind(PartitionSignature(0, 8, ()), world=8, backend=None, tag=None, options={})
    'one-rank'
    >>> trivial_kind(PartitionSignature(0, 8, ((1, 8),)), world=8, backend=None, tag=None, options={})
    'world'
    >>> trivial_kind(PartitionSignature(0, 8, ()), world=8, backend=None, tag="ag", options={}) is None
    True
"""

from __future__ import annotations

from typing import Any

import torch.distributed as dist

from hypergrid.layout.economy import PartitionSignature

__all__ = ["trivial_group", "trivial_kind"]


def trivial_kind(
    signature: PartitionSignature, *, world: int, backend: str | None, tag: str | None, options: dict[str, Any]
) -> str | None:
    """``"one-rank"``, ``"world"``, or None when the family needs groups of its own (see the module docstring)."""
    if tag is not None or options.get("timeout") is not None or options.get("pg_options") is not None:
        return None
    if backend is not None and backend != dist.get_backend():
        return None
    whole = signature.num_groups == 1 and (signature.first_rank, signature.size) == (0, world)
    if whole and options.get("group_desc") is None:
        return "world"
    if signature.group_size == 1 and not whole:
        return "one-rank"
    return None


def _register_fake_backend() -> None:
    """Register torch's ``"fake"`` backend (torch's FSDP imports the same module for it)."""
    import torch.testing._internal.distributed.fake_pg  # noqa: F401


def trivial_group(kind: str, signature: PartitionSignature, group_desc: str | None) -> Any:
    """The caller's group of a family of ``kind``: the default group, a one-rank fake group, or None outside."""
    if kind == "world":
        return dist.GroupMember.WORLD
    rank = dist.get_rank()
    if not signature.first_rank <= rank < signature.first_rank + signature.size:
        return None
    _register_fake_backend()
    return dist.new_group([rank], backend="fake", use_local_synchronization=True, group_desc=group_desc)
