"""Node awareness: which ranks share a node, which families cross nodes, and the LOCAL_RANK check.

A node is a block of ``ranks_per_node`` consecutive global ranks (what
``torchrun`` and most launchers give), ``LOCAL_WORLD_SIZE`` by default.
"""

from __future__ import annotations

import os
from typing import Any

from hypergrid.errors import WorldSizeError
from hypergrid.facet import GridFacet

__all__ = ["NodeAwareness"]


class NodeAwareness(GridFacet):
    """Node spans of families and the node-local ranks (a mixin of ``HyperCommGrid``)."""

    def node_report(self, ranks_per_node: int | None = None) -> list[dict[str, Any]]:
        """For each family, how many nodes its groups span (``ranks_per_node`` from ``LOCAL_WORLD_SIZE``).

        Examples:
            >>> from hypergrid import HyperCommGrid
            >>> [r["intra_node"] for r in HyperCommGrid([4, 2], ["tp", "dp"]).node_report(4)]
            [True, False, False]
        """
        return self.layout.node_report(_ranks_per_node(ranks_per_node))

    def node_ranks(self, rank: int | None = None, ranks_per_node: int | None = None) -> list[int]:
        """The ranks on ``rank``'s node (consecutive blocks of ``ranks_per_node`` global ranks).

        Examples:
            >>> from hypergrid import HyperCommGrid
            >>> HyperCommGrid([4, 2], ["tp", "dp"]).node_ranks(rank=5, ranks_per_node=4)
            [4, 5, 6, 7]
        """
        per_node = _ranks_per_node(ranks_per_node)
        first = self._rank(rank) // per_node * per_node
        return list(range(first, first + per_node))

    def check_local_rank(self, ranks_per_node: int | None = None) -> None:
        """Check that ``LOCAL_RANK`` is this process's position on its node (nanotron's assert).

        Raises:
            WorldSizeError: ``LOCAL_RANK`` is missing, or not ``rank % ranks_per_node``:
                the launcher placed ranks differently than the layout assumes.
        """
        per_node = _ranks_per_node(ranks_per_node)
        rank = self._rank(None)
        local = os.environ.get("LOCAL_RANK")
        if local is None or local.strip() != str(rank % per_node):
            raise WorldSizeError(
                f"LOCAL_RANK={local!r} on rank {rank}, but with {per_node} consecutive ranks per node it "
                f"should be {rank % per_node}: the launcher placed ranks differently than the grid assumes"
            )


def _ranks_per_node(ranks_per_node: int | None) -> int:
    if ranks_per_node is None:
        value = os.environ.get("LOCAL_WORLD_SIZE")
        if value is None:
            raise WorldSizeError("ranks_per_node not given and LOCAL_WORLD_SIZE is not set")
        try:
            ranks_per_node = int(value)
        except ValueError:
            raise WorldSizeError(f"LOCAL_WORLD_SIZE={value!r} is not an int") from None
    if isinstance(ranks_per_node, bool) or not isinstance(ranks_per_node, int) or ranks_per_node < 1:
        raise WorldSizeError(f"ranks_per_node must be a positive int, got {ranks_per_node!r}")
    return ranks_per_node
