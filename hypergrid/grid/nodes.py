"""Node awareness: which ranks share a node, which families cross nodes, the node-local group.

A node is a block of ``ranks_per_node`` consecutive global ranks (what
``torchrun`` and most launchers give), ``LOCAL_WORLD_SIZE`` by default;
``check_local_rank`` and ``placement_report`` check that assumption against
``LOCAL_RANK`` and the real hosts.
"""

from __future__ import annotations

import logging
import os
import socket
from typing import Any

import torch.distributed as dist

from hypergrid.binding.facet import Facet, caller_rank, require_initialized
from hypergrid.binding.failures import peer_failures
from hypergrid.binding.registry import guard_key
from hypergrid.cluster.placement import PlacementReport, build_report
from hypergrid.cluster.tiers import Topology
from hypergrid.errors import WorldSizeError
from hypergrid.layout import MAX_WORLD_SIZE
from hypergrid.layout.hierarchy import node_size as _ranks_per_node
from hypergrid.validation import check_bool, check_int, refuse
from hypergrid.values import shown

_LOG = logging.getLogger("hypergrid")

__all__ = ["NodeAwareness"]


class NodeAwareness(Facet):
    """Node spans of families, the node-local ranks and group, placement reports (a facet object of the grid)."""

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
        me = caller_rank(None if rank is None else check_int("node_ranks", "rank", rank, 0, MAX_WORLD_SIZE - 1))
        first = me // per_node * per_node
        # Ranks past the grid (and past this rank) are no one's here: a huge node costs nothing.
        return list(range(first, min(first + per_node, max(self.layout.rank_offset + self.layout.size, me + 1))))

    def check_local_rank(self, ranks_per_node: int | None = None) -> None:
        """Check that ``LOCAL_RANK`` is this process's position on its node (nanotron's assert).

        Raises:
            WorldSizeError: ``LOCAL_RANK`` is missing, or not ``rank % ranks_per_node``:
                the launcher placed ranks differently than the layout assumes.
        """
        per_node = _ranks_per_node(ranks_per_node)
        rank = caller_rank(None)
        local = os.environ.get("LOCAL_RANK")
        if local is None or local.strip() != str(rank % per_node):
            raise WorldSizeError(
                f"LOCAL_RANK={shown(local)} on rank {rank}, but with {per_node} consecutive ranks per node it "
                f"should be {rank % per_node}: the launcher placed ranks differently than the grid assumes"
            )

    def node_group(
        self, ranks_per_node: int | None = None, *, check_local_rank: bool = True
    ) -> dist.ProcessGroup | None:
        """The caller's node-local group: the grid's ranks on its node (``pg(all dims, within="node")``).

        **Collective on first use**, like ``pg``; later calls are lookups (and
        ``ranks_per_node`` counts only on the first). Nodes are blocks of
        ``ranks_per_node`` consecutive ranks (default ``LOCAL_WORLD_SIZE``).
        With ``check_local_rank`` (the default) ``LOCAL_RANK`` must first agree
        with that assumption (see ``check_local_rank``); turn it off under
        launchers that do not set ``LOCAL_RANK``.

        Returns:
            The group, or ``None`` on ranks outside the grid.

        Raises:
            WorldSizeError: no ``ranks_per_node`` and no ``LOCAL_WORLD_SIZE``, or
                ``LOCAL_RANK`` disagrees (this rank raises at once; the others'
                guard then names it in ``GuardTimeoutError``).
            InvalidArgumentError: nodes do not cut the grid along its dims (see
                ``hypergrid.layout.hierarchy.node_split``).

        Examples:
            >>> import torch.distributed as dist
            >>> from hypergrid import HyperCommGrid
            >>> dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
            >>> grid = HyperCommGrid([1, 1], ["tp", "dp"])
            >>> dist.get_process_group_ranks(grid.node_group(8, check_local_rank=False)), grid.created_keys
            ([0], ['dp-tp|within=node'])
            >>> grid.destroy(); dist.destroy_process_group()
        """
        if check_bool("node_group", "check_local_rank", check_local_rank):
            self.check_local_rank(ranks_per_node)
        grid = self._core.grid
        group: dist.ProcessGroup | None = grid.pg(grid.dim_names, within="node", ranks_per_node=ranks_per_node)
        return group

    def placement_report(
        self, topology: Topology | str | None = None, ranks_per_node: int | None = None
    ) -> PlacementReport:
        """Where the created families' groups really are: every rank's host and ``LOCAL_RANK``, checked.

        **Collective** over the default group: every rank of the world must
        call it (it gathers each rank's host name and ``LOCAL_RANK`` with
        ``all_gather_object``: O(world) memory per rank; a diagnostic, not for
        every step; under NCCL set the CUDA device first). Every rank returns
        the same report:

        - whether the assumed nodes (blocks of ``ranks_per_node`` consecutive
          ranks, default ``LOCAL_WORLD_SIZE``; not checked when neither is
          known) are the real hosts, and ``LOCAL_RANK`` is ``rank % ranks_per_node``;
        - for each family created so far on the grid and its views (hierarchy
          halves and tagged communicators included), how many hosts its groups
          span ("tp: inside one node in all 16 groups", "dp: crosses 4 nodes");
        - with a ``topology`` (a ``Topology`` or a preset name), the tier each
          family is priced on, and a warning for a family priced inside a unit
          that fits in a host (an 8-GPU NVLink node) whose groups cross hosts.

        Every warning is also logged on the ``"hypergrid"`` logger.

        Raises:
            NotInitializedError: torch.distributed is not initialized.
            InvalidArgumentError: an unknown preset or a bad ``topology``.
            WorldSizeError: a bad ``ranks_per_node`` or ``LOCAL_WORLD_SIZE``.

        Examples:
            >>> import torch.distributed as dist
            >>> from hypergrid import HyperCommGrid
            >>> dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
            >>> grid = HyperCommGrid([1, 1], ["tp", "dp"])
            >>> _ = grid.create_pg("tp")
            >>> report = grid.placement_report("h100_8x", ranks_per_node=1)
            >>> report.node_blocks_match, [family.key for family in report.families]
            (True, ['tp'])
            >>> grid.destroy(); dist.destroy_process_group()
        """
        require_initialized("placement_report")
        if isinstance(topology, str):
            topology = Topology.preset(topology)
        elif topology is not None and not isinstance(topology, Topology):
            raise refuse("placement_report", "topology", topology, "None, a Topology or a preset's name")
        per_node = None
        if ranks_per_node is not None or "LOCAL_WORLD_SIZE" in os.environ:
            per_node = _ranks_per_node(ranks_per_node)
        local = os.environ.get("LOCAL_RANK", "").strip()
        mine = (socket.gethostname(), int(local) if local.isdigit() else None)
        gathered: list[Any] = [None] * dist.get_world_size()
        alarm = self._alarm("placement_report")
        alarm.check("placement_report")
        with peer_failures(alarm, "placement_report"):
            dist.all_gather_object(gathered, mine)
        root = self._core.root
        families = [
            (guard_key(key), layout.rank_enum_array(dims))
            for key, (layout, dims, _) in root._core.registry.families.items()
            if key in root._core.registry.groups
        ]
        report = build_report(
            [host for host, _ in gathered], [rank for _, rank in gathered], families, per_node, topology
        )
        for warning in report.warnings:
            _LOG.warning("placement: %s", warning)
        return report
