"""Properties of the pure layout core, over random grids and random dims requests."""

from __future__ import annotations

import itertools
import math

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from hypergrid.layout import GridLayout
from tests.references import megatron_rank_groups
from tests.strategies import GridCase, dims_of, grids, layout_of


@given(st.data())
def test_families_partition_the_grid(data: st.DataObject) -> None:
    case = data.draw(grids())
    layout = layout_of(case)
    dims = data.draw(dims_of(case.dim_names))
    enum = layout.rank_enum(dims)
    group_size = math.prod(case.shape[case.dim_names.index(d)] for d in dims)
    assert all(len(group) == group_size for group in enum)
    assert len(enum) == layout.size // group_size == layout.num_groups(dims)
    assert layout.group_size(dims) == group_size
    flat = [rank for group in enum for rank in group]
    assert sorted(flat) == list(range(case.rank_offset, case.rank_offset + layout.size))


@given(st.data())
def test_any_order_gives_the_same_enumeration_and_key(data: st.DataObject) -> None:
    case = data.draw(grids())
    layout = layout_of(case)
    dims = data.draw(dims_of(case.dim_names))
    other = data.draw(st.permutations(dims))
    assert layout.rank_enum(other) == layout.rank_enum(dims)
    assert layout.key(other) == layout.key(dims)
    assert layout.rank_enum(layout.key(dims)) == layout.rank_enum(dims)
    assert layout.rank_enum(tuple(other)) == layout.rank_enum(dims)


@given(st.data())
def test_key_lists_dims_outermost_first(data: st.DataObject) -> None:
    case = data.draw(grids())
    layout = layout_of(case)
    dims = data.draw(dims_of(case.dim_names))
    expected = sorted(dims, key=case.dim_names.index, reverse=True)
    assert layout.key(dims) == "-".join(expected)


@given(st.data())
def test_enumeration_equals_megatron_rank_generator(data: st.DataObject) -> None:
    case = data.draw(grids())
    layout = GridLayout(case.shape, case.dim_names)
    dims = data.draw(dims_of(case.dim_names))
    order = "-".join(case.dim_names)
    sizes = dict(zip(case.dim_names, case.shape))
    assert layout.rank_enum(dims) == megatron_rank_groups(order, sizes, "-".join(dims))


@given(st.data())
def test_coordinates_round_trip(data: st.DataObject) -> None:
    case = data.draw(grids())
    layout = layout_of(case)
    rank = data.draw(st.integers(case.rank_offset, case.rank_offset + layout.size - 1))
    coords = layout.coords_of(rank)
    assert all(0 <= c < s for c, s in zip(coords, case.shape))
    assert layout.rank_of(coords) == rank
    # The coordinates index the rank array (reversed shape, innermost last).
    assert layout.rank_array()[tuple(reversed(coords))] == rank


@given(st.data())
def test_vectorized_coordinates_agree_with_scalar(data: st.DataObject) -> None:
    case = data.draw(grids())
    layout = layout_of(case)
    ranks = data.draw(
        st.lists(st.integers(case.rank_offset, case.rank_offset + layout.size - 1), min_size=1, max_size=20)
    )
    coords = layout.coords_array(ranks)
    assert coords.tolist() == [list(layout.coords_of(r)) for r in ranks]
    assert layout.ranks_array(coords).tolist() == ranks


@given(st.data())
def test_own_group_is_the_family_member_holding_the_rank(data: st.DataObject) -> None:
    case = data.draw(grids())
    layout = layout_of(case)
    dims = data.draw(dims_of(case.dim_names))
    rank = data.draw(st.integers(case.rank_offset, case.rank_offset + layout.size - 1))
    enum = layout.rank_enum(dims)
    holding = [group for group in enum if rank in group]
    assert len(holding) == 1
    assert layout.group_ranks(dims, rank) == holding[0]
    assert enum[layout.group_index(dims, rank)] == holding[0]


@given(st.data())
def test_complementary_families_meet_in_exactly_one_rank(data: st.DataObject) -> None:
    case = data.draw(grids(max_ndim=4, max_ranks=128).filter(lambda c: len(c.dim_names) >= 2))
    layout = layout_of(case)
    dims = data.draw(dims_of(case.dim_names).filter(lambda d: len(d) < len(case.dim_names)))
    rest = [name for name in case.dim_names if name not in dims]
    for group, other in itertools.product(layout.rank_enum(dims), layout.rank_enum(rest)):
        assert len(set(group) & set(other)) == 1


@given(st.data())
def test_groups_are_ordered_innermost_remaining_dim_fastest(data: st.DataObject) -> None:
    case = data.draw(grids())
    layout = layout_of(case)
    dims = data.draw(dims_of(case.dim_names))
    enum = layout.rank_enum(dims)
    rest = [i for i, name in enumerate(case.dim_names) if name not in dims]
    # The coordinates of the other dims, read group by group, count in mixed radix.
    seen = [tuple(layout.coords_of(group[0])[i] for i in reversed(rest)) for group in enum]
    assert seen == list(itertools.product(*(range(case.shape[i]) for i in reversed(rest))))
    # Inside a group the requested dims count likewise, innermost fastest.
    chosen = [i for i, name in enumerate(case.dim_names) if name in dims]
    inside = [tuple(layout.coords_of(r)[i] for i in reversed(chosen)) for r in enum[0]]
    assert inside == list(itertools.product(*(range(case.shape[i]) for i in reversed(chosen))))


@given(grids())
def test_all_families_lists_every_combination_once(case: GridCase) -> None:
    layout = layout_of(case)
    families = layout.all_families()
    assert len(families) == 2 ** len(case.dim_names) - 1
    assert len({frozenset(f) for f in families}) == len(families)
    assert all(layout.key(f) == "-".join(f) for f in families)


def test_rank_enum_array_matches_list_and_dtype() -> None:
    layout = GridLayout([2, 3, 4], ["tp", "cp", "dp"], rank_offset=3)
    array = layout.rank_enum_array("dp-tp")
    assert array.dtype == np.int64 and array.shape == (3, 8)
    assert array.tolist() == layout.rank_enum(["tp", "dp"])


def test_own_group_at_a_million_ranks_needs_no_world_array() -> None:
    # 2**20 ranks: group_ranks works from coordinates alone; rank_array is never built.
    layout = GridLayout([8, 8, 16, 1024], ["tp", "cp", "ep", "dp"])
    rank = 777_777
    group = layout.group_ranks(["tp", "ep"], rank)
    coords = layout.coords_of(rank)
    assert len(group) == 128 and rank in group
    for member in group:
        other = layout.coords_of(member)
        assert other[1] == coords[1] and other[3] == coords[3]
