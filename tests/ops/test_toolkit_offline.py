"""The toolkit without other ranks: mesh plans, ring neighbours, argument errors, MPU roles."""

from __future__ import annotations

import itertools
import math
from typing import Any

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from hypergrid import DimsError, HyperCommGrid, InvalidArgumentError, NotInitializedError, RankError
from hypergrid.autograd import copy_to, gather_from, reduce_scatter_to, scatter_to
from hypergrid.compat.mpu import MPU
from hypergrid.layout import GridLayout
from hypergrid.layout.meshspec import MeshPlan
from tests.grid import test_fuzz as fuzz
from tests.strategies import GridCase, grids, layout_of


def _coords(case: GridCase, rank: int) -> dict[str, int]:
    """Coordinates by repeated division, innermost dim first (the documented convention)."""
    local, out = rank - case.rank_offset, {}
    for name, size in zip(case.dim_names, case.shape):
        out[name] = local % size
        local //= size
    return out


@given(st.data())
def test_mesh_plan_ranks_follow_the_documented_order(data: st.DataObject) -> None:
    case = data.draw(grids(max_ndim=4))
    layout = layout_of(case)
    chosen = data.draw(st.lists(st.sampled_from(case.dim_names), min_size=1, unique=True))
    # Split the chosen dims into mesh dims; a combined one names its dims outermost first.
    cuts = sorted(data.draw(st.sets(st.integers(1, len(chosen) - 1))) if len(chosen) > 1 else set())
    parts = [chosen[a:b] for a, b in zip([0, *cuts], [*cuts, len(chosen)])]
    order = {name: i for i, name in enumerate(case.dim_names)}
    elements = [tuple(sorted(part, key=order.__getitem__, reverse=True)) for part in parts]
    dims = [element[0] if len(element) == 1 and data.draw(st.booleans()) else element for element in elements]
    plan = MeshPlan(layout, dims)
    assert plan.names == tuple("_".join(element) for element in elements)
    rank = data.draw(st.integers(case.rank_offset, case.rank_offset + layout.size - 1))
    mine = _coords(case, rank)
    sizes = [[case.shape[order[name]] for name in element] for element in elements]
    assert plan.shape == tuple(math.prod(s) for s in sizes)
    expected = {}
    for other in range(case.rank_offset, case.rank_offset + layout.size):
        theirs = _coords(case, other)
        if all(theirs[name] == mine[name] for name in case.dim_names if name not in chosen):
            index = []
            for element, element_sizes in zip(elements, sizes):
                value = 0
                for name, size in zip(element, element_sizes):  # first-named outermost
                    value = value * size + theirs[name]
                index.append(value)
            expected[tuple(index)] = other
    ranks = plan.ranks(rank)
    assert {index: int(ranks[index]) for index in itertools.product(*map(range, plan.shape))} == expected


@pytest.mark.parametrize(
    ("dims", "match"),
    [
        ([("tp", "pp")], r"outermost first, \('pp', 'tp'\)"),
        (["dp", ("dp", "pp")], r"repeat \['dp'\]"),
        (["ep"], "unknown dim 'ep'"),
        ([()], "non-empty tuple"),
        ([3], "must be a dim name"),
        ([], "at least one dim"),
        (7, "key like 'dp-tp'"),
    ],
)
def test_mesh_plan_refuses_bad_dims(dims: object, match: str) -> None:
    with pytest.raises(DimsError, match=match):
        MeshPlan(GridLayout([2, 2, 2], ["tp", "pp", "dp"]), dims)  # type: ignore[arg-type]


def test_mesh_plan_refuses_two_mesh_dims_with_one_name() -> None:
    with pytest.raises(DimsError, match="same name"):
        MeshPlan(GridLayout([2, 2, 2], ["tp", "pp", "pp_tp"]), ["pp_tp", ("pp", "tp")])


