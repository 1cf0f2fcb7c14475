"""Megatron-Core's ``ProcessGroupCollection``, every field, from a grid or in one call from sizes.

``process_groups(tp=2, pp=2, ep=2)`` builds the dense grid and its expert view
over the same ranks and fills every field of the installed Megatron-Core's
collection; ``process_groups(grid, expert)`` does the same for a grid you built.
The families are created through the grid, one guarded ``create_pgs`` batch
per view (the grid, the expert view, and only where asked, a view for several
distributed-optimizer instances, hierarchical context parallelism or the
``"ag"`` twins); groups that are no family (the embedding groups, where no
grid family has their members) are made by enumeration after the guarded
batches, from the agreed layout. ``destroy_process_groups(pgs)`` releases both.
"""

from __future__ import annotations

import inspect
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, fields, is_dataclass
from typing import Any

import torch.distributed as dist

from hypergrid.compat.megatron_fields import (
    PG_FIELDS,
    collection_class,
    embedding_ranks,
    present,
)
from hypergrid.compat.megatron_layout import DEFAULT_ORDER, build_grids, positive
from hypergrid.compat.megatron_plan import Family, Plan, plan_fields
from hypergrid.errors import GridSpecError, GroupNotFoundError, NotInitializedError, UnexpectedArgumentError
from hypergrid.grid import HyperCommGrid
from hypergrid.grid.core import family_index
from hypergrid.grid.views import BASE_VIEW
from hypergrid.validation import check_bool, check_instance, public
from hypergrid.values import shown

__all__ = ["destroy_process_groups", "grid_of", "process_groups"]

#: The tag of the all-gather twins (``dp_cp_ag``, ``expt_dp_ag``).
AG_TAG = "ag"


@dataclass
class _Owner:
    grid: HyperCommGrid
    outside: list[Any]  # the caller's groups made outside the grid (each once)


_OWNERS: dict[int, _Owner] = {}


@public
def grid_of(pgs: Any) -> HyperCommGrid:
    """The root grid whose families fill ``pgs`` (a collection ``process_groups`` returned).

    Raises:
        GroupNotFoundError: (a ``KeyError``) ``pgs`` was not made by ``process_groups``
            in this process, or was released by ``destroy_process_groups``.

    Examples:
        >>> import torch.distributed as dist
        >>> dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        >>> pgs = process_groups(tp=1, pp=1)
        >>> grid_of(pgs).dim_names, grid_of(pgs).get_pg("dp") is pgs.dp
        (['tp', 'gtp_remat', 'cp', 'dp', 'pp'], True)
        >>> destroy_process_groups(pgs); dist.destroy_process_group()
    """
    owner = _OWNERS.get(id(pgs))
    if owner is None:
        raise GroupNotFoundError(
            f"pgs={shown(pgs)}: expected a collection from process_groups(); process_groups() did not make this "
            f"{type(pgs).__name__} in this process (or destroy_process_groups() released it)"
        )
    return owner.grid


@public
def destroy_process_groups(pgs: Any) -> None:
    """Release what ``process_groups`` made for ``pgs``: the groups outside the grid, then ``grid.destroy()``.

    The root grid's ``destroy()`` releases every family of the grid and its
    views (with the grid form, also those you created yourself); called on
    every rank, it ends the guard's epoch as ``destroy()`` does.

    Raises:
        GroupNotFoundError: as ``grid_of``.
    """
    grid = grid_of(pgs)
    owner = _OWNERS.pop(id(pgs))
    for group in owner.outside:
        dist.destroy_process_group(group)
    grid.destroy()


_SIZES = ("tp", "pp", "cp", "ep", "etp", "dp", "gtp_remat", "egtp_remat", "order", "rank_offset", "backend")


