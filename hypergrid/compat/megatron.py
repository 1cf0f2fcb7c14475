"""Megatron-Core's layout vocabulary on hypergrid: order strings, ``RankGenerator``, MoE folding.

Megatron writes ``order="tp-cp-ep-dp-pp"`` with the leftmost dim innermost; that
string split on ``-`` is hypergrid's ``dim_names``.

Examples:
    >>> grid = grid_from_order("tp-cp-pp-dp", tp=2, cp=3, pp=4, dp=5)
    >>> grid.shape, grid.get_rank_enum("tp")[:2]
    ([2, 3, 4, 5], [[0, 1], [2, 3]])
    >>> RankGenerator(tp=2, ep=1, dp=5, pp=4, cp=3, order="tp-cp-ep-pp-dp").get_ranks("tp-pp")[0]
    [0, 1, 6, 7, 12, 13, 18, 19]
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hypergrid.errors import DimsError, GridSpecError
from hypergrid.grid import HyperCommGrid
from hypergrid.layout import GridLayout

__all__ = ["grid_from_order", "RankGenerator", "moe_grids"]

_MEGATRON_DIMS = ("tp", "cp", "ep", "dp", "pp")


def _order_names(order: str) -> list[str]:
    if not isinstance(order, str) or not order:
        raise DimsError(f"order must be a string like 'tp-cp-ep-dp-pp', got {order!r}")
    return order.lower().split("-")


def grid_from_order(
    order: str,
    sizes: Mapping[str, int] | None = None,
    *,
    rank_offset: int = 0,
    backend: str | None = None,
    **size_kwargs: int,
) -> HyperCommGrid:
    """A grid from a Megatron order string and sizes; a missing size is inferred from the world (-1).

    Examples:
        >>> grid_from_order("tp-dp", {"tp": 2, "dp": 4}).get_rank_enum("dp")[0]
        [0, 2, 4, 6]
    """
    given = {**(sizes or {}), **size_kwargs}
    names = _order_names(order)
    unknown = sorted(set(given) - set(names))
    if unknown:
        raise DimsError(f"sizes given for {unknown}, which order {order!r} does not name")
    return HyperCommGrid([given.get(name, -1) for name in names], names, rank_offset, backend)


class RankGenerator:
    """Megatron's ``RankGenerator(tp, ep, dp, pp, cp, order, rank_offset)``; ``get_ranks(token)``.

    Dims of size 1 may be left out of ``order``; a dim larger than 1 must be in it.
    """

    def __init__(self, tp: int, ep: int, dp: int, pp: int, cp: int, order: str, rank_offset: int = 0) -> None:
        sizes = {"tp": tp, "ep": ep, "dp": dp, "pp": pp, "cp": cp}
        names = _order_names(order)
        unknown = sorted(set(names) - set(_MEGATRON_DIMS))
        if unknown:
            raise DimsError(f"order {order!r} names {unknown}; Megatron's dims are {list(_MEGATRON_DIMS)}")
        for name, size in sizes.items():
            if name not in names:
                if size != 1:
                    raise GridSpecError(f"{name}={size} but order {order!r} leaves {name!r} out")
                names.append(name)
        self.order = "-".join(names)
        self.layout = GridLayout([sizes[name] for name in names], names, rank_offset)
        self.world_size = self.layout.size

    def get_ranks(self, token: str) -> list[list[int]]:
        """The groups over the dims in ``token`` (e.g. ``"tp-pp"``), Megatron's order."""
        return self.layout.rank_enum(token)


def moe_grids(
    *,
    tp: int,
    pp: int,
    etp: int,
    ep: int,
    cp: int = 1,
    order: str = "tp-cp-ep-dp-pp",
    rank_offset: int = 0,
    backend: str | None = None,
    **options: Any,
) -> tuple[HyperCommGrid, HyperCommGrid]:
    """The dense grid (tp, cp, dp, pp) and the expert view (etp, ep, edp, pp) over the same ranks.

    MoE parallel folding: dp and edp are inferred from the world; pp is shared,
    so the pipeline groups are the same process group objects in both.

    Examples:
        >>> import os
        >>> os.environ["WORLD_SIZE"] = "16"
        >>> dense, expert = moe_grids(tp=2, pp=2, etp=1, ep=4)
        >>> dense.shape, dense.dim_names, expert.shape, expert.dim_names
        ([2, 1, 4, 2], ['tp', 'cp', 'dp', 'pp'], [1, 4, 2, 2], ['etp', 'ep', 'edp', 'pp'])
        >>> del os.environ["WORLD_SIZE"]
    """
    names = [name for name in _order_names(order) if name != "ep"]
    dense = HyperCommGrid(
        [{"tp": tp, "cp": cp, "dp": -1, "pp": pp}[name] for name in names], names, rank_offset, backend, **options
    )
    expert_names = [{"tp": "etp", "dp": "edp"}.get(name, name) for name in _order_names(order) if name != "cp"]
    if dense.size % (etp * ep * pp):
        raise GridSpecError(f"etp*ep*pp = {etp * ep * pp} does not divide the {dense.size} ranks of the dense grid")
    expert_sizes = {"etp": etp, "ep": ep, "edp": dense.size // (etp * ep * pp), "pp": pp}
    return dense, dense.view([expert_sizes[name] for name in expert_names], expert_names, ["pp"])
