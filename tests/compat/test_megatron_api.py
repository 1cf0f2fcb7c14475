"""Megatron-Core main's HyperCommGrid API on hypergrid: views, registry keys, errors, private shims.

Expected values come from Megatron-Core's documented behaviour (its docstrings
and messages) and from plain-loop references below, not from hypergrid's code.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Sequence
from typing import Any

import pytest
import torch.distributed as dist
from hypothesis import assume, event, given
from hypothesis import strategies as st
from torch.testing._internal.distributed.fake_pg import FakeStore

from hypergrid import HyperCommGrid
from hypergrid.errors import (
    DimsError,
    GridSpecError,
    GridTooLargeError,
    GroupExistsError,
    GroupNotFoundError,
    HyperGridError,
    ViewNotFoundError,
    WorldSizeError,
)

NAMES = "abcdef"


# -- plain-loop references ----------------------------------------------------


def _rank(shape: Sequence[int], coords: Sequence[int], offset: int = 0) -> int:
    """dim 0 innermost: rank = offset + sum(coord_i * prod(shape[:i]))."""
    return offset + sum(c * math.prod(shape[:i]) for i, c in enumerate(coords))


def _group_sets(shape: Sequence[int], names: Sequence[str], dims: Sequence[str]) -> set[frozenset[int]]:
    """The family over ``dims`` as a set of rank sets: ranks that differ only in ``dims`` share a group."""
    groups: dict[tuple[int, ...], set[int]] = {}
    for coords in itertools.product(*(range(s) for s in shape)):
        rest = tuple(c for c, n in zip(coords, names) if n not in dims)
        groups.setdefault(rest, set()).add(_rank(shape, coords))
    return {frozenset(g) for g in groups.values()}


def _megatron_gen_rank_enum(shape: Sequence[int], names: Sequence[str], dims: Sequence[str]) -> list[list[int]]:
    """Megatron's documented _gen_rank_enum: groups over the other dims (outermost slowest), members with the
    LAST given dim fastest."""
    others = [i for i, n in enumerate(names) if n not in dims]
    chosen = [names.index(d) for d in dims]
    out = []
    for other in itertools.product(*(range(shape[i]) for i in reversed(others))):  # outermost first
        fixed = dict(zip(reversed(others), other))
        members = []
        for picked in itertools.product(*(range(shape[i]) for i in chosen)):  # first given slowest
            coords = {**fixed, **dict(zip(chosen, picked))}
            members.append(_rank(shape, [coords[i] for i in range(len(shape))]))
        out.append(members)
    return out


# -- offline: views and shims ---------------------------------------------------


def test_register_view_errors_use_megatrons_phrases_and_name_the_value() -> None:
    grid = HyperCommGrid([2, 2, 2], ["tp", "dp", "pp"])
    grid.register_view("expert", [2, 2, 2], ["expt_tp", "ep", "pp"], ["pp"])
    cases: list[tuple[tuple[Any, ...], str, str]] = [
        (("expert", [8], ["ep"]), "is already registered", "'expert'"),
        (("v", [2, 4], ["ep"]), r"len\(shape\).*!= len\(dim_names\)", "['ep']"),
        (("v", [2, 4], ["ep", "ep"]), "duplicate dim_names", "['ep', 'ep']"),
        (("v", [2, 2], ["ep", "x"]), "but the grid size is 8", "[2, 2]"),
        (("v", [8, 0], ["ep", "x"]), "shape must be positive ints", "[8, 0]"),
        (("v", [4, 2], ["ep", "pp"], ["pp", "pp"]), "duplicate shared_dims", "['pp', 'pp']"),
        (("v", [4, 2], ["ep", "cp"], ["cp"]), "is not in the base view", "'cp'"),
        (("v", [4, 2], ["ep", "x"], ["pp"]), "is not in the view's dim_names", "'pp'"),
        (("v", [2, 4], ["pp", "ep"], ["pp"]), "different membership across views", "'pp'"),
    ]
    for args, phrase, value in cases:
        with pytest.raises(GridSpecError, match=phrase) as error:
            grid.register_view(*args)
        assert isinstance(error.value, ValueError) and value in str(error.value)
    assert sorted(grid._views) == ["base", "expert"]  # nothing half-registered


def test_unknown_view_and_dim_outside_the_view() -> None:
    grid = HyperCommGrid([2, 2, 2], ["tp", "dp", "pp"])
    grid.register_view("expert", [2, 2, 2], ["expt_tp", "ep", "pp"], ["pp"])
    for call in (grid.get_rank_enum, grid.get_pg):
        with pytest.raises(ViewNotFoundError, match="View 'nope' is not registered") as error:
            call("ep", view="nope")
        assert isinstance(error.value, KeyError) and "'expert'" in str(error.value)
    with pytest.raises(DimsError, match="'ep' is not in view 'base'"):
        grid.get_rank_enum("ep")
    with pytest.raises(DimsError, match="'tp' is not in view 'expert'"):
        grid.get_rank_enum("tp", view="expert")


def test_view_metadata_is_a_copy() -> None:
    grid = HyperCommGrid([2, 2, 2], ["tp", "dp", "pp"])
    shape, names, shared = [4, 2], ["ep", "pp"], ["pp"]
    assert grid.register_view("expert", shape, names, shared) is None
    stored = grid._views["expert"]
    shape[0], names[0], shared.clear()
    assert (stored.name, stored.shape, stored.dim_names, stored.shared_dims) == ("expert", [4, 2], ["ep", "pp"], ["pp"])


def test_view_rejects_duplicate_shared_dims_and_infers_minus_one_from_the_grid() -> None:
    grid = HyperCommGrid([2, 2, 2], ["tp", "dp", "pp"])
    with pytest.raises(GridSpecError, match="duplicate shared_dims"):
        grid.view([4, 2], ["ep", "pp"], ["pp", "pp"])
    # A grid of 4 ranks at offset 4 in a world of 16: -1 fills the grid's 4 ranks, not the world's.
    part = HyperCommGrid([2, 2], ["tp", "pp"], rank_offset=4)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("WORLD_SIZE", "16")
        assert part.view([-1, 2], ["ep", "pp"]).shape == [2, 2]
    with pytest.raises(GridSpecError, match="-1"):
        grid.view([-1, 3], ["ep", "pp"])


def test_view_is_a_registered_view() -> None:
    grid = HyperCommGrid([2, 2, 2], ["tp", "dp", "pp"])
    expert = grid.view([4, 2], ["ep", "pp"], name="expert")
    assert grid._views["expert"].shared_dims == ["pp"] and expert.shared_dims == ("pp",)
    assert expert.get_rank_enum("ep") == grid.get_rank_enum("ep", view="expert")
    assert grid.view([4, 2], ["ep", "pp"], name="expert").dim_names == ["ep", "pp"]  # same view again: reused
    with pytest.raises(GridSpecError, match="is already registered"):
        grid.view([2, 4], ["ep", "pp"], [], name="expert")


def test_gen_rank_enum_reverses_the_given_dims() -> None:
    grid = HyperCommGrid([2, 2, 2], ["a", "b", "c"])
    assert grid._gen_rank_enum(["a", "b"]) == [[0, 2, 1, 3], [4, 6, 5, 7]]  # Megatron's docstring example
    assert grid._gen_rank_enum(["b", "a"]) == grid.get_rank_enum(["a", "b"])


@given(st.data())
def test_shims_match_megatrons_documented_semantics(data: st.DataObject) -> None:
    ndim = data.draw(st.integers(1, 4))
    shape = data.draw(st.lists(st.integers(1, 3), min_size=ndim, max_size=ndim))
    names = list(NAMES[:ndim])
    dims = data.draw(st.permutations(names).flatmap(lambda p: st.integers(1, ndim).map(lambda k: p[:k])))
    offset = data.draw(st.integers(0, 3))
    grid = HyperCommGrid(shape, names, rank_offset=offset)
    expected = [[r + offset for r in g] for g in _megatron_gen_rank_enum(shape, names, dims)]
    assert grid._gen_rank_enum(dims) == expected
    assert grid._gen_rank_enum_for(shape, names, dims) == expected
    ordered = sorted(dims, key=lambda d: -names.index(d))
    assert grid._order_dims(dims) == (ordered, "-".join(ordered))
    assert grid._order_dims_for(names, dims) == (ordered, "-".join(ordered))


def _refactor(data: st.DataObject, shape: list[int], names: list[str], shared: set[str]) -> tuple[list[int], list[str]]:
    """A view keeping the shared dims in place and re-factoring each run of other dims (shared groups unchanged)."""
    view_shape: list[int] = []
    view_names: list[str] = []
    run = 1
    fresh = iter(f"v{i}" for i in range(64))

    def flush() -> None:
        nonlocal run
        sizes = [run] if run == 1 else data.draw(st.sampled_from(_factorizations(run)))
        for size in sizes:
            view_shape.append(size)
            view_names.append(next(fresh))
        run = 1

    for size, name in zip(shape, names):
        if name in shared:
            flush()
            view_shape.append(size)
            view_names.append(name)
        else:
            run *= size
    flush()
    return view_shape, view_names


def _factorizations(n: int) -> list[list[int]]:
    if n == 1:
        return [[]]
    out = [[n]]
    for d in range(2, n):
        if n % d == 0:
            out += [[d, *rest] for rest in _factorizations(n // d)]
    return out


@given(st.data())
def test_shared_dim_groups_of_a_view_equal_the_base_grids(data: st.DataObject) -> None:
    ndim = data.draw(st.integers(1, 4))
    shape = data.draw(st.lists(st.integers(1, 4), min_size=ndim, max_size=ndim))
    names = list(NAMES[:ndim])
    shared = set(data.draw(st.lists(st.sampled_from(names), unique=True)))
    view_shape, view_names = _refactor(data, shape, names, shared)
    grid = HyperCommGrid(shape, names)
    grid.register_view("v", view_shape, view_names, sorted(shared))
    for k in range(1, len(shared) + 1):
        for combo in itertools.combinations(sorted(shared), k):
            assert {frozenset(g) for g in grid.get_rank_enum(combo, view="v")} == _group_sets(shape, names, combo)
            assert grid._core.family(list(combo), "v")[0] == grid.layout.key(list(combo))  # the base key: one group


@given(st.data())
def test_register_view_accepts_exactly_when_shared_groups_agree(data: st.DataObject) -> None:
    shape = data.draw(st.lists(st.integers(1, 3), min_size=1, max_size=3))
    names = list(NAMES[: len(shape)])
    size = math.prod(shape)
    view_shape = data.draw(st.sampled_from(_factorizations(size) or [[1]])) or [1]
    view_names = [f"w{i}" for i in range(len(view_shape))]
    shared = data.draw(st.lists(st.sampled_from(names), unique=True, max_size=len(view_names)))
    for name in shared:
        view_names[data.draw(st.integers(0, len(view_names) - 1))] = name
    assume(len(set(view_names)) == len(view_names) and set(shared) <= set(view_names))
    agree = all(
        _group_sets(shape, names, [d]) == _group_sets(view_shape, view_names, [d]) for d in shared
    ) and _group_sets(shape, names, shared) == _group_sets(view_shape, view_names, shared)
    grid = HyperCommGrid(shape, names)
    try:
        grid.register_view("v", view_shape, view_names, shared)
        accepted = True
    except GridSpecError as error:
        assert "different membership across views" in str(error)
        accepted = False
    event(f"accepted={accepted}")
    assert accepted == agree


def test_oversized_grid_is_a_runtime_error_too(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WORLD_SIZE", "8")
    with pytest.raises(RuntimeError, match=r"Grid shape \[4, 4\] is over sized") as error:
        HyperCommGrid([4, 4], ["tp", "dp"])
    assert isinstance(error.value, (GridTooLargeError, WorldSizeError, ValueError, HyperGridError))
    assert "world has 8 ranks" in str(error.value)


# -- a fake world of 8: creation, keys, lifecycle ----------------------------------


@pytest.fixture
def world8(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Any]]:
    """A one-process fake world of 8; yields the list of groups torch.distributed.destroy_process_group saw."""
    monkeypatch.setenv("WORLD_SIZE", "8")
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=8)
    destroyed: list[Any] = []
    real = dist.destroy_process_group

    def record(group: Any = None) -> None:
        if group is not None:
            destroyed.append(group)
        real(group)

    monkeypatch.setattr(dist, "destroy_process_group", record)
    try:
        yield destroyed
    finally:
        real()


def test_registry_keys_and_shared_groups(world8: list[Any]) -> None:
    grid = HyperCommGrid([2, 2, 2], ["tp", "dp", "pp"])
    grid.register_view("expert", [2, 2, 2], ["expt_tp", "ep", "pp"], shared_dims=["pp"])
    te = grid.create_pg(["expt_tp", "ep"], view="expert")
    pp = grid.create_pg("pp", view="expert")  # shared: the base grid's family
    assert list(grid._pgs) == [("expert", ("ep", "expt_tp")), "pp"]
    assert grid.get_pg("pp") is pp and grid.pg("pp") is pp and grid.get_pg("pp", view="expert") is pp
    assert grid.get_pg(["ep", "expt_tp"], view="expert") is te
    assert dist.get_process_group_ranks(te) == [0, 1, 2, 3] and dist.get_process_group_ranks(pp) == [0, 4]
    with pytest.raises(GroupExistsError, match="for view 'expert' has already been created") as exists:
        grid.create_pg(["ep", "expt_tp"], view="expert")
    with pytest.raises(GroupExistsError, match=r"Process group .*has already been created"):
        grid.create_pg("pp")
    with pytest.raises(GroupNotFoundError, match="Process group for 'tp' hasn't been created") as missing:
        grid.get_pg("tp")
    with pytest.raises(GroupNotFoundError, match="for view 'expert' hasn't been created"):
        grid.get_pg("ep", view="expert")
    assert isinstance(exists.value, KeyError) and isinstance(missing.value, KeyError)
    grid.destroy()
    assert sorted(map(id, world8)) == sorted([id(te), id(pp)]) and grid._pgs == {}


def test_view_grid_shares_the_root_registry(world8: list[Any]) -> None:
    dense = HyperCommGrid([2, 2, 2], ["tp", "dp", "pp"])
    expert = dense.view([4, 2], ["ep", "pp"], name="expert")
    ep, pp = expert.pg("ep"), expert.pg("pp")
    assert dense._pgs is expert._pgs and dense.get_pg("pp") is pp and dense.get_pg("ep", view="expert") is ep
    assert expert.created_keys == ["ep", "pp"] and dense.created_keys == [("expert", ("ep",)), "pp"]
    expert.destroy()  # the view's own families only: pp belongs to the dense grid
    assert world8 == [ep] and dense.get_pg("pp") is pp
    dense.destroy()
    assert world8 == [ep, pp]


def test_pgs_is_the_registry_and_non_members_are_never_groups(world8: list[Any]) -> None:
    grid = HyperCommGrid([2, 4], ["tp", "dp"])
    member = grid.create_pg("tp")
    grid._pgs = {"tp": member, "dp": dist.GroupMember.NON_GROUP_MEMBER}
    assert grid.get_pg("dp") is None and grid.pg("dp") is None and grid.get_pg("tp") is member
    grid._pgs["dp-tp"] = member  # the same object under two keys
    grid.destroy()
    assert world8 == [member] and grid._pgs == {}


def test_destroy_releases_a_pgs_assigned_from_outside_without_a_world(monkeypatch: pytest.MonkeyPatch) -> None:
    # Megatron's code and tests assign _pgs directly and expect destroy() to release what is there,
    # skipping None and NON_GROUP_MEMBER, even where torch.distributed was never initialized.
    assert not dist.is_initialized()
    destroyed: list[Any] = []
    monkeypatch.setattr(dist, "destroy_process_group", lambda group=None: destroyed.append(group))
    grid = HyperCommGrid([2, 4], ["tp", "dp"])
    tp, dp = object(), object()
    grid._pgs = {"tp": tp, "dp": dp, "dp-tp": tp, "none": None, "marker": dist.GroupMember.NON_GROUP_MEMBER}
    grid.destroy()
    assert destroyed == [tp, dp] and grid._pgs == {}


def test_destroy_releases_a_pgs_assigned_from_outside_in_a_world(world8: list[Any]) -> None:
    grid = HyperCommGrid([2, 4], ["tp", "dp"])
    created = grid.create_pg("tp")
    outside = dist.new_group([0, 1])
    grid._pgs = {"tp": created, "dp": outside, "marker": dist.GroupMember.NON_GROUP_MEMBER}
    grid.destroy()
    assert world8 == [created, outside] and grid._pgs == {}
