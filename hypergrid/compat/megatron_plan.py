"""The plan behind ``process_groups``: each field of the collection as a family of which view (no torch call).

A plan says, for a root grid and its expert view, which family of which view
fills each field, which views hypergrid registers for the fields that are
families of another factorization (``megatron.expert`` when no expert view is
given, ``megatron.dist_opt``, ``megatron.expert_dist_opt``, ``megatron.hcp``,
``megatron.single``), which fields are another field's object, and which
groups are no family at all (made by enumeration, outside the grid). With
sharing on, expert families that all have the members of grid families are
those families (the expert view then needs no batch of its own).

Examples:
    >>> from hypergrid import HyperCommGrid
    >>> grid = HyperCommGrid([2, 1, 2, 2], ["tp", "cp", "dp", "pp"])
    >>> plan = plan_fields(grid, None, instances=2)
    >>> plan.families["mp"], plan.families["expt_dp"], plan.families["intra_dp_cp"]
    ((None, ('tp', 'pp')), (None, ('dp',)), ('megatron.dist_opt', ('dp_intra',)))
    >>> sorted(plan.views), plan.same["dp_cp_gtp_remat"], plan.outside
    (['megatron.dist_opt', 'megatron.expert', 'megatron.expert_dist_opt'], 'dp_cp', {})
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from hypergrid.compat.megatron_fields import (
    DENSE_FAMILIES,
    EXPERT_FAMILIES,
    SAME_WHEN_UNIT,
    hierarchical_view,
    present,
    split_family,
)
from hypergrid.compat.megatron_layout import MEGATRON_DIMS, dense_and_expert, positive
from hypergrid.errors import GridSpecError
from hypergrid.grid import HyperCommGrid
from hypergrid.grid.core import family_index
from hypergrid.grid.views import BASE_VIEW
from hypergrid.layout import GridLayout
from hypergrid.layout.economy import PartitionSignature, partition_signature
from hypergrid.validation import check_instance, public

__all__ = ["Family", "Plan", "plan_fields", "process_group_families"]

#: A family: the view that holds it (None: the root grid's own) and its dims as that view names them.
Family = tuple[str | None, tuple[str, ...]]

EXPERT_VIEW = "megatron.expert"
DIST_OPT_VIEW = "megatron.dist_opt"
EXPERT_DIST_OPT_VIEW = "megatron.expert_dist_opt"
HCP_VIEW = "megatron.hcp"
SINGLE_VIEW = "megatron.single"


@dataclass
class Plan:
    """Where each field of the collection comes from.

    Attributes:
        families: field -> the family whose group fills it.
        tagged: field -> the family whose ``"ag"``-tagged twin fills it.
        levels: field -> families, one group of each for a field that holds a list (``hcp``).
        same: field -> the field whose object it holds (Megatron hands out one object).
        outside: field -> the rank lists of groups that are no grid family (made by enumeration).
        views: the views to register first: name -> (shape, dim_names).
        expert: the expert view the plan reads (None: there is none).
    """

    families: dict[str, Family] = field(default_factory=dict)
    tagged: dict[str, Family] = field(default_factory=dict)
    levels: dict[str, list[Family]] = field(default_factory=dict)
    same: dict[str, str] = field(default_factory=dict)
    outside: dict[str, list[list[int]]] = field(default_factory=dict)
    views: dict[str, tuple[list[int], list[str]]] = field(default_factory=dict)
    expert: str | None = None


class _Views:
    """The shapes and names of the root grid, its views and the views the plan adds."""

    def __init__(self, root: HyperCommGrid, plan: Plan) -> None:
        self.root, self.plan = root, plan

    def spec(self, view: str | None) -> tuple[list[int], list[str]]:
        if view in self.plan.views:
            return self.plan.views[view]
        registered = family_index(self.root).rank_view(BASE_VIEW if view is None else view)
        return list(registered.shape), list(registered.dim_names)

    def size(self, view: str | None, dim: str | None) -> int:
        shape, names = self.spec(view)
        return 1 if dim is None else shape[names.index(dim)]

    def spelled(self, view: str | None, dim: str) -> str | None:
        found = present(self.spec(view)[1], (dim,))
        return found[0] if found else None

    def family(self, view: str | None, dims: Sequence[str]) -> Family:
        """The family over ``dims`` (as Megatron names them); all absent: a family of single ranks."""
        found = present(self.spec(view)[1], dims)
        return (view, found) if found else self.single()

    def single(self) -> Family:
        """A family whose groups are single ranks: a size-1 dim of the grid or its expert view, else a view's."""
        for view in dict.fromkeys((None, self.plan.expert)):
            shape, names = self.spec(view)
            for size, name in zip(shape, names):
                if size == 1:
                    return view, (name,)
        shape, names = self.spec(None)
        self.plan.views[SINGLE_VIEW] = ([*shape, 1], [*names, "single"])
        return SINGLE_VIEW, ("single",)