@given(grids(max_ndim=4), st.data())
def test_prev_and_next_are_ring_neighbours(case: GridCase, data: st.DataObject) -> None:
    grid = HyperCommGrid(case.shape, case.dim_names, case.rank_offset)
    dim = data.draw(st.sampled_from(case.dim_names))
    rank = data.draw(st.integers(case.rank_offset, case.rank_offset + grid.size - 1))
    mine, size = _coords(case, rank), case.shape[case.dim_names.index(dim)]

    def at(step: int) -> int:
        coords = {**mine, dim: (mine[dim] + step) % size}
        stride = math.prod(case.shape[: case.dim_names.index(dim)])
        return rank + (coords[dim] - mine[dim]) * stride

    assert (grid.prev_rank(dim, rank=rank), grid.next_rank(dim, rank=rank)) == (at(-1), at(1))
    assert grid.shift(dim, periodic=True, rank=rank) == (at(-1), at(1))


def test_ring_neighbour_errors() -> None:
    grid = HyperCommGrid([2, 4], ["tp", "pp"], rank_offset=2)
    with pytest.raises(DimsError, match="one dim"):
        grid.next_rank("pp-tp", rank=2)
    with pytest.raises(RankError, match="rank 1 is outside"):
        grid.prev_rank("pp", rank=1)


def test_collectives_need_an_initialized_world() -> None:
    with pytest.raises(NotInitializedError):
        HyperCommGrid([2], ["tp"]).all_reduce(torch.zeros(1), "tp")


@pytest.mark.usefixtures("one_rank_world")
def test_collective_argument_errors() -> None:
    grid = HyperCommGrid([1, 1], ["tp", "pp"])
    cases = [
        (lambda: grid.all_reduce([1.0], "tp"), InvalidArgumentError, r"tensor=\[1.0\]: expected a torch.Tensor"),  # type: ignore[arg-type]
        (lambda: grid.all_gather(torch.tensor(1.0), "tp"), InvalidArgumentError, "at least one dim"),
        (lambda: grid.all_gather(torch.zeros(2), "tp", dim=True), InvalidArgumentError, "dim=True"),  # type: ignore[arg-type]
        (lambda: grid.reduce_scatter(torch.zeros(2, 2), "tp", dim=-3), InvalidArgumentError, "dim=-3"),
        (lambda: grid.broadcast(torch.zeros(1), "tp", group_src=-1), InvalidArgumentError, "group_src=-1"),
        (lambda: grid.broadcast(torch.zeros(1), "tp", group_src=True), InvalidArgumentError, "group_src=True"),
        (lambda: grid.barrier("tp-tp"), DimsError, "repeat"),
        (lambda: grid.p2p_ops("pp", send_next=torch.zeros(1)), InvalidArgumentError, "size 1"),
        (lambda: grid.p2p_ops("pp", recv_prev="buffer"), InvalidArgumentError, "recv_prev="),  # type: ignore[arg-type]
        (lambda: grid.p2p_ops("pp-tp"), DimsError, "one dim"),
    ]
    for call, error, match in cases:
        with pytest.raises(error, match=match):
            call()
    grid.destroy()


@pytest.mark.usefixtures("one_rank_world")
def test_collectives_on_one_rank_are_identities() -> None:
    grid = HyperCommGrid([1, 1], ["tp", "pp"])
    x = torch.arange(6.0).reshape(2, 3)
    assert torch.equal(grid.all_gather(x, "pp-tp", dim=1), x)
    assert torch.equal(grid.reduce_scatter(x, "tp", dim=1), x)
    assert torch.equal(grid.own_chunk(x, "tp", dim=-1), x)
    grid.broadcast(x, "pp")
    assert torch.equal(x, torch.arange(6.0).reshape(2, 3))
    grid.destroy()


def test_autograd_checks_dims_before_any_communication() -> None:
    grid = HyperCommGrid([2, 2], ["tp", "dp"])  # no world: a bad request fails before needing one
    x = torch.zeros(4, 4)
    with pytest.raises(DimsError, match="'ep'"):
        copy_to(x, grid, "ep")
    with pytest.raises(InvalidArgumentError, match="dim=2"):
        gather_from(x, grid, "tp", dim=2)
    with pytest.raises(InvalidArgumentError, match="dim=-3"):
        reduce_scatter_to(x, grid, "tp", dim=-3)


def test_scatter_to_refuses_a_size_the_group_does_not_divide() -> None:
    grid = HyperCommGrid([2, 2], ["tp", "dp"])  # refused before any rank or world is needed
    with pytest.raises(InvalidArgumentError, match="size 3, which does not divide into 4"):
        scatter_to(torch.ones(2, 3, requires_grad=True), grid, "dp-tp")


