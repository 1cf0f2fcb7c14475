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

import importlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields, is_dataclass
from typing import Any

import torch.distributed as dist

from hypergrid.errors import DimsError, GridSpecError
from hypergrid.grid import HyperCommGrid
from hypergrid.layout import GridLayout

__all__ = [
    "PG_FIELDS",
    "ProcessGroupCollection",
    "RankGenerator",
    "collection_class",
    "grid_from_order",
    "moe_grids",
    "process_group_families",
    "process_groups",
]

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


# -- ProcessGroupCollection ---------------------------------------------------

#: The fields of Megatron-Core's ``ProcessGroupCollection`` (megatron/core/process_groups_config.py).
PG_FIELDS = (
    "tp",
    "pp",
    "mp",
    "embd",
    "pos_embd",
    "cp",
    "tp_cp",
    "hcp",
    "ep",
    "expt_tp",
    "tp_ep",
    "tp_ep_pp",
    "tp_dp_cp",
    "dp",
    "dp_cp",
    "expt_dp",
    "intra_dp_cp",
    "intra_expt_dp",
    "inter_dist_opt",
    "intra_dist_opt",
)

# Field -> the dims of its family: on the grid (dense), on the expert view (expert).
_DENSE = {
    "tp": ("tp",),
    "pp": ("pp",),
    "cp": ("cp",),
    "dp": ("dp",),
    "mp": ("tp", "pp"),
    "tp_cp": ("tp", "cp"),
    "dp_cp": ("dp", "cp"),
    "tp_dp_cp": ("tp", "dp", "cp"),
}
_EXPERT = {
    "ep": ("ep",),
    "expt_tp": ("expt_tp",),
    "tp_ep": ("expt_tp", "ep"),
    "tp_ep_pp": ("expt_tp", "ep", "pp"),
    "expt_dp": ("expt_dp",),
}
_EXPERT_ALIASES = {"expt_tp": "etp", "expt_dp": "edp"}  # the names moe_grids uses


@dataclass
class ProcessGroupCollection:
    """Megatron-Core's ``ProcessGroupCollection`` field names, for where megatron-core is not installed.

    Every field holds the calling rank's group, or ``None`` (not a member, or not built).
    """

    tp: Any = None
    pp: Any = None
    mp: Any = None
    embd: Any = None
    pos_embd: Any = None
    cp: Any = None
    tp_cp: Any = None
    hcp: Any = None
    ep: Any = None
    expt_tp: Any = None
    tp_ep: Any = None
    tp_ep_pp: Any = None
    tp_dp_cp: Any = None
    dp: Any = None
    dp_cp: Any = None
    expt_dp: Any = None
    intra_dp_cp: Any = None
    intra_expt_dp: Any = None
    inter_dist_opt: Any = None
    intra_dist_opt: Any = None


def collection_class() -> type:
    """Megatron-Core's ``ProcessGroupCollection`` when megatron-core imports, else hypergrid's stand-in.

    Examples:
        >>> collection_class().__name__
        'ProcessGroupCollection'
    """
    try:
        module = importlib.import_module("megatron.core.process_groups_config")
    except ImportError:
        return ProcessGroupCollection
    real: type = module.ProcessGroupCollection
    return real


def _present(names: Sequence[str], dims: tuple[str, ...], aliases: Mapping[str, str]) -> list[str]:
    """The family's dims as the grid names them; a dim the grid lacks counts as size 1 and is left out."""
    found = []
    for dim in dims:
        name = dim if dim in names else aliases.get(dim, dim)
        if name in names:
            found.append(name)
    return found


def process_group_families(grid: HyperCommGrid, expert: str | None = None) -> dict[str, tuple[str | None, list[str]]]:
    """Which family of which view each grid-made field of ``process_groups`` is (pure, no torch call).

    Returns:
        Field name -> (view name or None for the grid's own, dims as the view names them).
        Fields whose dims are all absent are left out.

    Examples:
        >>> grid = HyperCommGrid([2, 1, 2, 2], ["tp", "cp", "dp", "pp"])
        >>> process_group_families(grid)["mp"], process_group_families(grid)["dp_cp"]
        ((None, ['tp', 'pp']), (None, ['dp', 'cp']))
    """
    families: dict[str, tuple[str | None, list[str]]] = {}
    for field_name, dims in _DENSE.items():
        found = _present(grid.dim_names, dims, {})
        if found:
            families[field_name] = (None, found)
    if expert is not None:
        names = grid._rank_view(expert).dim_names
        for field_name, dims in _EXPERT.items():
            found = _present(names, dims, _EXPERT_ALIASES)
            if found:
                families[field_name] = (expert, found)
    return families


