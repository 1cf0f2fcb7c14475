"""Mesh planning over a grid and another factorization of its ranks (a view): properties against brute force.

References here enumerate ranks one by one from each layout's documented order (dim 0 innermost, stride =
product of the sizes inside it); nothing is read back from the planner.
"""

from __future__ import annotations

import math
from itertools import product

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from hypergrid.errors import DimsError
from hypergrid.layout import GridLayout
from hypergrid.layout.meshspec import MeshPlan, family_of_axis
from tests.layout.test_economy import layout_pairs
from tests.ops.test_toolkit_offline import _coords  # coordinates by repeated division, from shape and names


def _family_group(layout: GridLayout, dims: tuple[str, ...], rank: int) -> set[int]:
    """Ranks of ``layout`` that agree with ``rank`` on every dim outside ``dims``."""
    mine = _coords(layout, rank)
    ranks = range(layout.rank_offset, layout.rank_offset + layout.size)
    return {r for r in ranks if all(_coords(layout, r)[n] == mine[n] for n in layout.dim_names if n not in dims)}


@st.composite
def mixed_requests(draw: st.DrawFn) -> tuple[GridLayout, GridLayout, list[tuple[str, ...]]]:
    grid, view = draw(layout_pairs())
    elements: list[tuple[str, ...]] = []
    for _ in range(draw(st.integers(1, 3))):
        layout = draw(st.sampled_from([grid, view]))
        chosen = draw(st.lists(st.sampled_from(list(layout.dim_names)), min_size=1, unique=True))
        elements.append(layout.canonical_dims(chosen))
    return grid, view, elements


@given(mixed_requests())
def test_a_mesh_over_two_factorizations_tiles_the_ranks(request: tuple[GridLayout, GridLayout, list]) -> None:
    grid, view, elements = request
    names = [name for element in elements for name in element]
    assume(len(set(names)) == len(names))
    try:
        plan = MeshPlan(grid, list(elements), [("view", view)])
    except DimsError as error:
        assert "overlap" in str(error)
        # Refused: the meshes built from each rank's position would not tile the ranks.
        atoms = [(size, stride) for layout, element in _homes(grid, view, elements) for size, stride in element]
        offsets = [sum(i * s for i, (_, s) in zip(index, atoms)) for index in product(*(range(n) for n, _ in atoms))]
        corners = [r for r in range(grid.size) if all((r // s) % n == 0 for n, s in atoms)]
        tiles = sorted(c + o for c in corners for o in offsets)
        assert tiles != list(range(grid.size))
        return
    seen: dict[int, tuple[int, ...]] = {}
    for rank in range(grid.rank_offset, grid.rank_offset + grid.size):
        mesh = plan.ranks(rank)
        flat = [int(r) for r in mesh.reshape(-1)]
        assert rank in flat and len(set(flat)) == len(flat) == math.prod(plan.shape)
        key = tuple(sorted(flat))
        for other in flat:
            assert seen.setdefault(other, key) == key  # every rank of a mesh has that same mesh
        # Along each mesh dim: the family of its dims in its own factorization.
        position = tuple(int(i[0]) for i in (mesh == rank).nonzero())
        for axis, (space, element) in enumerate(zip(plan.spaces, plan.members)):
            layout = grid if space == "base" else view
            line = [int(r) for r in mesh[(*position[:axis], slice(None), *position[axis + 1 :])]]
            assert set(line) == _family_group(layout, element, rank)
            assert line == sorted(line)  # outermost first inside a combined dim: ascending, as torch orders
    assert set(seen) == set(range(grid.rank_offset, grid.rank_offset + grid.size))


def _homes(grid: GridLayout, view: GridLayout, elements: list[tuple[str, ...]]) -> list[tuple[GridLayout, list]]:
    out = []
    for element in elements:
        layout = grid if element[0] in grid.dim_names else view
        out.append((layout, [(layout.dim_size(n), layout.strides[layout.dim_indices(n)[0]]) for n in element]))
    return out


@given(layout_pairs(), st.data())
def test_family_of_axis_finds_a_family_with_the_same_groups(layouts: tuple[GridLayout, GridLayout], data) -> None:
    grid, view = layouts
    layout = data.draw(st.sampled_from([grid, view]))
    dims = layout.canonical_dims(data.draw(st.lists(st.sampled_from(list(layout.dim_names)), min_size=1, unique=True)))
    axis = tuple((layout.dim_size(n), layout.strides[layout.dim_indices(n)[0]]) for n in dims)
    found = family_of_axis([("base", grid), ("view", view)], axis)
    assert found is not None  # the family itself qualifies
    space, family = found
    home = grid if space == "base" else view
    for rank in range(grid.rank_offset, grid.rank_offset + grid.size):
        assert _family_group(home, family, rank) == _family_group(layout, dims, rank)


def test_named_dims_and_their_errors() -> None:
    grid = GridLayout([2, 2, 2], ["tp", "dp_shard", "dp_replicate"])
    expert = GridLayout([4, 2], ["ep", "dp_replicate"])
    plan = MeshPlan(grid, {"batch": ("dp_replicate", "dp_shard"), "tp": "tp"}, [("expert", expert)])
    assert (plan.names, plan.members, plan.spaces) == (
        ("batch", "tp"),
        (("dp_replicate", "dp_shard"), ("tp",)),
        ("base", "base"),
    )
    assert plan.ranks(5).tolist() == [[0, 1], [2, 3], [4, 5], [6, 7]]  # batch = 2 dp_replicate + dp_shard
    sparse = MeshPlan(grid, ["dp_replicate", "ep"], [("expert", expert)])
    assert sparse.spaces == ("base", "expert") and sparse.ranks(6).tolist() == [[0, 1, 2, 3], [4, 5, 6, 7]]
    with pytest.raises(DimsError, match="mixes dims of different factorizations"):
        MeshPlan(grid, [("dp_shard", "ep")], [("expert", expert)])
    with pytest.raises(DimsError, match="overlap"):
        MeshPlan(grid, ["tp", "ep"], [("expert", expert)])
    with pytest.raises(DimsError, match="non-empty str"):
        MeshPlan(grid, {"": "tp"})
    with pytest.raises(DimsError, match=r"unknown dim 'pp'.*expert"):
        MeshPlan(grid, {"x": ("dp_shard", "pp")}, [("expert", expert)])
