"""Hypothesis strategies: random grids and random dims requests over them."""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import strategies as st

from hypergrid.layout import GridLayout

NAME_POOL = ["tp", "cp", "ep", "dp", "pp", "etp", "edp", "x", "y", "z"]


@dataclass(frozen=True)
class GridCase:
    shape: list[int]
    dim_names: list[str]
    rank_offset: int


@st.composite
def grids(draw: st.DrawFn, max_ndim: int = 5, max_size: int = 4, max_ranks: int = 512) -> GridCase:
    """A grid of 1..max_ndim dims (sizes 1..max_size, at most max_ranks ranks), random names."""
    ndim = draw(st.integers(1, max_ndim))
    shape = [draw(st.integers(1, max_size)) for _ in range(ndim)]
    total = 1
    for position, size in enumerate(shape):
        if total * size > max_ranks:
            shape[position] = 1
        total *= shape[position]
    names = draw(st.permutations(NAME_POOL))[:ndim]
    offset = draw(st.integers(0, 7))
    return GridCase(shape, list(names), offset)


@st.composite
def dims_of(draw: st.DrawFn, names: list[str]) -> list[str]:
    """A non-empty subset of ``names`` in random order."""
    chosen = draw(st.lists(st.sampled_from(names), min_size=1, max_size=len(names), unique=True))
    return list(draw(st.permutations(chosen)))


def layout_of(case: GridCase) -> GridLayout:
    """The layout a drawn case describes."""
    return GridLayout(case.shape, case.dim_names, case.rank_offset)
