"""The DeepSpeed drop-in: topology semantics (lenient where DeepSpeed is), _prime_factors, PipelineParallelGrid.

Expected values come from tests/references.py (plain loops over DeepSpeed's
documented row-major mapping), never from the adapter.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hypergrid import DimsError, HyperCommGrid, InvalidArgumentError, RankError, spawn
from hypergrid.compat.deepspeed import (
    PipeDataParallelTopology,
    PipelineParallelGrid,
    PipeModelDataParallelTopology,
    ProcessTopology,
    _prime_factors,
)
from hypergrid.compat.deepspeed_pipe import _default_topology
from tests.references import (
    deepspeed_axis_comm_lists,
    deepspeed_filter_match,
    deepspeed_get_coord,
    deepspeed_mapping,
)
from tests.workers.deepspeed import pipeline_grid_scenarios

AXES = ["pipe", "data", "model", "expert"]


@st.composite
def topologies(draw: st.DrawFn) -> tuple[list[str], list[int]]:
    axes = draw(st.permutations(AXES))[: draw(st.integers(1, 4))]
    return axes, [draw(st.integers(1, 3)) for _ in axes]


@given(topologies(), st.sampled_from(["pipe", "data", "model", "expert", "tensor", "jeff"]))
def test_absent_axes_answer_like_deepspeed(spec: tuple[list[str], list[int]], axis: str) -> None:
    axes, dims = spec
    topo = ProcessTopology(axes, dims)
    if axis in axes:
        assert topo.get_dim(axis) == dims[axes.index(axis)]
        assert topo.get_axis_comm_lists(axis) == deepspeed_axis_comm_lists(axes, dims, axis)
    else:
        assert topo.get_dim(axis) == 0
        assert topo.get_axis_comm_lists(axis) == []
        with pytest.raises(DimsError, match=repr(axis)):
            topo.get_axis_list(axis, 0)
        with pytest.raises(DimsError, match=repr(axis)):
            topo.filter_match(**{axis: 0})


@given(topologies(), st.data())
def test_out_of_range_values_match_nothing(spec: tuple[list[str], list[int]], data: st.DataObject) -> None:
    axes, dims = spec
    topo = ProcessTopology(axes, dims)
    axis = data.draw(st.sampled_from(axes))
    value = data.draw(st.sampled_from([-1, dims[axes.index(axis)], 99]))
    assert topo.filter_match(**{axis: value}) == deepspeed_filter_match(axes, dims, **{axis: value}) == []
    assert topo.get_axis_list(axis, value) == []


@given(topologies())
def test_mapping_and_coords_equal_deepspeed(spec: tuple[list[str], list[int]]) -> None:
    axes, dims = spec
    topo = ProcessTopology(axes, dims)
    expected = deepspeed_mapping(axes, dims)
    assert {tuple(coord): rank for coord, rank in topo.mapping.items()} == expected
    for rank in range(topo.world_size()):
        assert topo.get_coord(rank) == topo.ProcessCoord(**deepspeed_get_coord(axes, dims, rank))
    assert topo.get_rank_repr(0, omit_axes=["jeff"]) == "-".join(f"{axis}_00" for axis in axes)


def test_strict_where_deepspeed_fails() -> None:
    topo = ProcessTopology(axes=["pipe", "data"], dims=[2, 2])
    with pytest.raises(RankError, match="missing"):
        topo.get_rank(pipe=0)
    with pytest.raises(RankError, match="pipe=2"):
        topo.get_rank(pipe=2, data=0)
    with pytest.raises(ValueError, match="99"):
        topo.get_coord(99)
    assert str(topo) == "ProcessTopology(axes=['pipe', 'data'], dims=[2, 2])"


def test_named_topologies_order_their_axes() -> None:
    assert PipeDataParallelTopology(num_pp=3, num_dp=2).get_axis_names() == ["pipe", "data"]
    mp = PipeModelDataParallelTopology(num_pp=2, num_mp=3, num_dp=4)
    assert mp.get_axis_names() == ["pipe", "data", "model"] and mp.dims == [2, 4, 3]
    assert mp.get_axis_comm_lists("model") == deepspeed_axis_comm_lists(["pipe", "data", "model"], [2, 4, 3], "model")


def _is_prime(n: int) -> bool:
    return n >= 2 and all(n % d for d in range(2, n))


@given(st.integers(1, 5000))
def test_prime_factors(n: int) -> None:
    factors = _prime_factors(n)
    product = 1
    for factor in factors:
        product *= factor
        assert _is_prime(factor)
    assert product == n and factors == sorted(factors)


@pytest.mark.parametrize("bad", [0, -3, 2.0, "6"])
def test_prime_factors_refuses(bad: Any) -> None:
    with pytest.raises(InvalidArgumentError, match=repr(bad)):
        _prime_factors(bad)


def _default_split(world: int) -> tuple[int, int]:
    """DeepSpeed's documented default: prime factors (ascending) dealt to pipe, data, pipe, ..."""
    factors, rest, d = [], world, 2
    while rest > 1:
        while rest % d == 0:
            factors.append(d)
            rest //= d
        d += 1
    pipe = data = 1
    for i, prime in enumerate(factors):
        if i % 2 == 0:
            pipe *= prime
        else:
            data *= prime
    return pipe, data


