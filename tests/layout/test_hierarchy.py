"""Hierarchical families offline: the within/across halves against a reference written from the definition.

Reference: a node is ``rank // ranks_per_node``; the *within* groups of a family
are each group intersected with each node; the *across* groups gather, from
each group, the members holding the same position (ascending) in their node's
part. Megatron's hierarchical groups cut a group's sorted ranks the same way.
"""

from __future__ import annotations

import math
from itertools import product

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hypergrid import HyperCommGrid
from hypergrid.binding.registry import scoped
from hypergrid.errors import InvalidArgumentError, UnexpectedArgumentError, WorldSizeError
from hypergrid.layout import GridLayout
from hypergrid.layout.hierarchy import hierarchical_family, node_size, node_split, resolve_scope
from tests.references import node_halves


def ref_rank_enum(shape: list[int], names: list[str], dims: list[str], offset: int) -> list[list[int]]:
    """Groups by brute force: ranks (innermost dim fastest) that share every coordinate outside ``dims``."""
    by_rest: dict[tuple[int, ...], list[int]] = {}
    for rank, coords in enumerate(product(*(range(n) for n in reversed(shape)))):
        named = dict(zip(reversed(names), coords))
        rest = tuple(named[name] for name in names if name not in dims)
        by_rest.setdefault(rest, []).append(offset + rank)
    return list(by_rest.values())


def reference(groups: list[list[int]], per_node: int) -> tuple[set[frozenset[int]], set[frozenset[int]]] | None:
    """(within, across) as sets of rank sets; None where some node parts differ in size (an uneven cut)."""
    within: set[frozenset[int]] = set()
    across: set[frozenset[int]] = set()
    sizes = set()
    for group in groups:
        inner, outer = node_halves(group, per_node)
        sizes.update(len(part) for part in inner)
        within.update(frozenset(part) for part in inner)
        across.update(frozenset(part) for part in outer)
    return (within, across) if len(sizes) == 1 else None


def _as_sets(enum: list[list[int]]) -> set[frozenset[int]]:
    return {frozenset(group) for group in enum}


@st.composite
def grids(draw: st.DrawFn) -> tuple[list[int], int, int]:
    ndim = draw(st.integers(1, 4))
    shape = draw(st.lists(st.integers(1, 4), min_size=ndim, max_size=ndim))
    per_node = draw(st.sampled_from([1, 2, 3, 4, 6, 8, 16]))
    nodes_before = draw(st.integers(0, 2))
    return shape, per_node, nodes_before * per_node


@settings(max_examples=300, deadline=None)
@given(grids())
def test_halves_match_the_reference_or_the_cut_is_uneven(case: tuple[list[int], int, int]) -> None:
    shape, per_node, offset = case
    names = [f"d{i}" for i in range(len(shape))]
    layout = GridLayout(shape, names, offset)
    families = [list(c) for r in range(1, len(names) + 1) for c in _combinations(names, r)]
    expected = {tuple(dims): reference(ref_rank_enum(shape, names, dims, offset), per_node) for dims in families}
    try:
        node_split(layout, per_node)
    except InvalidArgumentError as error:
        assert "unevenly" in str(error)
        assert any(value is None for value in expected.values()), (shape, per_node)
        return
    for dims in families:
        ref = expected[tuple(dims)]
        assert ref is not None, (shape, per_node, dims)
        for scope, want in zip(("within", "across"), ref):
            fine, fine_dims = hierarchical_family(layout, dims, scope, per_node)
            got = fine.rank_enum(fine_dims)
            assert _as_sets(got) == want, (shape, per_node, dims, scope)
            assert sorted(r for g in got for r in g) == list(range(offset, offset + math.prod(shape)))


def _combinations(names: list[str], r: int) -> list[tuple[str, ...]]:
    return [c for c in product(names, repeat=r) if list(c) == sorted(set(c), key=names.index) and len(set(c)) == r]