def _expert_view(root: HyperCommGrid) -> tuple[list[int], list[str]] | None:
    """Megatron's expert layout when no expert view is given (ep 1, etp = tp), if the grid's dims are Megatron's."""
    names = list(root.dim_names)
    if not set(names) <= set(MEGATRON_DIMS) - {"ep"}:
        return None
    size = {name: root.layout.dim_size(name) for name in names}
    _, _, expert_names, expert_sizes = dense_and_expert(
        tp=size.get("tp", 1),
        pp=size.get("pp", 1),
        cp=size.get("cp", 1),
        ep=1,
        etp=size.get("tp", 1),
        order="-".join(names),
        gtp_remat=size.get("gtp_remat", 1),
        egtp_remat=1,
        unit_gtp=True,
    )
    expert_sizes["edp"] = root.size // (expert_sizes["etp"] * expert_sizes["pp"])
    return [expert_sizes[name] for name in expert_names], expert_names


def plan_fields(
    root: HyperCommGrid,
    expert: str | None,
    *,
    instances: int = 1,
    hierarchical_cp: Sequence[int] | None = None,
    all_gather: bool = False,
) -> Plan:
    """The plan of every field for ``root`` and its expert view ``expert`` (see the module's docstring).

    Raises:
        GridSpecError: ``instances`` does not divide dp*cp or the expert dp
            size, or comes with a gtp_remat / egtp_remat larger than 1; the
            ``hierarchical_cp`` sizes do not multiply to cp.
    """
    plan = Plan()
    views = _Views(root, plan)
    if expert is None:
        auto = _expert_view(root)
        if auto is not None:
            plan.views[EXPERT_VIEW], expert = auto, EXPERT_VIEW
    plan.expert = expert
    for name, dims in DENSE_FAMILIES.items():
        plan.families[name] = views.family(None, dims)
    if expert is not None:
        for name, dims in EXPERT_FAMILIES.items():
            plan.families[name] = views.family(expert, dims)
    if expert is not None and root.share_groups:
        _fold_expert(views, expert)
    gtp = views.size(None, views.spelled(None, "gtp_remat"))
    egtp = views.size(expert, views.spelled(expert, "egtp_remat")) if expert is not None else 1
    for name, (same, unit) in SAME_WHEN_UNIT.items():
        if name in plan.families and (gtp if unit == "gtp_remat" else egtp) == 1:
            plan.same[name] = same
            del plan.families[name]
    _distributed_optimizer(views, positive("distributed_optimizer_instances", instances), gtp, egtp)
    if hierarchical_cp is not None:
        _hierarchical(views, hierarchical_cp)
    if all_gather:
        plan.tagged["dp_cp_ag"] = plan.families["dp_cp"]
        ep = views.size(expert, views.spelled(expert, "ep")) if expert is not None else 1
        if ep > 1:  # Megatron makes the expert twin only with expert parallelism
            plan.tagged["expt_dp_ag"] = plan.families["expt_dp"]
    return plan


def _fold_expert(views: _Views, expert: str) -> None:
    """Where every expert family has the members of one of the grid's, take the grid's: no batch for the view.

    With sharing on they would be those group objects anyway; the view's batch
    would only cost a guard round (the request names the view's layout, so the
    ranks still agree on it).
    """
    plan, root = views.plan, views.root
    shape, names = views.spec(expert)
    layout = GridLayout(shape, names, root.rank_offset)
    dense: dict[PartitionSignature, tuple[str, ...]] = {}
    for count in range(len(root.dim_names), 0, -1):  # fewest dims last: they win
        for dims in itertools.combinations(root.dim_names, count):
            dense[partition_signature(root.layout, dims)] = dims
    folded = {}
    for name, (view, dims) in plan.families.items():
        if view == expert:
            same = dense.get(partition_signature(layout, dims))
            if same is None:
                return
            folded[name] = (None, same)
    plan.families.update(folded)