@pytest.mark.parametrize("world", [1, 2, 6, 8, 12, 30, 64, 97])
def test_default_topology(world: int) -> None:
    topo = _default_topology(world)
    assert topo.get_axis_names() == ["pipe", "data"]
    assert tuple(topo.dims) == _default_split(world)


def test_grid_needs_a_world() -> None:
    from hypergrid import NotInitializedError

    with pytest.raises(NotInitializedError):
        PipelineParallelGrid()


def test_topology_is_the_reversed_grid() -> None:
    topo = ProcessTopology(axes=["pipe", "data", "model"], dims=[2, 3, 2])
    grid = HyperCommGrid([2, 3, 2], ["model", "data", "pipe"])
    for axis in topo.axes:
        assert topo.get_axis_comm_lists(axis) == grid.get_rank_enum(axis)


# -- PipelineParallelGrid on 8 gloo ranks ------------------------------------------------

WORLD = 8
TOPOLOGIES = [
    (["pipe", "data", "model"], [2, 2, 2]),
    (["pipe", "data"], [4, 2]),
    (["data", "pipe"], [2, 4]),
    (["pipe", "model"], [4, 2]),  # no data axis
    (["data", "model"], [4, 2]),  # no pipe axis
    (["pipe", "expert", "data"], [2, 2, 2]),  # an axis DeepSpeed's grid does not know
]


def _along(axes: list[str], dims: list[int], axis: str, rank: int) -> list[int]:
    """The reference group along ``axis`` holding ``rank`` (just ``[rank]`` when the axis is absent)."""
    if axis not in axes:
        return [rank]
    return next(group for group in deepspeed_axis_comm_lists(axes, dims, axis) if rank in group)


def _expected(axes: list[str], dims: list[int], rank: int) -> dict[str, Any]:
    coord = deepspeed_get_coord(axes, dims, rank)
    pipe, data, slice_ = (_along(axes, dims, axis, rank) for axis in ("pipe", "data", "model"))
    model = deepspeed_filter_match(axes, dims, data=coord["data"]) if "data" in axes else list(range(WORLD))
    stages = len(pipe)
    stage = coord.get("pipe", 0)
    size = dict(zip(axes, dims))
    p2p = []
    for other in range(WORLD):
        line = _along(axes, dims, "pipe", other)
        p2p.append([other, line[(line.index(other) + 1) % len(line)]])
    return {
        "stage": stage,
        "data_id": coord.get("data", 0),
        "first_last": (stage == 0, stage == stages - 1),
        "sizes": (stages, size.get("data", 1), len(model), size.get("model", 1), size.get("model", 1)),
        "ranks": (stage, coord.get("data", 0), model.index(rank), coord.get("model", 0), coord.get("model", 0)),
        "lists": (pipe, data, slice_),
        "member_lists": [pipe, data, model, slice_],
        "sums": [sum(pipe), sum(data), sum(model), sum(slice_)],
        "p2p_groups": p2p,
        "received": pipe[(stage - 1) % stages],
        "stage_to_global": pipe,
        "tensor_group_is_slice": True,
        "megatron_names": (stage, stages, data),
    }


@pytest.mark.processes
@pytest.mark.timeout(200)
def test_pipeline_parallel_grid_on_8_ranks() -> None:
    results = spawn(pipeline_grid_scenarios, WORLD, (TOPOLOGIES,), timeout_s=120)
    default = (["pipe", "data"], list(_default_split(WORLD)))
    for rank, out in enumerate(results):
        assert "8" in out["too_small"] and "4" in out["too_small"]
        assert out["desync"] == "OutOfStepError"  # a DesyncError: rank 0 creates on another grid
        for (axes, dims), run in zip([default, *TOPOLOGIES], out["runs"]):
            assert (run["axes"], run["dims"]) == (axes, dims)
            expected = _expected(axes, dims, rank)
            got = {key: tuple(value) if isinstance(value, tuple) else value for key, value in run.items()}
            assert {key: got[key] for key in expected} == expected, (rank, axes, dims)


