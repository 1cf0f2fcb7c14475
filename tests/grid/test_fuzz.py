"""Hostile input, fuzzed: every entry point works or raises a documented hypergrid error naming the value.

Never an IndexError / TypeError / ValueError from numpy or torch, never a half-built grid.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from hypergrid import GridLayout, HyperCommGrid, HyperGridError, NotInitializedError
from hypergrid.layout import MAX_WORLD_SIZE
from tests.strategies import NAME_POOL

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=6),
    st.binary(max_size=4),
    st.sampled_from([*NAME_POOL, "", "-", "a-b", "for", "_x", "dp-tp", "tp,dp"]),
    st.builds(np.int64, st.integers(-5, 5)),
    st.builds(np.float32, st.floats(-5, 5)),
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=5), st.tuples(inner, inner), st.dictionaries(st.text(max_size=3), inner, max_size=2)
    ),
    max_leaves=8,
)
small_shapes = st.lists(st.integers(-1, 5), min_size=0, max_size=5)
names = st.lists(st.sampled_from([*NAME_POOL, "", "tp", "a-b"]), min_size=0, max_size=5)


def _flatten(value: Any) -> Iterator[Any]:
    yield value
    if isinstance(value, (list, tuple)):
        for item in value:
            yield from _flatten(item)
    elif isinstance(value, dict):
        for item in value.values():
            yield from _flatten(item)


def _names_a_value(message: str, *arguments: Any) -> bool:
    """The message quotes one of the arguments, or one of their parts, or says which is empty."""
    if "empty" in message:
        return True
    for argument in arguments:
        for part in _flatten(argument):
            if repr(part) in message or (str(part) and str(part) in message):
                return True
            if isinstance(part, np.generic) and repr(part.item()) in message:
                return True
    return False


def _checked(call: Any, *arguments: Any) -> Any:
    try:
        return call()
    except NotInitializedError as error:  # about the process, not the value: it says what to call first
        assert "init_process_group" in str(error)
        return error
    except HyperGridError as error:
        assert _names_a_value(str(error), *arguments), f"{type(error).__name__}: {error} names none of {arguments}"
        return error


@given(st.one_of(values, small_shapes), st.one_of(values, names), values)
def test_layout_constructor(shape: Any, dim_names: Any, offset: Any) -> None:
    layout = _checked(lambda: GridLayout(shape, dim_names, offset), shape, dim_names, offset)
    if isinstance(layout, GridLayout):  # a whole, consistent grid or nothing
        assert layout.size == math.prod(layout.shape) and layout.rank_offset + layout.size <= MAX_WORLD_SIZE
        assert len(layout.dim_names) == len(layout.shape) == len(layout.strides)


@given(st.one_of(values, small_shapes), st.one_of(values, names), values, values)
def test_grid_constructor(shape: Any, dim_names: Any, offset: Any, backend: Any) -> None:
    grid = _checked(lambda: HyperCommGrid(shape, dim_names, offset, backend), shape, dim_names, offset, backend)
    if isinstance(grid, HyperCommGrid):
        assert grid.created_keys == [] and grid.size == math.prod(grid.shape)


@given(st.lists(st.integers(1, 64), min_size=1, max_size=6))
def test_huge_grids_are_refused_not_allocated(factors: list[int]) -> None:
    shape = [*factors, 2**40]  # at least 2**40 ranks, often past int64
    with pytest.raises(HyperGridError, match="2\\*\\*31-1"):
        GridLayout(shape, [f"d{i}" for i in range(len(shape))])


LAYOUT = GridLayout([2, 3, 2], ["tp", "cp", "dp"], rank_offset=2)
GRID = HyperCommGrid([2, 3, 2], ["tp", "cp", "dp"], rank_offset=2)
DIMS_CALLS = ["rank_enum", "rank_enum_array", "key", "canonical_dims", "group_size", "num_groups", "dim_indices"]


@given(st.one_of(values, names), st.sampled_from(DIMS_CALLS))
def test_layout_dims_entry_points(dims: Any, call: str) -> None:
    _checked(lambda: getattr(LAYOUT, call)(dims), dims)


@given(st.one_of(values, names), values)
def test_layout_rank_entry_points(dims: Any, rank: Any) -> None:
    for call in ("group_ranks", "group_index"):
        _checked(lambda c=call: getattr(LAYOUT, c)(dims, rank), dims, rank)
    _checked(lambda: LAYOUT.coords_of(rank), rank)
    _checked(lambda: LAYOUT.rank_of(rank), rank)
    _checked(lambda: LAYOUT.dim_size(rank), rank)
    assert LAYOUT.contains(rank) in (True, False)


@given(values)
def test_vectorized_entry_points(data: Any) -> None:
    _checked(lambda: LAYOUT.coords_array(data), data)
    _checked(lambda: LAYOUT.ranks_array(data), data)


@given(st.one_of(values, names))
def test_grid_offline_entry_points(dims: Any) -> None:
    _checked(lambda: GRID.get_rank_enum(dims), dims)
    _checked(lambda: GRID.get_pg(dims), dims)
    _checked(lambda: GRID.create_pg(dims), dims)  # not initialized: a clear error, whatever dims are


@pytest.mark.usefixtures("one_rank_world_module")
@given(
    st.one_of(values, names, st.sampled_from(["tp", "dp-tp", ["dp", "tp"]])),
    st.dictionaries(
        st.sampled_from(["timeout", "pg_options", "group_desc", "backend", "ranks", "strategy"]), values, max_size=2
    ),
)
def test_create_pg_in_a_live_world(dims: Any, kwargs: Any) -> None:
    grid = HyperCommGrid([1, 1], ["tp", "dp"])
    try:
        outcome = _checked(lambda: grid.create_pg(dims, **kwargs), dims, kwargs, list(kwargs))
    except (TypeError, ValueError, AttributeError, RuntimeError) as error:
        # pg_options is backend-specific (ProcessGroupNCCL.Options, ...): torch alone validates it.
        assert "pg_options" in kwargs, f"{type(error).__name__}: {error}"
        outcome = error
    if not isinstance(outcome, BaseException):
        assert grid.get_pg(dims) is outcome and len(grid.created_keys) == 1
    grid.destroy()


@given(values, values, values, st.one_of(values, st.sampled_from(["tp", "cp", "dp"])))
def test_getter_entry_points(rank: Any, first: Any, second: Any, dim: Any) -> None:
    _checked(lambda: LAYOUT.coord_of(rank), rank)
    _checked(lambda: LAYOUT.rank_at(tp=first, cp=second, dp=rank), first, second, rank)
    _checked(lambda: LAYOUT.replace(rank, **({dim: first} if isinstance(dim, str) else {})), rank, first, dim)
    _checked(lambda: LAYOUT.shift(dim, rank, first, bool(second)), dim, rank, first)
    _checked(lambda: LAYOUT.rank_repr(rank, omit=first if isinstance(first, (list, tuple)) else ()), rank, first)
    _checked(lambda: LAYOUT.node_report(first), first)
    if rank is not None:  # None means "the caller": covered with a live world in test_getters
        _checked(lambda: GRID.group_rank(dim, rank), dim, rank)
        _checked(lambda: GRID.src_rank(dim, rank), dim, rank)
    _checked(lambda: GRID.view(first, second), first, second)