def test_hand_computed_halves() -> None:
    # tp=2, cp=2, dp=2 on nodes of 4: a node is a tp x cp block; dp crosses nodes.
    layout = GridLayout([2, 2, 2], ["tp", "cp", "dp"])
    within = hierarchical_family(layout, "dp-tp", "within", 4)
    across = hierarchical_family(layout, "dp-tp", "across", 4)
    assert within[0].rank_enum(within[1]) == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert across[0].rank_enum(across[1]) == [[0, 4], [1, 5], [2, 6], [3, 7]]
    # dp on nodes of 2 (dp split in two inside each node of the [1, 8] grid)
    flat = GridLayout([1, 8], ["tp", "dp"])
    fine, dims = hierarchical_family(flat, "dp", "across", 2)
    assert fine.rank_enum(dims) == [[0, 2, 4, 6], [1, 3, 5, 7]]


@pytest.mark.parametrize(
    ("shape", "per_node", "offset", "fragment"),
    [
        ([6, 4], 8, 0, "steps of 'd1'"),
        ([3], 2, 0, "unevenly"),
        ([8], 8, 4, "starts at rank 4, inside a node of 8 ranks"),
        ([2, 2], 0, 0, "ranks_per_node=0: expected an int in 1..2147483647"),
        ([2, 2], True, 0, "ranks_per_node=True: expected an int"),
    ],
)
def test_uneven_cuts_are_refused(shape: list[int], per_node: int, offset: int, fragment: str) -> None:
    layout = GridLayout(shape, [f"d{i}" for i in range(len(shape))], offset)
    with pytest.raises(InvalidArgumentError, match=fragment.replace("(", r"\(")):
        node_split(layout, per_node)


def test_a_grid_inside_one_node_is_one_block_even_at_an_offset() -> None:
    layout = GridLayout([2, 2], ["tp", "dp"], 4)
    fine, dims = hierarchical_family(layout, "dp", "within", 8)
    assert fine.rank_enum(dims) == [[4, 6], [5, 7]]
    fine, dims = hierarchical_family(layout, "dp", "across", 8)
    assert fine.rank_enum(dims) == [[4], [5], [6], [7]]


def test_split_names_never_clash_with_the_grid_s() -> None:
    layout = GridLayout([2, 4, 1], ["tp", "dp", "dp_intra"])
    split = node_split(layout, 4)
    assert len(set(split.layout.dim_names)) == split.layout.ndim
    assert split.inner["dp"] != ("dp_intra",) and split.inner["dp_intra"] == ()


@pytest.mark.parametrize(
    ("within", "across", "error", "fragment"),
    [
        ("node", "node", InvalidArgumentError, "not both"),
        ("rack", None, InvalidArgumentError, "within='rack': expected 'node' (a level's name) or None"),
        (None, 4, InvalidArgumentError, "across=4: expected 'node' (a level's name) or None"),
    ],
)
def test_bad_scopes(within: object, across: object, error: type[Exception], fragment: str) -> None:
    with pytest.raises(error) as raised:
        resolve_scope(within, across)
    assert fragment in str(raised.value)


def test_node_size_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    assert node_size(None) == 4 and node_size(2) == 2
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "four")
    with pytest.raises(WorldSizeError, match="'four' is not an int"):
        node_size(None)
    monkeypatch.delenv("LOCAL_WORLD_SIZE")
    with pytest.raises(WorldSizeError, match="LOCAL_WORLD_SIZE is not set"):
        node_size(None)


def test_keys_of_halves() -> None:
    assert scoped("dp-tp", "within") == "dp-tp|within=node"
    assert scoped(("expert", ("edp", "ep")), "across") == ("expert", ("edp", "ep|across=node"))


def test_lookups_before_creation_name_the_half() -> None:
    grid = HyperCommGrid([2, 2], ["tp", "dp"])
    with pytest.raises(KeyError, match=r"create_pg\(\.\.\., within='node'\)"):
        grid.get_pg("dp", within="node")
    with pytest.raises(InvalidArgumentError, match="not both"):
        grid.get_pg("dp", within="node", across="node")


def test_ranks_per_node_needs_a_half() -> None:
    grid = HyperCommGrid([2, 2], ["tp", "dp"])
    with pytest.raises(UnexpectedArgumentError, match="ranks_per_node=4 without within= or across="):
        grid.create_pg("dp", ranks_per_node=4)