@public
def process_groups(
    grid: HyperCommGrid | None = None,
    expert: str | HyperCommGrid | None = None,
    *,
    embedding: bool = True,
    distributed_optimizer_instances: int = 1,
    hierarchical_cp: Sequence[int] | None = None,
    all_gather: bool = False,
    tp: int | None = None,
    pp: int | None = None,
    cp: int | None = None,
    ep: int | None = None,
    etp: int | None = None,
    dp: int | None = None,
    gtp_remat: int | None = None,
    egtp_remat: int | None = None,
    order: str | None = None,
    rank_offset: int | None = None,
    backend: str | None = None,
    **grid_options: Any,
) -> Any:
    """Megatron-Core's ``ProcessGroupCollection``, every field, as ``initialize_model_parallel`` makes them.

    **Collective**: every rank of the world calls it with the same arguments.
    Two forms. One call from sizes (``grid`` None): the sizes, ``order`` and
    ``rank_offset`` of ``initialize_model_parallel`` (``etp`` defaults to
    ``tp``; ``dp`` None fills the world) build the dense grid (dims ``tp``,
    ``gtp_remat``, ``cp``, ``dp``, ``pp`` in Megatron's order) and its expert
    view ``"expert"`` (``etp``, ``ep``, ``egtp_remat``, ``edp``, ``pp``);
    ``grid_options`` go to ``HyperCommGrid`` (``strategy``, ``guard``,
    ``share_groups``, ...). From a grid: its dims ``tp``, ``cp``, ``dp``,
    ``pp``, ``gtp_remat`` (a missing one counts as size 1) and the expert
    view ``expert`` (``expt_tp``/``etp``, ``ep``, ``expt_dp``/``edp``,
    ``egtp_remat``, ``pp``); without one, Megatron's (ep 1, etp = tp) is
    registered as ``"megatron.expert"`` when the grid's dims are Megatron's.
    With sharing on (the default), when every expert family has the members
    of one of the grid's, the expert fields are those grid families and the
    view needs no batch of its own (``grid.pg(dims, view="expert")`` makes a
    view family later, sharing the object).

    Each field is the family Megatron builds it from (``mp`` tp-gtp_remat-pp,
    ``tp_dp_cp`` tp-gtp_remat-dp-cp, ``dp_cp_gtp_remat`` gtp_remat-dp-cp, ...;
    a field of size-1 dims only holds single-rank groups), or the same object
    where Megatron hands out one (``dp_cp_gtp_remat`` is ``dp_cp`` when
    gtp_remat is 1; with one distributed-optimizer instance ``intra_dp_cp`` is
    ``dp_cp``, ``intra_expt_dp`` is ``expt_dp``, ``intra_dist_opt`` the whole
    grid and ``inter_dist_opt`` None). ``hcp`` is None unless
    ``hierarchical_cp`` is given; ``dp_cp_ag`` / ``expt_dp_ag`` are None
    (as ``use_mpu_process_groups``) unless ``all_gather``: then ``"ag"``-tagged
    twins of ``dp_cp`` and (with ep > 1, as Megatron) ``expt_dp``. ``embd``
    (first and last stage of each pipeline) and ``pos_embd`` (first stage),
    unless ``embedding`` is False: the ``pp`` group and a single-rank family
    where those have the members and sharing is on, else groups made by
    enumeration. See docs/migrate/megatron.md.

    Args:
        grid: a dense grid (or a grid from its ``view()``: its root is used); None: build one from the sizes.
        expert: the expert view: a name given to ``register_view``, or a grid returned by ``view()``.
        embedding: make ``embd`` and ``pos_embd``.
        distributed_optimizer_instances: Megatron's ``num_distributed_optimizer_instances``.
        hierarchical_cp: Megatron's ``hierarchical_context_parallel_sizes`` (innermost first).
        all_gather: make the all-gather twins (Megatron's ``create_all_gather_groups``).
        tp, pp, cp, ep, etp, dp, gtp_remat, egtp_remat, order, rank_offset, backend: the one-call form's
            sizes (default 1; ``order`` ``"tp-cp-ep-dp-pp"``).
        **grid_options: the one-call form's other ``HyperCommGrid`` settings.

    Returns:
        Megatron-Core's ``ProcessGroupCollection`` when megatron-core imports,
        else hypergrid's dataclass with the same fields; ``grid_of(pgs)`` is its grid.

    Raises:
        UnexpectedArgumentError: (a ``TypeError``) sizes or grid settings given with a grid, or an unknown setting.
        InvalidArgumentError: (a ``ValueError``) ``grid`` is not a grid, ``expert`` neither a view's name nor a
            grid, a flag not True or False.
        GridSpecError: sizes Megatron refuses (they do not fit the world, a size
            larger than 1 missing from ``order``, the pipeline groups of the
            grid and the expert view differ, ``distributed_optimizer_instances``
            does not divide dp*cp or the expert dp size, ...).
        ViewNotFoundError: (a ``KeyError``) ``expert`` names no registered view.
        NotInitializedError: torch.distributed is not initialized.
        DesyncError: (guard on) the ranks asked for different collections.

    Examples:
        >>> import torch.distributed as dist
        >>> dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        >>> pgs = process_groups(tp=1, pp=1, ep=1, all_gather=True)
        >>> grid = grid_of(pgs)
        >>> pgs.tp is grid.get_pg("tp"), pgs.intra_dp_cp is pgs.dp_cp, pgs.expt_dp is grid.get_pg("dp")
        (True, True, True)
        >>> pgs.ep is grid.pg("ep", view="expert")  # the expert view shares it (made on first use: collective)
        True
        >>> pgs.dp_cp_ag is grid.get_pg("dp-cp", tag="ag"), pgs.expt_dp_ag, pgs.inter_dist_opt
        (True, None, None)
        >>> destroy_process_groups(pgs); dist.destroy_process_group()
    """
    if not (dist.is_available() and dist.is_initialized()):
        raise NotInitializedError(
            "process_groups() creates process groups: call torch.distributed.init_process_group() on every rank first"
        )
    check_instance("", "grid", grid, HyperCommGrid, "None or a HyperCommGrid", optional=True)
    expected = "None, a view's name or a grid from view()"
    check_instance("", "expert", expert, (str, HyperCommGrid), expected, optional=True)
    embedding, all_gather = check_bool("", "embedding", embedding), check_bool("", "all_gather", all_gather)
    given = {name: value for name, value in zip(_SIZES, (tp, pp, cp, ep, etp, dp, gtp_remat, egtp_remat, order,
                                                         rank_offset, backend)) if value is not None}  # fmt: skip
    if grid is None:
        grid, expert = _one_call(given, grid_options)
    elif given or grid_options:
        raise UnexpectedArgumentError(
            f"process_groups(grid, ...) takes its layout from the grid; {sorted({*given, *grid_options})} belong "
            "to the one-call form process_groups(tp=..., pp=..., ...) without a grid"
        )
    root = family_index(grid).root
    view = family_index(expert).view_name if isinstance(expert, HyperCommGrid) else expert
    # As plain ints: the request below is text, and ranks that pass 2 and numpy's 2 ask for the same.
    distributed_optimizer_instances = positive("distributed_optimizer_instances", distributed_optimizer_instances)
    if hierarchical_cp is not None:
        if isinstance(hierarchical_cp, (str, bytes)) or not isinstance(hierarchical_cp, Sequence):
            raise GridSpecError(
                f"hierarchical_cp must be a list of positive ints, innermost first, got {shown(hierarchical_cp)}"
            )
        hierarchical_cp = [positive("hierarchical_cp", size) for size in hierarchical_cp]
    if view is not None:
        family_index(root).rank_view(view)  # ViewNotFoundError before anything is registered
    plan = plan_fields(
        root, view, instances=distributed_optimizer_instances, hierarchical_cp=hierarchical_cp, all_gather=all_gather
    )
    for name, (shape, names) in plan.views.items():
        shared = ["pp"] if name == plan.expert and "pp" in root.dim_names and "pp" in names else []
        root.view(shape, names, shared, name=name)
    # Every batch carries the whole request as its groups' description, which the guard compares: ranks that
    # ask for different collections fail in the first round alike, not in a later batch or enumeration alone.
    expert_layout = None if plan.expert is None else family_index(root).rank_view(plan.expert)
    request = (
        f"megatron(expert={plan.expert!r} {expert_layout and (expert_layout.shape, expert_layout.dim_names)}, "
        f"distributed_optimizer_instances={distributed_optimizer_instances!r}, hierarchical_cp={hierarchical_cp!r}, "
        f"all_gather={all_gather!r}, embedding={embedding!r})"
    )
    label = root.group_options.get("group_desc")
    values = _create(root, plan, request if label is None else f"{label} {request}")
    if embedding:
        _embedding(root, plan, values)
    outside: list[Any] = []
    for name, ranks in plan.outside.items():
        values[name] = _enumerated(root, ranks, outside)
    for name, same in plan.same.items():
        values[name] = values.get(same)
    cls = collection_class()
    known = {f.name for f in fields(cls)} if is_dataclass(cls) else set(PG_FIELDS)
    pgs = cls(**{name: values.get(name) for name in PG_FIELDS if name in known})
    _OWNERS[id(pgs)] = _Owner(root, outside)
    weakref.finalize(pgs, _OWNERS.pop, id(pgs), None)
    return pgs


