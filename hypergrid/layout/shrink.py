"""What a shrink does to the ranks, before any process is touched: the new world's order and the new grid.

``grid.shrink`` (``hypergrid.grid.elastic``) agrees on the dead ranks, then
asks `plan_shrink` what the world becomes. Pure: the plan is the same on
every survivor that agrees on the dead set, so each one computes it alone.

The old world, ranks ``0 .. world-1``: ranks below the grid's ``rank_offset``,
the grid, ranks after it, and the last ``spares`` ranks (outside the grid,
waiting to take over). The new world keeps that order with the dead (and, under
``"drop"``, the retired) left out, so new ranks are contiguous and the kept
ranks of the grid keep their relative order, which is the new grid's layout
order: removing whole slices of one dim keeps the rank order of what is left.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from hypergrid.errors import InvalidArgumentError, RankFailure
from hypergrid.layout.grid_layout import GridLayout
from hypergrid.values import shown

__all__ = ["POLICIES", "ShrinkPlan", "check_replica_dim", "check_replicas", "plan_shrink"]

#: The shrink policies: remove the slices of ``dim`` that hold a dead rank, fill from spares, or spares then drop.
POLICIES = ("drop", "spares", "spares_then_drop")


@dataclass(frozen=True)
class ShrinkPlan:
    """The world after a shrink.

    Attributes:
        policy: what was applied: ``"drop"`` or ``"spares"``.
        shape: the new grid's shape (``dim`` smaller under ``"drop"``).
        rank_offset: the new grid's first rank.
        spares: spares left waiting in the new world.
        order: the old rank of each new rank (new rank ``i`` is old rank ``order[i]``).
        dead: the dead old ranks, sorted.
        retired: old ranks alive but left out (the rest of a removed slice), sorted.
        source: new rank of a spare that took over -> an old rank, alive and kept,
            with the same coordinates on every dim but ``dim`` (holds the same shard).
        arrived: the processes that arrived after the job began and are taken in (as old ranks numbered from
            the old world's size: `hypergrid.layout.grow.plan_regrow`); empty for a shrink.
    """

    policy: str
    shape: tuple[int, ...]
    rank_offset: int
    spares: int
    order: tuple[int, ...]
    dead: tuple[int, ...]
    retired: tuple[int, ...]
    source: dict[int, int] = field(default_factory=dict)
    arrived: tuple[int, ...] = ()

    @property
    def old_to_new(self) -> dict[int, int]:
        """Old rank -> new rank, for every rank of the new world."""
        return {old: new for new, old in enumerate(self.order)}


def check_policy(policy: object) -> str:
    """Validate a shrink policy.

    Examples:
        >>> check_policy("drop")
        'drop'
    """
    if not isinstance(policy, str) or policy not in POLICIES:
        raise InvalidArgumentError(f"policy must be one of {list(POLICIES)}, got {shown(policy)}")
    return str(policy)


def check_replicas(replicas: object, dim_names: Sequence[str], shape: Sequence[int], spares: int) -> tuple[str, ...]:
    """The grid's replica dims (``None``: ``("dp",)`` where the grid has a ``dp`` dim, else none), checked.

    A replica dim is one whose every slice holds a whole copy of the model: the only dims a shrink may drop slices
    of or a spare may fill (docs/elastic.md). Spares on a grid whose every replica dim has size 1 are refused: a
    drafted spare takes the state of the rank it replaces from a replica peer, and none exists.

    Examples:
        >>> check_replicas(None, ["tp", "dp"], [2, 4], 0), check_replicas("edp", ["tp", "edp"], [2, 4], 1)
        (('dp',), ('edp',))
        >>> check_replicas(["pp"], ["tp", "dp"], [2, 4], 0)
        Traceback (most recent call last):
          ...
        hypergrid.errors.InvalidArgumentError: replicas=['pp']: 'pp' is not a dim of the grid ['tp', 'dp']
    """
    if replicas is None:
        names: tuple[str, ...] = ("dp",) if "dp" in dim_names else ()
    elif isinstance(replicas, str):
        names = (replicas,)
    elif isinstance(replicas, (list, tuple)) and all(isinstance(name, str) for name in replicas):
        names = tuple(replicas)
    else:
        raise InvalidArgumentError(f"replicas={shown(replicas)}: expected a dim name, a list of dim names or None")
    for name in names:
        if name not in dim_names:
            raise InvalidArgumentError(
                f"replicas={shown(replicas)}: {name!r} is not a dim of the grid {list(dim_names)}"
            )
    if len(set(names)) != len(names):
        raise InvalidArgumentError(f"replicas={shown(replicas)}: a dim is named twice")
    sizes = {name: size for name, size in zip(dim_names, shape)}
    if spares and names and all(sizes[name] == 1 for name in names):
        raise InvalidArgumentError(
            f"spares={spares} with every replica dim of size 1 ({', '.join(f'{n}={sizes[n]}' for n in names)}): a "
            "drafted spare takes the state of the rank it replaces from a replica peer, and this grid has none; "
            "give a replica dim 2 or more, or no spares (restart from a checkpoint instead)"
        )
    return names


def check_replica_dim(call: str, dim: str, replicas: Sequence[str]) -> None:
    """``dim`` is one of the grid's replica dims, or ``call`` is refused before anything communicates.

    Examples:
        >>> check_replica_dim("shrink", "tp", ("dp",))
        Traceback (most recent call last):
          ...
        hypergrid.errors.InvalidArgumentError: shrink: dim='tp' is not a replica dim of this grid (replicas=['dp']): ...
    """
    if dim not in replicas:
        raise InvalidArgumentError(
            f"{call}: dim={dim!r} is not a replica dim of this grid (replicas={list(replicas)}): dropping or "
            f"filling a slice of {dim!r} would lose part of the model, not a copy of it; shrink along a replica "
            f"dim, or declare {dim!r} one (HyperCommGrid(..., replicas=[...])) if each of its slices holds a "
            "whole copy of the model"
        )


def plan_shrink(layout: GridLayout, world: int, spares: int, dead: Iterable[int], dim: str, policy: str) -> ShrinkPlan:
    """The new world and grid once ``dead`` are gone, under ``policy`` along ``dim``.

    Args:
        layout: the old grid's layout.
        world: the old world's size.
        spares: how many of the old world's last ranks are spares.
        dead: the dead old ranks.
        dim: the replica dim whose slices ``"drop"`` removes.
        policy: one of `POLICIES`.

    Raises:
        RankFailure: every slice of ``dim`` holds a dead rank (nothing left to
            carry on with), or ``"spares"`` without enough live spares.

    Examples:
        >>> plan = plan_shrink(GridLayout([2, 4], ["tp", "dp"]), 8, 0, [3], "dp", "drop")
        >>> plan.shape, plan.order, plan.retired
        ((2, 3), (0, 1, 4, 5, 6, 7), (2,))
        >>> plan = plan_shrink(GridLayout([2, 4], ["tp", "dp"]), 9, 1, [3], "dp", "spares")
        >>> plan.order, plan.source
        ((0, 1, 2, 8, 4, 5, 6, 7), {3: 1})
    """
    gone = sorted(set(dead))
    dead_set = set(gone)
    first, end = layout.rank_offset, layout.rank_offset + layout.size
    dead_grid = [rank for rank in gone if first <= rank < end]
    live_spares = [rank for rank in range(world - spares, world) if rank not in dead_set]
    below = [rank for rank in range(first) if rank not in dead_set]
    after = [rank for rank in range(end, world - spares) if rank not in dead_set]
    old = _Survey(layout, gone, dead_grid, live_spares, below, after)
    if policy == "spares_then_drop":
        policy = "spares" if len(dead_grid) <= len(live_spares) else "drop"
    if policy == "spares":
        if len(dead_grid) > len(live_spares):
            raise RankFailure(
                f"policy 'spares': {len(dead_grid)} rank(s) of the grid died ({dead_grid}) but only "
                f"{len(live_spares)} spare(s) are alive ({live_spares}); use policy 'spares_then_drop' to drop "
                "slices instead",
                gone,
            )
        return _fill(old, dim)
    return _drop(old, dim)


@dataclass(frozen=True)
class _Survey:
    """The old world once the dead are known: who died in the grid, the live spares, the live ranks around."""

    layout: GridLayout
    gone: list[int]
    dead_grid: list[int]
    live_spares: list[int]
    below: list[int]  # live ranks before the grid
    after: list[int]  # live ranks between the grid and the spares


def _fill(old: _Survey, dim: str) -> ShrinkPlan:
    layout = old.layout
    first, end = layout.rank_offset, layout.rank_offset + layout.size
    drafted = dict(zip(old.dead_grid, old.live_spares))
    grid = [drafted.get(rank, rank) for rank in range(first, end)]
    order = (*old.below, *grid, *old.after, *old.live_spares[len(drafted) :])
    new_of = {rank: new for new, rank in enumerate(order)}
    source = {}
    for dead_rank, spare in drafted.items():
        holders = [rank for rank in layout.group_ranks([dim], dead_rank) if rank not in drafted]
        if holders:  # no holder left: every replica of this shard died; restore it from a checkpoint
            source[new_of[spare]] = holders[0]
    spares_left = len(old.live_spares) - len(drafted)
    return ShrinkPlan("spares", tuple(layout.shape), len(old.below), spares_left, order, tuple(old.gone), (), source)


def _drop(old: _Survey, dim: str) -> ShrinkPlan:
    layout = old.layout
    index = layout.dim_indices(dim)[0]
    removed = sorted({layout.coords_of(rank)[index] for rank in old.dead_grid})
    size = layout.shape[index]
    if len(removed) == size:
        raise RankFailure(
            f"every slice of dim {shown(dim)} (size {size}) holds a dead rank (dead: {old.gone}): no complete replica "
            "is left to carry on with; restart from a checkpoint",
            old.gone,
        )
    kept: list[int] = []
    retired: list[int] = []
    dead = set(old.gone)
    for rank in range(layout.rank_offset, layout.rank_offset + layout.size):
        if rank in dead:
            continue
        (retired if layout.coords_of(rank)[index] in removed else kept).append(rank)
    shape = list(layout.shape)
    shape[index] -= len(removed)
    order = (*old.below, *kept, *old.after, *old.live_spares)
    return ShrinkPlan(
        "drop", tuple(shape), len(old.below), len(old.live_spares), order, tuple(old.gone), tuple(retired)
    )
