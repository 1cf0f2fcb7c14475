"""``plan_regrow`` against the definition of growing back (issue 47), on random grids, deaths and arrivals.

The definition, written from the issue and not from the code: the new grid keeps every shard where it was (a kept
rank's coordinates on every dim but ``dim`` are unchanged, and kept replicas keep their order along ``dim``); it
is never larger than the shape the grid was built with; under ``"drop"`` it has as many slices of ``dim`` as the
drop left plus one per whole slice the spares and live arrivals can fill, up to that shape; every rank of it that
holds no state (an arrival, a spare) names a live kept rank of the same shard as its source; nobody dead is in the
new world; arrivals beyond what the plan needs are not taken. Without a live arrival, the plan is ``plan_shrink``'s.
"""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hypergrid.errors import RankFailure
from hypergrid.layout import GridLayout
from hypergrid.layout.grow import plan_regrow
from hypergrid.layout.shrink import plan_shrink


@st.composite
def cases(draw: st.DrawFn) -> dict:
    """An origin grid, the current (shrunk along ``dim``) grid, a world around it, deaths and arrivals."""
    ndim = draw(st.integers(1, 3))
    names = ["a", "b", "c"][:ndim]
    origin = [draw(st.integers(1, 4)) for _ in range(ndim)]
    dim = draw(st.sampled_from(names))
    index = names.index(dim)
    shape = list(origin)
    shape[index] = draw(st.integers(1, origin[index]))
    offset, after = draw(st.integers(0, 2)), draw(st.integers(0, 2))
    origin_spares = draw(st.integers(0, 3))
    spares = draw(st.integers(0, origin_spares))
    layout = GridLayout(shape, names, offset)
    world = offset + layout.size + after + spares
    count = draw(st.integers(0, 2 * math.prod(shape) // shape[index] + 2))
    arrivals = list(range(world, world + count))
    dead = draw(st.lists(st.sampled_from([*range(world), *arrivals]), max_size=3, unique=True))
    policy = draw(st.sampled_from(["drop", "spares", "spares_then_drop"]))
    return {"layout": layout, "world": world, "spares": spares, "dead": dead, "dim": dim, "policy": policy,
            "arrivals": arrivals, "origin": (origin, origin_spares)}  # fmt: skip


def _plan(case: dict):  # type: ignore[no-untyped-def]
    return plan_regrow(case["layout"], case["world"], case["spares"], case["dead"], case["dim"], case["policy"],
                       case["arrivals"], case["origin"])  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(case=cases())
def test_the_plan_keeps_every_shard_and_grows_towards_the_origin(case: dict) -> None:
    layout, world, dim = case["layout"], case["world"], case["dim"]
    names, index = list(layout.dim_names), list(layout.dim_names).index(dim)
    alive_arrivals = [rank for rank in case["arrivals"] if rank not in case["dead"]]
    try:
        plan = _plan(case)
    except RankFailure:  # then plan_shrink refuses it too, arrivals counted as spares
        with pytest.raises(RankFailure):
            plan_shrink(layout, world + len(alive_arrivals), case["spares"] + len(alive_arrivals),
                        [rank for rank in case["dead"] if rank < world], dim, case["policy"])  # fmt: skip
        return
    order = list(plan.order)
    assert len(order) == len(set(order)) and not set(order) & set(case["dead"])
    assert set(plan.arrived) == {rank for rank in order if rank >= world} <= set(alive_arrivals)
    assert set(plan.dead) == set(case["dead"])
    origin_shape = case["origin"][0]
    assert all(plan.shape[i] == layout.shape[i] for i in range(len(names)) if i != index)
    assert plan.shape[index] <= max(origin_shape[index], layout.shape[index])
    new = GridLayout(list(plan.shape), names, plan.rank_offset)
    kept_order: dict[tuple[int, ...], list[tuple[int, int]]] = {}
    for rank in range(plan.rank_offset, plan.rank_offset + new.size):
        old, coords = order[rank], new.coords_of(rank)
        shard = coords[:index] + coords[index + 1 :]
        if layout.contains(old):  # a kept rank: the same shard
            old_coords = layout.coords_of(old)
            assert old_coords[:index] + old_coords[index + 1 :] == shard
            kept_order.setdefault(shard, []).append((coords[index], old_coords[index]))
        elif rank in plan.source:  # a spare or an arrival: a live kept holder of its shard
            holder = plan.source[rank]
            assert layout.contains(holder) and holder not in case["dead"] and holder in order
            held = layout.coords_of(holder)
            assert held[:index] + held[index + 1 :] == shard
        else:  # nobody holds this shard any more: only when every replica of it died ("spares" fills it)
            replicas = [r for r in range(layout.rank_offset, layout.rank_offset + layout.size)
                        if layout.coords_of(r)[:index] + layout.coords_of(r)[index + 1 :] == shard]  # fmt: skip
            assert all(r in case["dead"] for r in replicas)
    for pairs in kept_order.values():  # kept replicas keep their order along dim
        assert [old for _, old in sorted(pairs)] == sorted(old for _, old in pairs)
    if not alive_arrivals:
        assert plan == plan_shrink(layout, world, case["spares"], case["dead"], dim, case["policy"]).__class__(
            **{**plan_shrink(layout, world, case["spares"], case["dead"], dim, case["policy"]).__dict__,
               "dead": tuple(sorted(case["dead"]))})  # fmt: skip
        return
    if plan.policy == "drop":  # as many slices as the drop left, plus one per whole slice the pool fills
        dropped = plan_shrink(layout, world, case["spares"], [r for r in case["dead"] if r < world], dim, "drop")
        per_slice = new.size // plan.shape[index]
        pool = dropped.spares + len(alive_arrivals)
        grows = origin_shape[index] > dropped.shape[index] and all(
            origin_shape[i] == dropped.shape[i] for i in range(len(names)) if i != index
        )
        expected = min(origin_shape[index], dropped.shape[index] + pool // per_slice) if grows else dropped.shape[index]
        assert plan.shape[index] == expected
    spare_arrivals = [rank for rank in order[len(order) - plan.spares :] if rank >= world]
    old_spares_left = plan.spares - len(spare_arrivals)
    assert not spare_arrivals or old_spares_left + len(spare_arrivals) <= case["origin"][1]


def test_one_arrival_short_of_a_slice_is_not_taken() -> None:
    """tp2 x dp4 lost a dp slice; one arrival cannot fill a slice of two: nothing grows, nobody is taken."""
    plan = plan_regrow(GridLayout([2, 3], ["tp", "dp"]), 6, 0, [], "dp", "drop", [6], ([2, 4], 0))
    assert plan.shape == (2, 3) and plan.arrived == () and plan.order == tuple(range(6))


def test_growth_never_passes_the_origin_and_extra_arrivals_become_spares_up_to_its_count() -> None:
    plan = plan_regrow(GridLayout([2, 3], ["tp", "dp"]), 6, 0, [], "dp", "drop", [6, 7, 8, 9, 10], ([2, 4], 2))
    assert plan.shape == (2, 4) and plan.spares == 2 and plan.arrived == (6, 7, 8, 9)
    assert plan.source == {6: 0, 7: 1}