def _one_call(given: dict[str, Any], grid_options: dict[str, Any]) -> tuple[HyperCommGrid, str]:
    """The dense grid and its expert view ``"expert"`` of the one-call form."""
    settings = set(inspect.signature(HyperCommGrid).parameters) - {"shape", "dim_names", "rank_offset", "backend"}
    unknown = sorted(set(grid_options) - settings)
    if unknown:
        raise UnexpectedArgumentError(
            f"process_groups() got unknown setting(s) {unknown}; sizes: {list(_SIZES)}, grid settings: "
            f"{sorted(settings)}"
        )
    sizes = {"tp": 1, "pp": 1, "cp": 1, "ep": 1, "gtp_remat": 1, "egtp_remat": 1, **given}
    dense, _ = build_grids(
        tp=sizes["tp"],
        pp=sizes["pp"],
        cp=sizes["cp"],
        ep=sizes["ep"],
        etp=sizes.get("etp", sizes["tp"]),
        dp=sizes.get("dp"),
        order=sizes.get("order", DEFAULT_ORDER),
        gtp_remat=sizes["gtp_remat"],
        egtp_remat=sizes["egtp_remat"],
        unit_gtp=True,
        rank_offset=sizes.get("rank_offset", 0),
        backend=sizes.get("backend"),
        options=grid_options,
        view_name="expert",
    )
    return dense, "expert"


