"""Views: other factorizations of a grid's ranks (MoE parallel folding), sharing groups over shared dims."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, cast

from hypergrid.errors import GridSpecError
from hypergrid.facet import GridFacet

if TYPE_CHECKING:
    from hypergrid.grid import HyperCommGrid

__all__ = ["Views"]


class Views(GridFacet):
    """Other factorizations of the grid's ranks (a mixin of ``HyperCommGrid``)."""

    def view(
        self, shape: Sequence[int], dim_names: Sequence[str], shared_dims: Sequence[str] | None = None
    ) -> HyperCommGrid:
        """Another factorization of the same ranks (MoE parallel folding), sharing groups where dims are shared.

        ``shared_dims`` (default: the names the two grids have in common) must
        enumerate identical groups in both; a family over shared dims only is the
        same process group object in both grids. The view has this grid's
        offset, backend, strategy, guard, sharing and group options; with
        sharing on, any of its families with the same groups as one of the
        grid's (or another view's) uses the same process group object.

        Raises:
            GridSpecError: the view covers another number of ranks, a shared dim
                is missing from one grid, or enumerates other groups in the view.

        Examples:
            >>> from hypergrid import HyperCommGrid
            >>> dense = HyperCommGrid([2, 2, 2], ["tp", "dp", "pp"])
            >>> expert = dense.view([4, 1, 2], ["ep", "edp", "pp"])
            >>> expert.shared_dims, expert.get_rank_enum("ep")
            (('pp',), [[0, 1, 2, 3], [4, 5, 6, 7]])
        """
        base = cast("HyperCommGrid", self)
        view = type(base)(
            shape,
            dim_names,
            self.rank_offset,
            self.backend,
            strategy=self.strategy,
            guard=self.guard,
            guard_timeout_s=self.guard_timeout_s,
            share_groups=base.share_groups,
            group_options=base.group_options,
        )
        if view.size != self.size:
            raise GridSpecError(
                f"a view must cover the same {self.size} ranks as the grid {self.shape}; "
                f"shape {view.shape} has {view.size}"
            )
        common = [name for name in view.dim_names if name in self.dim_names]
        shared = common if shared_dims is None else list(shared_dims)
        for name in shared:
            if name not in self.dim_names or name not in view.dim_names:
                raise GridSpecError(
                    f"shared dim {name!r} must be a dim of both the grid {self.dim_names} and the view {view.dim_names}"
                )
            if sorted(self.layout.rank_enum(name)) != sorted(view.layout.rank_enum(name)):
                raise GridSpecError(
                    f"shared dim {name!r} enumerates other groups in the view {view.shape} {view.dim_names} "
                    f"than in the grid {self.shape} {self.dim_names}: {view.layout.rank_enum(name)[:2]}... "
                    f"versus {self.layout.rank_enum(name)[:2]}..."
                )
        view._parent = base
        view._pool = base._pool  # a view shares groups with its grid, not only over shared dims
        view.shared_dims = tuple(shared)
        return view
