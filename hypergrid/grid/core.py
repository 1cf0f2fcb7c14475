"""``GridCore``: the declared interface of a grid's registry for the code built over it (the adapters).

``hypergrid.compat`` builds Megatron's and DeepSpeed's collections out of a
grid's families; it needs a little more than the public API (which view a
grid enumerates, its root, whether a family with a tag was created) and uses
exactly this, never a private member of the grid:

- ``root``: the grid whose registry this one shares (itself unless it came from ``view()``);
- ``view_name``: the view the grid enumerates (``"base"`` for a grid that came from no ``view()``);
- ``rank_view(view)``: a registered view's record (name, shape, dim_names, shared_dims, layout);
- ``family_key(dims, view)``: the registry key of a family, equal for two spellings of one family;
- ``is_created(dims, view, tag)``: whether that family (with ``tag``) is in the registry.

Examples:
    >>> from hypergrid.grid import HyperCommGrid
    >>> core = grid_core(HyperCommGrid([2, 2], ["tp", "dp"]))
    >>> core.view_name, core.family_key(["dp", "tp"], None) == core.family_key("tp-dp", None)
    ('base', True)
    >>> core.rank_view(None).dim_names, core.is_created("tp", None, None)
    (['tp', 'dp'], False)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hypergrid.binding.registry import PgKey

if TYPE_CHECKING:
    from hypergrid.grid.grid import HyperCommGrid
    from hypergrid.grid.views import RankView
    from hypergrid.layout import Dims

__all__ = ["GridCore", "grid_core"]


class GridCore:
    """What the adapters may use of a grid beyond its public methods (see the module docstring)."""

    def __init__(self, grid: HyperCommGrid) -> None:
        self._grid = grid

    @property
    def root(self) -> HyperCommGrid:
        """The grid that holds the registry and every view (the grid itself unless it came from ``view()``)."""
        return self._grid._root

    @property
    def view_name(self) -> str:
        """The name of the view the grid enumerates."""
        return self._grid._view_name

    def rank_view(self, view: str | None) -> RankView:
        """The record of ``view`` (None: the grid's own); ``ViewNotFoundError`` for one not registered."""
        return self._grid._rank_view(view)

    def family_key(self, dims: Dims, view: str | None) -> PgKey:
        """The registry key of the family over ``dims`` of ``view``, untagged; ``DimsError`` for unknown dims."""
        return self._grid._family(dims, view)[0]

    def is_created(self, dims: Dims, view: str | None, tag: str | None) -> bool:
        """Whether the family over ``dims`` of ``view`` with ``tag`` is in the registry."""
        return self._grid._key(dims, view, tag, None, None) in self._grid._pgs


def grid_core(grid: HyperCommGrid) -> GridCore:
    """The declared interface of ``grid``'s registry."""
    return GridCore(grid)
