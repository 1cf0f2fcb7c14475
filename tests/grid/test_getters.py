"""Coordinates, neighbours, names, inferred sizes and node reports, against plain-loop references."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hypergrid import DimsError, GridLayout, GridSpecError, HyperCommGrid, RankError, WorldSizeError
from hypergrid.layout import resolve_shape
from tests.references import cart_shift, deepspeed_rank_repr, nodes_spanned
from tests.strategies import dims_of, grids, layout_of


@given(st.data())
def test_named_coordinates_round_trip(data: st.DataObject) -> None:
    case = data.draw(grids())
    layout = layout_of(case)
    rank = data.draw(st.integers(case.rank_offset, case.rank_offset + layout.size - 1))
    coord = layout.coord_of(rank)
    assert coord._fields == tuple(case.dim_names) and tuple(coord) == layout.coords_of(rank)
    assert layout.rank_at(**coord._asdict()) == rank
    grid = HyperCommGrid(case.shape, case.dim_names, case.rank_offset)
    assert grid.coord_of(rank) == coord and grid.rank_of(**coord._asdict()) == rank


@given(st.data())
def test_replace_changes_only_the_named_coordinates(data: st.DataObject) -> None:
    case = data.draw(grids())
    layout = layout_of(case)
    rank = data.draw(st.integers(case.rank_offset, case.rank_offset + layout.size - 1))
    name = data.draw(st.sampled_from(case.dim_names))
    value = data.draw(st.integers(0, layout.dim_size(name) - 1))
    moved = layout.coord_of(layout.replace(rank, **{name: value}))
    grid = HyperCommGrid(case.shape, case.dim_names, case.rank_offset)
    assert grid.rank_of(rank, **{name: value}) == layout.replace(rank, **{name: value})
    assert getattr(moved, name) == value
    assert all(getattr(moved, n) == getattr(layout.coord_of(rank), n) for n in case.dim_names if n != name)


@given(st.data())
def test_shift_equals_mpi_cart_shift_by_search(data: st.DataObject) -> None:
    case = data.draw(grids(max_ranks=64))
    layout = GridLayout(case.shape, case.dim_names)
    rank = data.draw(st.integers(0, layout.size - 1))
    dim = data.draw(st.integers(0, len(case.shape) - 1))
    disp = data.draw(st.integers(-3, 3))
    periodic = data.draw(st.booleans())
    assert layout.shift(case.dim_names[dim], rank, disp, periodic) == cart_shift(case.shape, rank, dim, disp, periodic)


@given(st.data())
def test_first_and_last_along_a_dim(data: st.DataObject) -> None:
    case = data.draw(grids())
    grid = HyperCommGrid(case.shape, case.dim_names, case.rank_offset)
    rank = data.draw(st.integers(case.rank_offset, case.rank_offset + grid.size - 1))
    name = data.draw(st.sampled_from(case.dim_names))
    position = getattr(grid.coord_of(rank), name)
    assert grid.is_first(name, rank=rank) == (position == 0)
    assert grid.is_last(name, rank=rank) == (position == grid.layout.dim_size(name) - 1)


@given(st.data())
def test_group_getters_agree_with_the_enumeration(data: st.DataObject) -> None:
    case = data.draw(grids())
    grid = HyperCommGrid(case.shape, case.dim_names, case.rank_offset)
    dims = data.draw(dims_of(case.dim_names))
    rank = data.draw(st.integers(case.rank_offset, case.rank_offset + grid.size - 1))
    group = next(g for g in grid.get_rank_enum(dims) if rank in g)
    assert grid.group_ranks(dims, rank) == group
    assert grid.group_rank(dims, rank) == group.index(rank)
    assert grid.src_rank(dims, rank) == group[0]
    assert grid.group_size(dims) == len(group)


@given(st.data())
def test_rank_repr_equals_deepspeed(data: st.DataObject) -> None:
    ndim = data.draw(st.integers(1, 4))
    axes = data.draw(st.permutations(["pipe", "data", "model", "expert"]))[:ndim]
    dims = [data.draw(st.integers(1, 3)) for _ in axes]
    layout = GridLayout(dims[::-1], axes[::-1])
    rank = data.draw(st.integers(0, layout.size - 1))
    omit = data.draw(st.lists(st.sampled_from(axes), unique=True))
    inner, outer = data.draw(st.sampled_from(["_", ""])), data.draw(st.sampled_from(["-", "/"]))
    assert layout.rank_repr(rank, omit, inner, outer) == deepspeed_rank_repr(axes, dims, rank, omit, inner, outer)


@given(st.data())
def test_node_report_counts_nodes_like_a_loop(data: st.DataObject) -> None:
    case = data.draw(grids(max_ranks=128))
    layout = layout_of(case)
    per_node = data.draw(st.integers(1, 9))
    for row in layout.node_report(per_node):
        spans = nodes_spanned(layout.rank_enum(row["key"]), per_node)
        assert (row["max_nodes"], row["min_nodes"], row["intra_node"]) == (max(spans), min(spans), max(spans) == 1)


@pytest.mark.parametrize(
    ("shape", "world", "offset", "expected"),
    [([2, -1, 4], 64, 0, [2, 8, 4]), ([-1], 7, 0, [7]), ([2, -1], 10, 2, [2, 4]), ([3, 2], None, 0, [3, 2])],
)
def test_one_size_is_inferred_from_the_world(shape: list[int], world: int, offset: int, expected: list[int]) -> None:
    assert resolve_shape(shape, world, offset) == expected


@pytest.mark.parametrize(
    ("shape", "world", "text"),
    [([2, -1, -1], 8, "at most one"), ([3, -1], 8, "multiple of the other sizes' product 3"), ([-1], None, "unknown")],
)
def test_bad_inference_is_refused(shape: list[int], world: Any, text: str) -> None:
    with pytest.raises(GridSpecError, match=text):
        resolve_shape(shape, world)


def test_grid_infers_from_world_size(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WORLD_SIZE", "24")
    grid = HyperCommGrid([2, 3, -1], ["tp", "cp", "dp"])
    assert grid.shape == [2, 3, 4]
    monkeypatch.delenv("WORLD_SIZE")
    with pytest.raises(GridSpecError, match="world size is unknown"):
        HyperCommGrid([2, -1], ["tp", "dp"])


LAYOUT = GridLayout([2, 4], ["tp", "pp"])


@pytest.mark.parametrize(
    ("call", "error", "text"),
    [
        (lambda: LAYOUT.rank_at(tp=0), RankError, "missing ['pp']"),
        (lambda: LAYOUT.rank_at(tp=0, pp=0, dp=0), RankError, "unknown ['dp']"),
        (lambda: LAYOUT.rank_at(tp=0, pp=4), RankError, "pp=4"),
        (lambda: LAYOUT.replace(1, xp=0), RankError, "['xp']"),
        (lambda: LAYOUT.shift("tp-pp", 0), DimsError, "'tp-pp'"),
        (lambda: LAYOUT.shift("xp", 0), DimsError, "'xp'"),
        (lambda: LAYOUT.shift("pp", 0, disp=1.5), RankError, "1.5"),
        (lambda: LAYOUT.rank_repr(0, omit=["dp"]), DimsError, "['dp']"),
        (lambda: LAYOUT.node_report(0), GridSpecError, "0"),
        (lambda: HyperCommGrid([2], ["dp"]).node_ranks(rank=0, ranks_per_node=-2), WorldSizeError, "-2"),
        (lambda: HyperCommGrid([2], ["dp"]).my_coord(), Exception, "init_process_group"),
    ],
)
def test_getter_errors_name_the_value(call: Any, error: type, text: str) -> None:
    with pytest.raises(error) as info:
        call()
    assert text in str(info.value)


def test_node_ranks_and_report_default_from_local_world_size(monkeypatch: pytest.MonkeyPatch) -> None:
    grid = HyperCommGrid([4, 2], ["tp", "dp"])
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    assert grid.node_ranks(rank=6) == [4, 5, 6, 7]
    assert [row["intra_node"] for row in grid.node_report()] == [True, False, False]
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "four")
    with pytest.raises(WorldSizeError, match="'four'"):
        grid.node_report()