# -- the MPU's DeepSpeed contract, and the PipelineModule hook (no DeepSpeed needed) -----------------------------

SEQUENCE_GETTERS = [
    f"get_sequence{kind}_parallel_{what}" for kind in ("", "_data") for what in ("group", "rank", "world_size")
]


def test_mpu_has_sequence_getters_only_with_sequence_dims() -> None:
    from hypergrid.compat.mpu import MPU

    plain = MPU(HyperCommGrid([2, 2, 2], ["tp", "pp", "dp"]), create=False)
    assert [name for name in SEQUENCE_GETTERS if hasattr(plain, name)] == []  # DeepSpeed's hasattr probes fail
    assert not hasattr(plain, "initialize_sequence_parallel")  # that would make DeepSpeed take it for its own module
    grid = HyperCommGrid([2, 1, 4, 2], ["tp", "pp", "sp", "dp"])
    mpu = MPU(grid, create=False)
    assert all(callable(getattr(mpu, name)) for name in SEQUENCE_GETTERS)
    assert (mpu.sequence_dims, mpu.sequence_data_dims, mpu.model_dims) == (("sp",), ("dp", "sp"), ("pp", "tp"))
    assert (mpu.get_sequence_parallel_world_size(), mpu.get_sequence_data_parallel_world_size()) == (4, 8)
    assert mpu.get_model_parallel_world_size() == 2  # sp holds the same weights: not model parallel
    renamed = MPU(HyperCommGrid([2, 4, 2], ["tp", "ulysses", "dp"]), pipe=None, sequence="ulysses", create=False)
    assert renamed.get_sequence_parallel_world_size() == 4 and renamed.model_dims == ("tp",)


def test_mpu_slice_and_checkpoint_getters(one_rank_world: None) -> None:
    from hypergrid.compat.mpu import MPU

    grid = HyperCommGrid([1, 1, 1, 1], ["tp", "pp", "sp", "dp"])
    mpu = MPU(grid)
    assert mpu.get_slice_parallel_group() is mpu.get_tensor_model_parallel_group()
    assert (mpu.get_slice_parallel_rank(), mpu.get_slice_parallel_world_size()) == (0, 1)
    assert mpu.get_data_parallel_group_ranks() == [0]
    assert (mpu.get_pipeline_model_parallel_rank(), mpu.get_pipeline_model_parallel_world_size()) == (0, 1)
    assert mpu.get_sequence_parallel_rank() == mpu.get_sequence_data_parallel_rank() == 0
    grid.destroy()


class _StandIn:
    """A stand-in for ``deepspeed.runtime.pipe.module``: its PipelineModule records the grid class it would build."""

    class PipelineParallelGrid:
        pass

    class PipelineModule:
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            import sys

            self.built_with = sys.modules["deepspeed.runtime.pipe.module"].PipelineParallelGrid
            self.args, self.kwargs = args, kwargs


def test_pipeline_module_hook_swaps_the_grid_class_and_restores_it(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    from hypergrid.compat.deepspeed import hypergrid_grid, pipeline_module

    monkeypatch.setitem(sys.modules, "deepspeed.runtime.pipe.module", _StandIn)
    original = _StandIn.PipelineParallelGrid
    module = pipeline_module("layers", num_stages=2)
    assert module.built_with is PipelineParallelGrid and (module.args, module.kwargs) == (
        ("layers",),
        {"num_stages": 2},
    )
    assert _StandIn.PipelineParallelGrid is original

    class Subclass(_StandIn.PipelineModule):
        pass

    assert pipeline_module(cls=Subclass).built_with is PipelineParallelGrid
    with pytest.raises(RuntimeError, match="inside"), hypergrid_grid():
        assert _StandIn.PipelineParallelGrid is PipelineParallelGrid
        raise RuntimeError("inside")
    assert _StandIn.PipelineParallelGrid is original  # restored after an error too
    with pytest.raises(InvalidArgumentError, match="subclass of DeepSpeed's PipelineModule"):
        pipeline_module(cls=dict)