def _distributed_optimizer(views: _Views, instances: int, gtp: int, egtp: int) -> None:
    """``intra_dp_cp``, ``intra_expt_dp``, ``inter_dist_opt``, ``intra_dist_opt`` for ``instances`` instances."""
    plan, root = views.plan, views.root
    if instances == 1:
        plan.same.update(intra_dp_cp="dp_cp", intra_expt_dp="expt_dp")
        plan.families["intra_dist_opt"] = (None, tuple(root.dim_names))  # the whole grid
        return
    if gtp > 1 or egtp > 1:
        raise GridSpecError(
            f"distributed_optimizer_instances={instances} with gtp_remat={gtp}, egtp_remat={egtp}: Megatron-Core "
            "supports several distributed-optimizer instances only without weight rematerialisation (sizes 1)"
        )
    dims = present(root.dim_names, ("cp", "dp"))
    total = math.prod(root.layout.dim_size(dim) for dim in dims)
    if total % instances:
        raise GridSpecError(
            f"distributed_optimizer_instances={instances} does not divide dp*cp = {total} of the grid "
            f"{root.shape} {root.dim_names}"
        )
    split = split_family(root.shape, root.dim_names, dims, total // instances)
    if split is None:  # runs that are no family of any factorization: groups of their own
        run = total // instances
        groups = root.get_rank_enum(list(dims))
        plan.outside["intra_dp_cp"] = [sorted(g)[start : start + run] for g in groups for start in range(0, total, run)]
    else:
        shape, names, intra, _ = split
        plan.views[DIST_OPT_VIEW] = (shape, names)
        plan.families["intra_dp_cp"] = (DIST_OPT_VIEW, intra)
    expert = plan.expert
    edp = views.spelled(expert, "edp") if expert is not None else None
    shape, names = views.spec(expert)
    size = views.size(expert, edp)
    if edp is None or size % instances:
        raise GridSpecError(
            f"distributed_optimizer_instances={instances} does not divide the expert data-parallel size {size} "
            f"of the expert view {shape} {names}"
        )
    cut = split_family(shape, names, [edp], size // instances)
    assert cut is not None  # one dim: always a mixed-radix prefix
    view_shape, view_names, intra, inter = cut
    plan.views[EXPERT_DIST_OPT_VIEW] = (view_shape, view_names)
    plan.families["intra_expt_dp"] = (EXPERT_DIST_OPT_VIEW, intra)
    plan.families["inter_dist_opt"] = (EXPERT_DIST_OPT_VIEW, inter)
    plan.families["intra_dist_opt"] = (EXPERT_DIST_OPT_VIEW, tuple(n for n in view_names if n not in inter))


def _hierarchical(views: _Views, sizes: Sequence[int]) -> None:
    """``hcp``: one family per level of the cp groups cut into ``sizes`` (innermost first)."""
    plan, root = views.plan, views.root
    levels = [positive("hierarchical_cp", size) for size in sizes]
    cp = views.spelled(None, "cp")
    cp_size = views.size(None, cp)
    if not levels or math.prod(levels) != cp_size:
        raise GridSpecError(f"hierarchical_cp={list(sizes)} must multiply to the context-parallel size {cp_size}")
    if cp is None:
        plan.levels["hcp"] = [views.single() for _ in levels]
        return
    shape, names, level_dims = hierarchical_view(root.shape, root.dim_names, cp, levels)
    plan.views[HCP_VIEW] = (shape, names)
    plan.levels["hcp"] = [(HCP_VIEW, (dim,)) for dim in level_dims]


@public
def process_group_families(grid: HyperCommGrid, expert: str | None = None) -> dict[str, tuple[str | None, list[str]]]:
    """Which family of which view each field made from the grid and ``expert`` is (pure, no torch call).

    Returns:
        Field name -> (view name or None for the grid's own, dims as the view
        names them), for the dense and expert fields whose dims the grid (or
        view) has; ``process_groups`` also fills the others (see its docstring).

    Examples:
        >>> grid = HyperCommGrid([2, 1, 2, 2], ["tp", "cp", "dp", "pp"])
        >>> process_group_families(grid)["mp"], process_group_families(grid)["dp_cp"]
        ((None, ['tp', 'pp']), (None, ['dp', 'cp']))
    """
    check_instance("", "grid", grid, HyperCommGrid, "a HyperCommGrid")
    check_instance("", "expert", expert, str, "None or a registered view's name", optional=True)
    tables = [(None, DENSE_FAMILIES)] + ([(expert, EXPERT_FAMILIES)] if expert is not None else [])
    families: dict[str, tuple[str | None, list[str]]] = {}
    for view, table in tables:
        names = family_index(grid).rank_view(view).dim_names
        for field_name, dims in table.items():
            found = present(names, dims)
            if found:
                families[field_name] = (view, list(found))
    return families
