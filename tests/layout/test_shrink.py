"""``plan_shrink`` against the definition: every group of the new grid is an old group, minus what left, renumbered."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hypergrid.errors import InvalidArgumentError, RankFailure
from hypergrid.layout import GridLayout
from hypergrid.layout.shrink import check_policy, plan_shrink
from tests.strategies import GridCase, dims_of, grids, layout_of


def _world(case: GridCase, after: int, spares: int) -> int:
    return case.rank_offset + layout_of(case).size + after + spares


@settings(max_examples=150, deadline=None)
@given(case=grids(max_ndim=3, max_size=4, max_ranks=64), data=st.data())
def test_drop_keeps_each_group_minus_the_removed_slices(case: GridCase, data: st.DataObject) -> None:
    layout = layout_of(case)
    after, spares = data.draw(st.integers(0, 2)), data.draw(st.integers(0, 2))
    world = _world(case, after, spares)
    dim = data.draw(st.sampled_from(case.dim_names))
    dead = data.draw(st.lists(st.integers(0, world - 1), max_size=3, unique=True))
    index = case.dim_names.index(dim)
    removed = {layout.coords_of(r)[index] for r in dead if layout.contains(r)}
    if len(removed) == case.shape[index]:
        with pytest.raises(RankFailure, match="every slice"):
            plan_shrink(layout, world, spares, dead, dim, "drop")
        return
    plan = plan_shrink(layout, world, spares, dead, dim, "drop")
    new = GridLayout(list(plan.shape), case.dim_names, plan.rank_offset)
    gone = set(dead) | set(plan.retired)
    # By definition: the retired are the live members of removed slices; nothing else leaves.
    assert set(plan.retired) == {
        r for r in range(world) if layout.contains(r) and r not in dead and layout.coords_of(r)[index] in removed
    }
    assert sorted(plan.order) == sorted(set(range(world)) - gone)
    dims = data.draw(dims_of(case.dim_names))
    expected = []
    for group in layout.rank_enum(dims):
        if any(layout.coords_of(r)[index] in removed for r in group) and dim not in dims:
            continue  # a group inside a removed slice vanishes
        expected.append([plan.old_to_new[r] for r in group if layout.coords_of(r)[index] not in removed])
    assert new.rank_enum(dims) == expected
    assert plan.spares == len([r for r in range(world - spares, world) if r not in dead])


@settings(max_examples=150, deadline=None)
@given(case=grids(max_ndim=3, max_size=4, max_ranks=64), data=st.data())
def test_spares_take_the_dead_ranks_places(case: GridCase, data: st.DataObject) -> None:
    layout = layout_of(case)
    spares = data.draw(st.integers(0, 3))
    world = _world(case, 0, spares)
    dim = data.draw(st.sampled_from(case.dim_names))
    dead = data.draw(st.lists(st.integers(case.rank_offset, world - 1), max_size=3, unique=True))
    dead_grid = sorted(r for r in dead if layout.contains(r))
    live_spares = [r for r in range(world - spares, world) if r not in dead]
    if len(dead_grid) > len(live_spares):
        with pytest.raises(RankFailure, match="spare"):
            plan_shrink(layout, world, spares, dead, dim, "spares")
        index = case.dim_names.index(dim)
        if len({layout.coords_of(r)[index] for r in dead_grid}) < case.shape[index]:
            assert plan_shrink(layout, world, spares, dead, dim, "spares_then_drop").policy == "drop"
        return
    plan = plan_shrink(layout, world, spares, dead, dim, "spares")
    taker = dict(zip(dead_grid, live_spares))
    assert plan.shape == tuple(case.shape) and plan.retired == ()
    dims = data.draw(dims_of(case.dim_names))
    new = GridLayout(case.shape, case.dim_names, plan.rank_offset)
    # The same coordinates: each old group, with the spares in the dead ranks' places, renumbered.
    assert new.rank_enum(dims) == [
        [plan.old_to_new[taker.get(r, r)] for r in group] for group in layout.rank_enum(dims)
    ]
    for new_rank, old in plan.source.items():
        took = plan.order[new_rank]
        replaced = next(d for d, s in taker.items() if s == took)
        others = [i for i, name in enumerate(case.dim_names) if name != dim]
        assert [layout.coords_of(old)[i] for i in others] == [layout.coords_of(replaced)[i] for i in others]
        assert old not in dead


def test_examples_and_bad_policy() -> None:
    layout = GridLayout([2, 4], ["tp", "dp"])
    two = plan_shrink(layout, 8, 0, [1, 4], "dp", "drop")
    assert two.shape == (2, 2) and two.order == (2, 3, 6, 7) and two.retired == (0, 5)
    same = plan_shrink(layout, 8, 0, [2, 3], "dp", "drop")
    assert same.shape == (2, 3) and same.retired == ()
    with pytest.raises(InvalidArgumentError, match="shuffle"):
        check_policy("shuffle")