def _embedding_enums(grid: HyperCommGrid) -> tuple[list[list[int]], list[list[int]]]:
    """Megatron's embedding groups (first and last pipeline stage) and position-embedding groups (first)."""
    stages = grid.get_rank_enum("pp") if "pp" in grid.dim_names else [[rank] for rank in grid.layout.rank_array().flat]
    embd = [[group[0], group[-1]] if len(group) > 1 else [group[0]] for group in stages]
    return embd, [[group[0]] for group in stages]


def process_groups(grid: HyperCommGrid, expert: str | HyperCommGrid | None = None, *, embedding: bool = True) -> Any:
    """A Megatron-Core ``ProcessGroupCollection`` of the grid's groups (and of an expert view's).

    **Collective**: every rank of the world must call it with the same grid.
    Families are created through the grid (``create_pgs`` in one step where
    the grid has it, else ``create_pg`` per family in a fixed order); families
    already created are reused. Dense fields come from the grid's dims
    ``tp``, ``cp``, ``dp``, ``pp`` (a missing dim counts as size 1); expert
    fields (``ep``, ``expt_tp``, ``tp_ep``, ``tp_ep_pp``, ``expt_dp``) from the
    view ``expert`` (names ``expt_tp``/``etp``, ``ep``, ``expt_dp``/``edp``,
    ``pp``), else ``None``. With one distributed-optimizer instance, as
    Megatron does: ``intra_dp_cp`` is ``dp_cp``, ``intra_expt_dp`` is
    ``expt_dp``; ``inter_dist_opt``, ``intra_dist_opt`` and ``hcp`` are ``None``.
    With ``embedding``, ``embd`` (first and last stage of each pipeline) and
    ``pos_embd`` (first stage) are made with ``new_subgroups_by_enumeration``;
    they are not grid families, so ``grid.destroy()`` leaves them to the caller.

    Args:
        grid: the dense grid (or a grid returned by its ``view()``: its root is used).
        expert: the expert view: a name given to ``register_view``, or a grid returned by ``view()``.
        embedding: also make the embedding groups.

    Returns:
        Megatron-Core's ``ProcessGroupCollection`` when megatron-core is importable,
        else hypergrid's dataclass with the same field names.

    Raises:
        ViewNotFoundError: (a ``KeyError``) ``expert`` names no registered view.
        NotInitializedError: torch.distributed is not initialized.

    Examples:
        >>> import torch.distributed as dist
        >>> dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        >>> grid = HyperCommGrid([1, 1, 1, 1], ["tp", "cp", "dp", "pp"])
        >>> grid.register_view("expert", [1, 1, 1, 1], ["expt_tp", "ep", "expt_dp", "pp"], ["pp"])
        >>> pgs = process_groups(grid, "expert")
        >>> pgs.tp is grid.get_pg("tp"), pgs.ep is grid.get_pg("ep", view="expert"), pgs.intra_dp_cp is pgs.dp_cp
        (True, True, True)
        >>> grid.destroy(); dist.destroy_process_group()
    """
    root = grid._root
    view = expert._view_name if isinstance(expert, HyperCommGrid) else expert
    families = process_group_families(root, view)
    for name in (None, view) if view is not None else (None,):
        wanted = [dims for target, dims in families.values() if target == name]
        missing = [dims for dims in wanted if root._family(dims, name)[0] not in root._pgs]
        target_grid = root if name is None else root._bound_view(name)
        if missing and hasattr(target_grid, "create_pgs"):
            target_grid.create_pgs(missing)
        else:
            for dims in missing:
                target_grid.create_pg(dims)
    values: dict[str, Any] = {
        field_name: root.get_pg(dims, view=target) for field_name, (target, dims) in families.items()
    }
    if embedding:
        embd, pos_embd = _embedding_enums(root)
        values["embd"], _ = dist.new_subgroups_by_enumeration(embd, backend=root.backend)  # type: ignore[no-untyped-call]
        values["pos_embd"], _ = dist.new_subgroups_by_enumeration(pos_embd, backend=root.backend)  # type: ignore[no-untyped-call]
    values["intra_dp_cp"] = values.get("dp_cp")
    values["intra_expt_dp"] = values.get("expt_dp")
    cls = collection_class()
    known = {f.name for f in fields(cls)} if is_dataclass(cls) else set(PG_FIELDS)
    return cls(**{name: values.get(name) for name in PG_FIELDS if name in known})
