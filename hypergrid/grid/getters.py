"""Coordinates and per-family getters of a grid: pure rank arithmetic, no process group needed.

Every getter takes an explicit ``rank`` or, without one, the calling rank
(which needs an initialized ``torch.distributed``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch.distributed as dist

from hypergrid.binding.facet import Facet, caller_rank, require_initialized
from hypergrid.layout import Dims

__all__ = ["CoordinateGetters"]


class CoordinateGetters(Facet):
    """Coordinates, neighbours and group membership of ranks (a facet object of ``HyperCommGrid``)."""

    def coord_of(self, rank: int) -> Any:
        """Coordinates of ``rank`` as a named tuple (fields: the dim names).

        Examples:
            >>> from hypergrid import HyperCommGrid
            >>> HyperCommGrid([2, 2, 2], ["tp", "cp", "dp"]).coord_of(6)
            Coord(tp=0, cp=1, dp=1)
        """
        return self.layout.coord_of(rank)

    def rank_of(self, base: int | None = None, /, **coords: int) -> int:
        """The rank at the named coordinates: all dims, or those to change in ``base``'s.

        With a ``base`` rank, the dims not named keep ``base``'s coordinates —
        DeepSpeed's ``stage_to_global(stage)`` is ``grid.rank_of(rank, pp=stage)``.

        Examples:
            >>> from hypergrid import HyperCommGrid
            >>> grid = HyperCommGrid([2, 2, 2], ["tp", "pp", "dp"])
            >>> grid.rank_of(tp=0, pp=1, dp=1), grid.rank_of(5, pp=1)
            (6, 7)
        """
        if base is None:
            return self.layout.rank_at(**coords)
        return self.layout.replace(base, **coords)

    def my_coord(self) -> Any:
        """The calling rank's coordinates (needs an initialized world; the rank must be in the grid)."""
        return self.layout.coord_of(caller_rank(None))

    def group_ranks(self, dims: Dims, rank: int | None = None) -> list[int]:
        """The ranks of the group over ``dims`` holding ``rank`` (default: the caller). Pure, O(group).

        Examples:
            >>> from hypergrid import HyperCommGrid
            >>> HyperCommGrid([2, 2, 2], ["tp", "cp", "dp"]).group_ranks("dp-tp", rank=6)
            [2, 3, 6, 7]
        """
        return self.layout.group_ranks(dims, caller_rank(rank))

    def group_rank(self, dims: Dims, rank: int | None = None) -> int:
        """``rank``'s index in its group over ``dims`` (its rank in that process group).

        Examples:
            >>> from hypergrid import HyperCommGrid
            >>> HyperCommGrid([2, 2, 2], ["tp", "cp", "dp"]).group_rank("dp-tp", rank=6)
            2
        """
        me = caller_rank(rank)
        return self.layout.group_ranks(dims, me).index(me)

    def group_size(self, dims: Dims) -> int:
        """Number of ranks in each group over ``dims``.

        Examples:
            >>> from hypergrid import HyperCommGrid
            >>> HyperCommGrid([2, 2, 2], ["tp", "cp", "dp"]).group_size(["tp", "dp"])
            4
        """
        return self.layout.group_size(dims)

    def src_rank(self, dims: Dims, rank: int | None = None) -> int:
        """The global rank of group rank 0 in ``rank``'s group over ``dims`` (ezpz's "src rank").

        Examples:
            >>> from hypergrid import HyperCommGrid
            >>> HyperCommGrid([2, 2, 2], ["tp", "cp", "dp"]).src_rank("dp", rank=7)
            3
        """
        return self.layout.group_ranks(dims, caller_rank(rank))[0]

    def shift(
        self, dim: str, disp: int = 1, periodic: bool = False, rank: int | None = None
    ) -> tuple[int | None, int | None]:
        """``(source, dest)`` along ``dim`` like ``MPI_Cart_shift``; None at open edges.

        Examples:
            >>> from hypergrid import HyperCommGrid
            >>> HyperCommGrid([2, 4], ["tp", "pp"]).shift("pp", rank=3)
            (1, 5)
        """
        return self.layout.shift(dim, caller_rank(rank), disp, periodic)

    def is_first(self, dim: str, rank: int | None = None) -> bool:
        """Whether ``rank`` has coordinate 0 along ``dim`` (first pipeline stage for ``"pp"``).

        Examples:
            >>> from hypergrid import HyperCommGrid
            >>> HyperCommGrid([2, 4], ["tp", "pp"]).is_first("pp", rank=1)
            True
        """
        return self.layout.shift(dim, caller_rank(rank))[0] is None

    def is_last(self, dim: str, rank: int | None = None) -> bool:
        """Whether ``rank`` has the last coordinate along ``dim``.

        Examples:
            >>> from hypergrid import HyperCommGrid
            >>> HyperCommGrid([2, 4], ["tp", "pp"]).is_last("pp", rank=7)
            True
        """
        return self.layout.shift(dim, caller_rank(rank))[1] is None

    def rank_repr(
        self, rank: int | None = None, omit: Sequence[str] = (), inner_sep: str = "_", outer_sep: str = "-"
    ) -> str:
        """A checkpoint-friendly name from ``rank``'s coordinates, outermost dim first.

        Examples:
            >>> from hypergrid import HyperCommGrid
            >>> HyperCommGrid([2, 2, 2], ["tp", "pp", "dp"]).rank_repr(5, omit=["dp"])
            'pp_00-tp_01'
        """
        return self.layout.rank_repr(caller_rank(rank), omit, inner_sep, outer_sep)

    def is_current_rank_in_grid(self) -> bool:
        """Whether the calling rank is one of the grid's ranks.

        Raises:
            NotInitializedError: torch.distributed is not initialized.
        """
        require_initialized("is_current_rank_in_grid")
        return self.layout.contains(dist.get_rank())
