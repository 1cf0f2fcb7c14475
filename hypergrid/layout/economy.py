"""Communicator economy, offline: which families have identical groups, and what sharing saves (no torch).

The family over dims ``D`` of a grid partitions its ranks: two ranks are in
the same group when their coordinates agree on every dim outside ``D``. A dim
of size 1 changes nothing, so families that differ only by size-1 dims have
the same partition; a family whose dims all have size 1 puts every rank in a
group of its own. Across two factorizations of the same ranks (a grid and its
views) equal partitions can come from different dims.

``partition_signature`` names a partition in O(ndim), the same on every rank, with no enumeration; equal
signatures are equal partitions (docs/communicators.md says how, and why every rank then decides alike).

Examples:
    >>> from hypergrid.layout import GridLayout
    >>> layout = GridLayout([2, 1, 4], ["tp", "cp", "dp"])
    >>> partition_signature(layout, "cp-tp") == partition_signature(layout, "tp")
    True
    >>> plan = plan_communicators(layout)
    >>> plan.without_sharing, plan.with_sharing
    (7, 4)
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from hypergrid.errors import GridSpecError
from hypergrid.layout import Dims, GridLayout
from hypergrid.values import shown

__all__ = [
    "CommunicatorPlan",
    "PartitionSignature",
    "SharedCommunicator",
    "key_label",
    "partition_signature",
    "plan_communicators",
]


class PartitionSignature(NamedTuple):
    """A canonical name of the partition a family makes of a grid's ranks.

    Attributes:
        first_rank: the grid's first rank.
        size: number of ranks the grid covers.
        blocks: ``(stride, size)`` of each maximal run of the family's
            non-trivial dims, innermost first; empty for single-rank groups.
    """

    first_rank: int
    size: int
    blocks: tuple[tuple[int, int], ...]

    @property
    def group_size(self) -> int:
        """Number of ranks in each group."""
        return math.prod(size for _, size in self.blocks)

    @property
    def num_groups(self) -> int:
        """Number of groups of the partition."""
        return self.size // self.group_size


def partition_signature(layout: GridLayout, dims: Dims) -> PartitionSignature:
    """The canonical signature of the partition the family over ``dims`` makes; O(ndim).

    Args:
        layout: the grid (or view) layout.
        dims: the family's dims, in any order.

    Returns:
        Equal for two families (of layouts over the same ranks) exactly when
        their groups are the same sets of ranks.

    Raises:
        DimsError: unknown, repeated or no dims.

    Examples:
        >>> grid = GridLayout([2, 4], ["tp", "dp"])
        >>> view = GridLayout([2, 2, 2], ["tp", "cp", "ep"])
        >>> partition_signature(grid, "dp") == partition_signature(view, "ep-cp")
        True
        >>> partition_signature(GridLayout([1, 8], ["tp", "dp"]), "tp")
        PartitionSignature(first_rank=0, size=8, blocks=())
    """
    chosen = set(layout.dim_indices(dims))
    blocks: list[tuple[int, int]] = []
    for i, (stride, size) in enumerate(zip(layout.strides, layout.shape)):
        if size == 1 or i not in chosen:
            continue
        if blocks and blocks[-1][0] * blocks[-1][1] == stride:
            # Adjacent in the stride chain (only size-1 dims between): one block.
            blocks[-1] = (blocks[-1][0], blocks[-1][1] * size)
        else:
            blocks.append((stride, size))
    return PartitionSignature(layout.rank_offset, layout.size, tuple(blocks))


@dataclass
class SharedCommunicator:
    """One communicator per rank that serves several families (or one).

    Attributes:
        signature: the partition its groups make.
        keys: the families it serves, in the order asked (labels as given).
    """

    signature: PartitionSignature
    keys: list[Any] = field(default_factory=list)

    @property
    def group_size(self) -> int:
        """Ranks per group (1: each rank alone)."""
        return self.signature.group_size

    @property
    def num_groups(self) -> int:
        """Groups in the family (what ``enumerate`` calls ``new_group`` for on every rank)."""
        return self.signature.num_groups


@dataclass
class CommunicatorPlan:
    """What a set of families costs each rank of the grid, with and without sharing.

    Attributes:
        communicators: one entry per distinct partition, in first-asked order.
    """

    communicators: list[SharedCommunicator]

    @property
    def without_sharing(self) -> int:
        """Communicators each rank of the grid holds with one group per family (Megatron, DeviceMesh)."""
        return sum(len(entry.keys) for entry in self.communicators)

    @property
    def with_sharing(self) -> int:
        """Communicators each rank of the grid holds when identical groups are shared."""
        return len(self.communicators)

    @property
    def new_group_calls_without_sharing(self) -> int:
        """``new_group`` calls per rank with strategy ``enumerate`` and one group per family."""
        return sum(entry.num_groups * len(entry.keys) for entry in self.communicators)

    @property
    def new_group_calls_with_sharing(self) -> int:
        """``new_group`` calls per rank with strategy ``enumerate`` and sharing."""
        return sum(entry.num_groups for entry in self.communicators)

    def to_dict(self) -> dict[str, Any]:
        """The plan as plain data (the ``--json`` form)."""
        return {
            "communicators": [
                {
                    "keys": [key_label(key) for key in entry.keys],
                    "group_size": entry.group_size,
                    "num_groups": entry.num_groups,
                    "blocks": [list(block) for block in entry.signature.blocks],
                }
                for entry in self.communicators
            ],
            "per_rank": {"without_sharing": self.without_sharing, "with_sharing": self.with_sharing},
            "new_group_calls_per_rank": {
                "without_sharing": self.new_group_calls_without_sharing,
                "with_sharing": self.new_group_calls_with_sharing,
            },
        }

    def render(self) -> str:
        """The plan as a table: one row per communicator, the families it serves, then the totals."""
        lines = [f"{'#':>3} {'size':>6} {'groups':>7}  families sharing one communicator"]
        for number, entry in enumerate(self.communicators):
            note = "  (each rank alone)" if entry.group_size == 1 else ""
            keys = ", ".join(key_label(key) for key in entry.keys)
            lines.append(f"{number:>3} {entry.group_size:>6} {entry.num_groups:>7}  {keys}{note}")
        lines += [
            "",
            f"communicators per rank: {self.without_sharing} one per family (Megatron-style), "
            f"{self.with_sharing} shared (hypergrid)",
            f"new_group calls per rank (strategy 'enumerate'): {self.new_group_calls_without_sharing} "
            f"one per family, {self.new_group_calls_with_sharing} shared",
        ]
        return "\n".join(lines)


def key_label(key: Any) -> str:
    """A registry key as text: a base key as is, a view-private ``(view, dims)`` key as ``"view:dims"``.

    Examples:
        >>> key_label("dp-tp"), key_label(("expert", ("edp", "ep")))
        ('dp-tp', 'expert:edp-ep')
    """
    if isinstance(key, tuple) and len(key) == 2 and isinstance(key[1], tuple):
        return f"{key[0]}:{'-'.join(map(str, key[1]))}"
    return str(key)


def plan_communicators(
    layout: GridLayout,
    families: Iterable[Dims] | None = None,
    views: Sequence[tuple[str, GridLayout, Iterable[Dims]]] = (),
) -> CommunicatorPlan:
    """Which families collapse into one communicator, and how many each rank needs.

    Args:
        layout: the grid.
        families: the grid's families to create (default: all of them).
        views: ``(name, view layout, families)`` for views of the grid (same
            ranks); a view family is labelled ``"name:key"``.

    Returns:
        The plan; counts are per rank of the grid (every rank of it holds the
        same number; ranks outside it hold none).

    Raises:
        DimsError: a family names an unknown dim.
        GridSpecError: a view does not cover the grid's ranks.

    Examples:
        >>> layout = GridLayout([2, 1, 2], ["tp", "cp", "dp"])
        >>> print(plan_communicators(layout, ["tp", "cp-tp", "cp", "dp"]).render())
          #   size  groups  families sharing one communicator
          0      2       2  tp, cp-tp
          1      1       4  cp  (each rank alone)
          2      2       2  dp
        <BLANKLINE>
        communicators per rank: 4 one per family (Megatron-style), 3 shared (hypergrid)
        new_group calls per rank (strategy 'enumerate'): 10 one per family, 8 shared
    """
    requests: list[tuple[Any, GridLayout, Dims]] = [
        (layout.key(dims), layout, dims) for dims in (layout.all_families() if families is None else families)
    ]
    for name, view, view_families in views:
        if (view.rank_offset, view.size) != (layout.rank_offset, layout.size):
            raise GridSpecError(
                f"view {shown(name)} covers ranks {view.rank_offset}..{view.rank_offset + view.size - 1}, "
                f"not the grid's {layout.rank_offset}..{layout.rank_offset + layout.size - 1}"
            )
        requests += [((name, view.canonical_dims(dims)), view, dims) for dims in view_families]
    by_signature: dict[PartitionSignature, SharedCommunicator] = {}
    for key, where, dims in requests:
        signature = partition_signature(where, dims)
        entry = by_signature.setdefault(signature, SharedCommunicator(signature))
        if key not in entry.keys:
            entry.keys.append(key)
    return CommunicatorPlan(list(by_signature.values()))