def test_mpu_unknown_dim_lists_the_keywords() -> None:
    grid = HyperCommGrid([2, 2, 2], ["model", "pipe", "data"])
    with pytest.raises(DimsError) as caught:
        MPU(grid, create=False)
    text = str(caught.value)
    assert "data='dp'" in text and "['model', 'pipe', 'data']" in text
    for keyword in ("data=", "tensor=", "pipe=", "context=", "expert=", "expert_data="):
        assert keyword in text
    mpu = MPU(grid, data="data", tensor="model", pipe="pipe", create=False)
    assert mpu.get_tensor_model_parallel_world_size() == 2 and mpu.model_dims == ("pipe", "model")


def test_mpu_roles_left_out_and_defaults() -> None:
    mpu = MPU(HyperCommGrid([2, 2, 2], ["tp", "pp", "dp"]), create=False)
    assert mpu.context_dims == mpu.expert_dims == ()
    assert (mpu.get_context_parallel_world_size(), mpu.get_expert_model_parallel_world_size()) == (1, 1)
    with pytest.raises(DimsError, match="no context dims"):
        mpu.get_context_parallel_group()
    with_cp = MPU(HyperCommGrid([2, 2, 2], ["tp", "cp", "pp"]), data=[], create=False)
    assert with_cp.context_dims == ("cp",) and with_cp.model_dims == ("pp", "tp")
    assert with_cp.get_data_parallel_world_size() == 1
    with pytest.raises(InvalidArgumentError, match="vp_stage=1"):
        mpu.is_pipeline_first_stage(ignore_virtual=False, vp_stage=1)


# -- fuzzed: hostile input gets a hypergrid error naming the value (the rules of tests/test_fuzz.py) --

TOOL_GRID = HyperCommGrid([2, 1, 2], ["tp", "pp", "dp"])


@given(st.one_of(fuzz.values, fuzz.names, st.lists(st.one_of(fuzz.names, fuzz.values), max_size=3)))
def test_fuzz_mesh_plan(dims: Any) -> None:
    plan = fuzz._checked(lambda: MeshPlan(TOOL_GRID.layout, dims), dims)
    if isinstance(plan, MeshPlan):
        assert math.prod(plan.shape) == plan.ranks(0).size


@given(fuzz.values, st.one_of(fuzz.values, st.sampled_from(["tp", "pp", "dp"])))
def test_fuzz_ring_neighbours(rank: Any, dim: Any) -> None:
    if rank is not None:
        fuzz._checked(lambda: TOOL_GRID.prev_rank(dim, rank=rank), dim, rank)
        fuzz._checked(lambda: TOOL_GRID.next_rank(dim, rank=rank), dim, rank)


@given(st.one_of(fuzz.values, fuzz.names), fuzz.values, fuzz.values)
def test_fuzz_mpu_roles(data: Any, tensor: Any, context: Any) -> None:
    fuzz._checked(
        lambda: MPU(TOOL_GRID, data=data, tensor=tensor, context=context, create=False), data, tensor, context
    )


@pytest.mark.usefixtures("one_rank_world_module")
@given(st.one_of(fuzz.values, st.sampled_from(["tp", "pp-tp", ["tp", "pp"]])), fuzz.values, fuzz.values)
def test_fuzz_collectives_in_a_live_world(dims: Any, dim: Any, value: Any) -> None:
    grid = HyperCommGrid([1, 1], ["tp", "pp"])
    x = torch.zeros(2, 2)
    fuzz._checked(lambda: grid.all_reduce(x, dims), dims)
    fuzz._checked(lambda: grid.all_reduce(value, "tp"), value)
    fuzz._checked(lambda: grid.all_gather(x, dims, dim=dim), dims, dim)
    fuzz._checked(lambda: grid.reduce_scatter(x, dims, dim=dim), dims, dim)
    fuzz._checked(lambda: grid.broadcast(x, dims, group_src=value), dims, value)
    fuzz._checked(lambda: grid.barrier(dims), dims)
    fuzz._checked(lambda: grid.own_chunk(x, dims, dim=dim), dims, dim)
    fuzz._checked(lambda: grid.p2p_ops(dims, send_next=value), dims, value)
    fuzz._checked(lambda: scatter_to(x, grid, dims, dim=dim), dims, dim)
    grid.destroy()
