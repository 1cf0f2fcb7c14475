"""Guarded creation: the one guard round behind each ``create_pg`` or ``create_pgs`` call.

``HyperCommGrid`` (the registry) decides what to create; this facet orders a
batch of families canonically and runs the consistency guard
(``hypergrid.agreement.guard``) once for the whole batch, with every family's key and
options in one request.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import torch.distributed as dist

from hypergrid.agreement.guard import (
    CreationRequest,
    agree,
    creation_failed,
    grid_scope,
    settle,
)
from hypergrid.agreement.listening import creating
from hypergrid.agreement.world import World
from hypergrid.binding.creation import (
    check_can_split,
    check_creatable,
    check_strategy,
    create_family,
    held_group_count,
)
from hypergrid.binding.facet import Facet, FacetCore
from hypergrid.binding.failures import abort_groups
from hypergrid.binding.options import check_tag, describe_options, family_options
from hypergrid.binding.registry import PgKey, create_uninitialized, for_view, guard_key, member_or_none, scoped, tagged
from hypergrid.errors import (
    DesyncError,
    DimsError,
    GroupExistsError,
    GuardTimeoutError,
    HyperGridError,
)
from hypergrid.grid.core import check_fits
from hypergrid.grid.settings import settings
from hypergrid.grid.views import BASE_VIEW
from hypergrid.layout import Dims, GridLayout
from hypergrid.layout.hierarchy import hierarchical_family, node_size, resolve_scope
from hypergrid.values import shown

__all__ = ["GuardedCreation", "create_missing"]

#: One family of a batch: its registry key, the layout that enumerates it, its dims in canonical order.
Plan = tuple[PgKey, GridLayout, tuple[str, ...]]


class GuardedCreation(Facet):
    """Batch creation and the guard round of a creation (a facet object; the core's ``create_families`` is its)."""

    def _batch(self, dims_list: object, view: str | None) -> list[Dims]:
        """The families of ``dims_list`` in canonical order (fewest dims first); refuses empty lists and repeats."""
        if isinstance(dims_list, (str, bytes)) or not isinstance(dims_list, (list, tuple)):
            raise DimsError(
                f"create_pgs takes a list of dims (each a dim name, a key like 'dp-tp' or a list of names), "
                f"got {shown(dims_list)}"
            )
        if not dims_list:
            raise DimsError("create_pgs needs at least one family, got an empty list")
        seen: dict[PgKey, Dims] = {}
        order: dict[PgKey, tuple[int, int]] = {}
        for dims in dims_list:
            key, _, spec = self._core.family(dims, view)
            if key in seen:
                raise DimsError(
                    f"create_pgs got {shown(seen[key])} and {shown(dims)}, which name the same family {key!r}; "
                    "list each family once"
                )
            seen[key] = dims
            mask = sum(1 << index for index in spec.layout.dim_indices(dims))
            order[key] = (bin(mask).count("1"), mask)
        return [seen[key] for key in sorted(seen, key=lambda key: order[key])]

    def create_pgs(
        self,
        /,
        dims_list: Sequence[Dims],
        *,
        view: str | None = None,
        strategy: str | None = None,
        tag: str | None = None,
        **kwargs: Any,
    ) -> dict[PgKey, dist.ProcessGroup | None]:
        """Create many families in one step, behind ONE guard round; return the caller's group of each.

        Collective like ``create_pg`` (the same ranks take part; with
        ``"local"``, the members of the caller's group over all the batch's dims
        together), with the same keyword arguments, applied to every family.
        The families are created in one canonical order (fewest dims first, as
        ``layout.all_families()``) whatever order they are listed in, so ranks
        that list them differently still agree. Everything is checked before
        anything is created.

        Args:
            dims_list: the families, each as ``create_pg`` takes dims.
            view: a registered view's name (default: this grid's).
            strategy: overrides the grid's for these families.
            tag: as for ``create_pg``, applied to every family.
            **kwargs: ``timeout``, ``pg_options``, ``group_desc``, ``backend``, as for ``create_pg``.

        Returns:
            Canonical key (``key@tag`` when tagged) -> the group holding the
            calling rank (``None`` outside the grid), in canonical order.

        Raises:
            DimsError: ``dims_list`` is empty or not a list, an entry names an
                unknown or repeated dim, or two entries name the same family.
            GroupExistsError: (a ``KeyError``) a family was already created.
            (and every other error of ``create_pg``: ``DesyncError``, ``GuardTimeoutError``, ...)

        Examples:
            >>> import torch.distributed as dist
            >>> from hypergrid import HyperCommGrid
            >>> dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
            >>> grid = HyperCommGrid([1, 1], ["tp", "dp"])
            >>> groups = grid.create_pgs([["tp", "dp"], "tp", "dp"])
            >>> list(groups), groups["dp-tp"] is grid.get_pg("tp-dp")
            (['tp', 'dp', 'dp-tp'], True)
            >>> grid.destroy(); dist.destroy_process_group()
        """
        ordered = self._batch(dims_list, view)
        groups = create_families(self._core, ordered, view, strategy, tag, kwargs, "create_pgs").values()
        layout = self._core.family(ordered[0], view)[2].layout
        scope = resolve_scope(kwargs.get("within"), kwargs.get("across"))
        return {tagged(scoped(layout.key(dims), scope), check_tag(tag)): group for dims, group in zip(ordered, groups)}


def _guard_round(
    core: FacetCore,
    world: World,
    plans: Sequence[Plan],
    strategy: str,
    options: tuple[tuple[str, str], ...],
    held_groups: int | None,
    member: int | None,
    views: tuple[str, ...] = (),
    reuses: tuple[str, ...] = (),
    guarded: bool = True,
) -> list[tuple[Sequence[int], str] | None]:
    """Count the creation and (guard on, and ``guarded``) agree on it with the ranks that take part, in one round.

    ``member``: for ``"local"``, the calling rank when it is in the grid
    (the participants are its group over all the batch's dims of one
    layout); ``None`` otherwise. Returns, for each plan, the participants
    and the prefix of its round (for the commit and a roll call if torch
    then fails), None where no round ran; nothing with the guard off.
    """
    sequence = core.count_creation()
    grid = core.grid
    if not (grid.guard and guarded):
        return []
    rounds: list[tuple[Sequence[int], Any, Sequence[Plan]]] = []
    describe = core.describe()
    if strategy == "local":
        if member is None:
            return []  # outside the grid: this rank creates nothing and takes part in nothing
        by_layout: dict[int, list[Plan]] = {}
        for plan in plans:
            by_layout.setdefault(id(plan[1]), []).append(plan)
        for same_layout in by_layout.values():
            dims = sorted({name for _, _, ordered in same_layout for name in ordered})
            members: Sequence[int] = same_layout[0][1].group_ranks(dims, member)
            scope = grid_scope(describe, core.ordinal_in(world), core.epoch, sequence, members)
            rounds.append((members, scope, same_layout))
    else:
        scope = grid_scope(describe, core.ordinal_in(world), core.epoch, sequence, None)
        rounds.append((range(world.size), scope, plans))
    by_key: dict[PgKey, tuple[Sequence[int], str] | None] = {}
    for participants, scope, batch in rounds:
        request = CreationRequest(
            grid=describe,
            keys=tuple(guard_key(key) for key, _, _ in batch),
            strategy=strategy,
            grid_sequence=sequence,
            held_groups=held_groups,
            options=options,
            grid_ordinal=core.ordinal_in(world),
            epoch=core.epoch,
            settings=settings(core.root),  # every constructor setting, from the signature
            views=views,
            reuses=reuses,
        )
        try:
            ran = agree(
                world, request, participants, scope, grid.guard_timeout_s, grid.guard_progress_s, core.guard_ledger
            )
        except (DesyncError, GuardTimeoutError) as error:
            core.seen_epoch(error.epoch)  # destroy() starts an epoch past every rank's
            raise
        by_key.update({key: (participants, scope.prefix) if ran else None for key, _, _ in batch})
    return [by_key[key] for key, _, _ in plans]


def create_families(
    core: FacetCore,
    dims_list: Sequence[Dims],
    view: str | None,
    strategy: str | None,
    tag: str | None,
    kwargs: dict[str, Any],
    call: str,
    bound_s: float | None = None,
    guarded: bool = True,
) -> dict[PgKey, dist.ProcessGroup | None]:
    """The steps of create_pg and create_pgs: check everything, one guard round, create in order.

    ``kwargs`` may hold ``within``/``across`` and ``ranks_per_node`` (a
    hierarchy's half, see ``hypergrid.layout.hierarchy``), then the group options.
    ``bound_s``: with no guard round, how long torch may wait for a group's other members
    (``shrink`` re-creating families); with one, the guard's timeout bounds it. ``guarded`` False: no guard round
    whatever the grid's setting (``shrink`` re-creating families its agreement compared).
    Returns registry key -> the caller's group, in creation order.
    """
    root, grid = core.root, core.grid
    if root is not grid:  # a grid from view(): the root creates (one owner, one guard sequence)
        view = view or core.view_name
        return create_families(root._core, dims_list, view, strategy, tag, kwargs, call, bound_s, guarded)
    tag = check_tag(tag)
    kwargs = dict(kwargs)
    scope = resolve_scope(kwargs.pop("within", None), kwargs.pop("across", None))
    per_node = kwargs.pop("ranks_per_node", None)
    core.node_size_of(None, per_node, scope)  # refuses a node size without a half
    if scope is not None:
        per_node = node_size(per_node)  # once per batch (LOCAL_WORLD_SIZE when not given)
    backend, options = family_options(kwargs, grid.group_options, grid.backend, tag)
    chosen = grid.strategy if strategy is None else check_strategy(strategy)
    plans: list[Plan] = []
    unsplit: list[Plan] = []  # the unsplit families: "local" agrees over their groups, whatever the node size
    views: dict[str, str] = {}  # every registered view the batch enumerates, as the guard compares it
    for dims in dims_list:
        family, layout, spec = core.family(dims, view)
        if spec.name != BASE_VIEW:
            views[spec.name] = f"{spec.name}: shape {spec.shape} over {spec.dim_names}, shared {spec.shared_dims}"
        ordered = spec.layout.canonical_dims(dims)
        base = (layout, ordered)
        if scope is not None:
            family = scoped(family, scope)
            layout, ordered = hierarchical_family(layout, ordered, scope, per_node)
        key = tagged(family, tag)
        if key in core.registry.groups:
            what = "" if tag is None else f" with tag {tag!r}"
            raise GroupExistsError(
                f"Process group {shown(dims)}{for_view(key)}{what} has already been created on this grid "
                f"(key {key!r}); use get_pg to fetch it, or destroy() the grid's groups first"
            )
        plans.append((key, layout, ordered))
        unsplit.append((key, *base))
    if not (dist.is_available() and dist.is_initialized()):
        for key, layout, ordered in plans:
            core.registry.groups[key] = create_uninitialized(
                chosen, layout.rank_enum(ordered), {**options, "backend": backend}
            )
        return _created(core, plans, per_node)
    world = core.world_for(call)  # a grid a shrink replaced creates nothing
    world.alarm.check(call)  # nor does a fenced rank, or one whose world failed
    check_fits(grid, world.size)
    if chosen == "split":
        check_can_split(backend)
    families = ", ".join(repr(guard_key(key)) for key, _, _ in plans)
    check_creatable(chosen, backend, f"{call} {families}")  # before the guard waits for the other ranks
    # Only members-only creation needs the caller's own group: skip that O(group) work otherwise.
    rank = world.rank
    local = chosen == "local" and grid.layout.contains(rank)
    # Which groups this rank would share (held by which key) or create: part of the request, so a rank
    # that released a group on its own cannot create it while the others share theirs.
    pool = core.registry.pool
    shares = [pool.shared(*plan[1:], plan[0], backend, options, tag, grid.share_groups) for plan in plans]
    reuses = tuple("" if entry is None else guard_key(next(iter(entry.holders))) for _, entry in shares)
    # Only a members-only creation that makes a new group depends on how many groups this rank holds.
    new = local and any(entry is None for _, entry in shares)
    described: tuple[tuple[str, str], ...] = (("backend", repr(backend)), ("options", describe_options(options)))
    if scope is not None:  # ranks that disagree on the node size would build different groups
        described += (("ranks_per_node", str(per_node)),)
    rounds = _guard_round(
        core,
        world,
        unsplit,
        chosen,
        described,
        held_group_count() if new else None,
        rank if local else None,
        tuple(views[name] for name in sorted(views)),
        reuses,
        guarded,
    )
    bound = grid.guard_timeout_s if any(rounds) else bound_s
    started = time.monotonic()
    added: list[PgKey] = []  # what this call registered: rolled back unless every participant commits
    try:
        with creating(world, call):  # the world's failure ends torch's waits for a dead member
            for index, (key, layout, ordered) in enumerate(plans):
                my_ranks = layout.group_ranks(ordered, rank) if local else None
                # Again, now: a family of this batch may share the group an earlier one just made.
                sharing, shared = pool.shared(layout, ordered, key, backend, options, tag, grid.share_groups)

                def create(layout: GridLayout = layout, ordered: Sequence[str] = ordered, mine: Any = my_ranks) -> Any:
                    rank_enum = None if chosen == "local" else layout.rank_enum(ordered)
                    return create_family(
                        chosen, rank_enum, mine, {**options, "backend": backend}, bound, local_names=world.local_names
                    )

                try:
                    core.registry.groups[key] = pool.keep(sharing, shared, key, create, backend, tag, options)
                    added.append(key)
                except HyperGridError:
                    raise
                except RuntimeError as error:  # torch: a peer died or hung while the groups were made
                    round_of = rounds[index] if rounds else None
                    if round_of is None:
                        raise  # no guard round: nobody can tell a dead peer from ranks that disagree
                    participants, prefix = round_of
                    raise creation_failed(
                        world, error, repr(guard_key(key)), f"{prefix}/commit", participants, started,
                        grid.guard_timeout_s, core.guard_ledger,
                    ) from error  # fmt: skip
        # Every participant must have its groups before any goes on (a death there fails them all alike).
        what = repr(guard_key(plans[0][0])) if len(plans) == 1 else f"{len(plans)} families"
        for participants, prefix in dict.fromkeys((tuple(r[0]), r[1]) for r in rounds if r is not None):
            settle(world, f"{prefix}/commit", participants, started, grid.guard_timeout_s, what, core.guard_ledger)
    except BaseException:  # roll back (docs/reliability.md): the commit's outcome is the same on every rank
        # forget them, abort what only they held
        abort_groups(core.registry.pool.release_registry(core.registry.groups, added), world.job)
        raise
    return _created(core, plans, per_node)


def _created(core: FacetCore, plans: Sequence[Plan], per_node: int | None) -> dict[PgKey, dist.ProcessGroup | None]:
    """Remember how each new family enumerates (and a half's node size); the caller's group of each."""
    for key, layout, ordered in plans:
        core.registry.families[key] = (layout, ordered, per_node)
    return {key: member_or_none(core.registry.groups[key]) for key, _, _ in plans}


def create_missing(grid: Any, families: Sequence[Dims]) -> None:
    """Create those of ``families`` that ``grid`` lacks (none: nothing communicates), on every rank of its world.

    After a shrink every rank of the new world holds the same families (the old grid's, re-created), so every
    rank finds the same ones missing: the call is collective exactly when one is. A job whose first
    ``create_pgs`` a death interrupted gets the rest of its families this way (the elastic loop, and its
    spares through ``standby(families=...)``).
    """
    held = set(grid.created_keys)
    missing = [dims for dims in families if grid.layout.key(dims) not in held]
    if missing:
        grid.create_pgs(missing)
