"""What growing back does to the ranks: a shrink's plan, then the processes that arrived fill the grid again.

A process started after the job began (a replacement, `hypergrid.grid.arrival`) waits as an *arrival*. At the
next ``shrink`` (or ``grow``) the survivors agree on the arrivals waiting, and `plan_regrow` says what the world
becomes. Pure, like `hypergrid.layout.shrink.plan_shrink`: every survivor and every arrival computes the same plan
alone from the same inputs.

The arrivals are numbered after the old world (the ``i``-th agreed arrival is *old rank* ``world + i``), so a plan
is still a list of old ranks. They first join the spares (after the old spares, in their order): a ``"spares"``
policy fills a dead rank's place from them. Then the grid grows along ``dim`` towards its *origin* shape (the shape
it was built with; never past it): each whole slice of ``dim`` that the spares can fill (old spares first) is added
after the slices kept, in the layout's rank order. Arrivals left over stay spares up to the origin's number of
spares; the others are not taken (they wait for a later growth). Without a live arrival the plan is
`plan_shrink`'s, unchanged.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

from hypergrid.layout.grid_layout import GridLayout
from hypergrid.layout.shrink import ShrinkPlan, plan_shrink

__all__ = ["plan_regrow"]


def plan_regrow(
    layout: GridLayout,
    world: int,
    spares: int,
    dead: Sequence[int],
    dim: str,
    policy: str,
    arrivals: Sequence[int],
    origin: tuple[Sequence[int], int],
) -> ShrinkPlan:
    """The new world once ``dead`` are gone and ``arrivals`` (old ranks ``world ..``) came, under ``policy``.

    Args:
        layout: the old grid's layout.
        world: the old world's size.
        spares: how many of the old world's last ranks are spares.
        dead: the dead old ranks, arrivals that died among them.
        dim: the replica dim: the one ``"drop"`` shrinks and growth restores.
        policy: one of `hypergrid.layout.shrink.POLICIES`.
        arrivals: the agreed arrivals, as old ranks (``world``, ``world + 1``, ...).
        origin: the grid's origin: the shape it was built with and its number of spares (growth's target).

    Returns:
        The plan (`ShrinkPlan`): ``order`` holds the arrivals taken, ``arrived`` lists them, ``source`` names a
        holder of its shard for each rank of a new slice (and each hole an arrival filled); ``dead`` keeps the
        arrivals that died (a later attempt plans without them).

    Raises:
        RankFailure: as `plan_shrink` (every slice of ``dim`` died; ``"spares"`` without enough spares, arrivals
            counted).

    Examples:
        >>> tp_dp = GridLayout([2, 4], ["tp", "dp"])
        >>> plan = plan_regrow(tp_dp, 8, 0, [3], "dp", "drop", [8, 9], ([2, 4], 0))
        >>> plan.shape, plan.order, plan.arrived, plan.source
        ((2, 4), (0, 1, 4, 5, 6, 7, 8, 9), (8, 9), {6: 0, 7: 1})
        >>> plan_regrow(tp_dp, 8, 0, [3], "dp", "drop", [8], ([2, 4], 0)).shape  # one arrival: no whole slice
        (2, 3)
    """
    gone = sorted(set(dead))
    alive = [rank for rank in arrivals if rank not in set(gone)]
    kept_dead = [rank for rank in gone if rank < world]
    if not alive:
        return dataclasses.replace(plan_shrink(layout, world, spares, kept_dead, dim, policy), dead=tuple(gone))
    # The arrivals as spares after the old ones (positions world ..), the shrink's plan, then the growth.
    base = plan_shrink(layout, world + len(alive), spares + len(alive), kept_dead, dim, policy)
    grown = _grow(base, layout, dim, origin[0])
    trimmed = _trim(grown, world, origin[1])

    def of(rank: int) -> int:  # a position -> an old rank
        return rank if rank < world else alive[rank - world]

    order = tuple(of(rank) for rank in trimmed.order)
    return dataclasses.replace(
        trimmed,
        order=order,
        dead=tuple(gone),
        arrived=tuple(rank for rank in order if rank >= world),
        source={new: of(old) for new, old in trimmed.source.items()},
    )


def _grow(plan: ShrinkPlan, old: GridLayout, dim: str, origin_shape: Sequence[int]) -> ShrinkPlan:
    """``plan`` (of the grid ``old``) with as many whole slices of ``dim`` added from its spares as fit under
    ``origin_shape``; each rank of a new slice gets a holder of its shard (an old rank of the grid) as its source."""
    dims = old.dim_names
    shape, index = list(plan.shape), list(dims).index(dim)
    others_kept = len(origin_shape) == len(shape) and all(
        size == shape[i] for i, size in enumerate(origin_shape) if i != index
    )
    per_slice = math.prod(shape) // shape[index]
    pool = list(plan.order[len(plan.order) - plan.spares :])
    add = min(origin_shape[index] - shape[index], len(pool) // per_slice) if others_kept else 0
    if add <= 0:
        return plan
    first = plan.rank_offset
    before = GridLayout(shape, dims, first)
    grown = list(shape)
    grown[index] += add
    after = GridLayout(grown, dims, first)
    newcomers = iter(pool[: add * per_slice])
    grid: list[int] = []
    source: dict[int, int] = {}
    for rank in range(first, first + after.size):
        coords = list(after.coords_of(rank))
        if coords[index] < shape[index]:
            grid.append(plan.order[before.rank_of(coords)])
            continue
        grid.append(next(newcomers))
        holder = _holder(plan, before, coords, index, old)
        if holder is not None:  # (none: every replica of the shard died; it comes from a checkpoint)
            source[rank] = holder
    end = first + before.size
    order = (*plan.order[:first], *grid, *plan.order[end : len(plan.order) - plan.spares], *pool[add * per_slice :])
    new_of = {rank: new for new, rank in enumerate(order)}
    moved = {new_of[plan.order[new]]: old for new, old in plan.source.items()}  # the holes filled keep their holder
    return dataclasses.replace(
        plan, shape=tuple(grown), spares=plan.spares - add * per_slice, order=order, source={**moved, **source}
    )


def _holder(plan: ShrinkPlan, layout: GridLayout, coords: list[int], index: int, old: GridLayout) -> int | None:
    """An old rank that holds the shard at ``coords`` of ``layout`` (any coordinate along ``index``): a kept rank of
    the ``old`` grid, or the holder of a hole a spare filled (the plan's ``source``); None when every replica died."""
    replicas = [layout.rank_of([*coords[:index], k, *coords[index + 1 :]]) for k in range(layout.shape[index])]
    kept = [plan.order[rank] for rank in replicas if old.contains(plan.order[rank])]
    held = [plan.source[rank] for rank in replicas if rank in plan.source]
    return (kept + held + [None])[0]


def _trim(plan: ShrinkPlan, world: int, origin_spares: int) -> ShrinkPlan:
    """``plan`` without the arrivals it does not need: spares beyond the origin's count that are arrivals."""
    if not plan.spares:
        return plan
    spares = plan.order[len(plan.order) - plan.spares :]
    old = [rank for rank in spares if rank < world]
    new = [rank for rank in spares if rank >= world][: max(0, origin_spares - len(old))]
    order = (*plan.order[: len(plan.order) - plan.spares], *old, *new)
    return dataclasses.replace(plan, order=order, spares=len(old) + len(new))