def _create(root: HyperCommGrid, plan: Plan, request: str) -> dict[str, Any]:
    """Create the plan's families, one guarded batch per view (then per view for the tagged twins); the groups.

    ``request`` describes the whole call: it is every batch's ``group_desc``.
    """
    wanted: dict[tuple[str | None, str | None], list[tuple[str, ...]]] = {}
    index = family_index(root)
    every: list[tuple[Family, str | None]] = [(family, None) for family in plan.families.values()]
    every += [(family, None) for levels in plan.levels.values() for family in levels]
    every += [(family, AG_TAG) for family in plan.tagged.values()]
    for (view, dims), tag in every:
        batch = wanted.setdefault((view, tag), [])
        if all(index.family_key(dims, view) != index.family_key(other, view) for other in batch):
            batch.append(dims)
    for (view, tag), batch in wanted.items():
        missing = [dims for dims in batch if not index.is_created(dims, view, tag)]
        if missing:
            root.create_pgs(missing, view=view, tag=tag, group_desc=request)

    def group(family: Family, tag: str | None = None) -> Any:
        return root.get_pg(family[1], view=family[0], tag=tag)

    values = {name: group(family) for name, family in plan.families.items()}
    values.update({name: [group(family) for family in levels] for name, levels in plan.levels.items()})
    values.update({name: group(family, AG_TAG) for name, family in plan.tagged.items()})
    if any(value is None for value in values.get("hcp", ())):
        values["hcp"] = None  # outside the grid
    return values


def _embedding(root: HyperCommGrid, plan: Plan, values: dict[str, Any]) -> None:
    """``embd`` and ``pos_embd``: grid groups where one has their members and sharing is on, else enumerated.

    Every decision here is the same on every rank (enumeration is collective over the world).
    """
    pp = present(root.dim_names, ("pp",))
    stages = root.get_rank_enum(list(pp)) if pp else [[rank] for rank in range(root.rank_offset, root.rank_offset
                                                                                   + root.size)]  # fmt: skip
    embd, pos_embd = embedding_ranks(stages)
    if root.share_groups and len(stages[0]) <= 2:
        plan.same["embd"] = "pp"  # first and last stage: the whole pipeline
    else:
        plan.outside["embd"] = embd
    single = next((family for family in plan.families.values() if _single(root, family)), None)
    if not root.share_groups or single is None:
        plan.outside["pos_embd"] = pos_embd
    elif dist.get_rank() in {group[0] for group in pos_embd}:
        values["pos_embd"] = root.get_pg(single[1], view=single[0])
    else:
        values["pos_embd"] = None  # not a first stage (or outside the grid)


def _single(root: HyperCommGrid, family: Family) -> bool:
    layout = family_index(root).rank_view(BASE_VIEW if family[0] is None else family[0]).layout
    return layout.group_size(list(family[1])) == 1


def _enumerated(root: HyperCommGrid, ranks: list[list[int]], outside: list[Any]) -> Any:
    """The caller's group among ``ranks`` (made by every rank with ``new_subgroups_by_enumeration``), or None."""
    options = {name: root.group_options[name] for name in ("timeout", "pg_options") if name in root.group_options}
    mine, _ = dist.new_subgroups_by_enumeration(ranks, backend=root.backend, **options)  # type: ignore[no-untyped-call]
    if mine is not None:
        outside.append(mine)
    return mine
