"""Adapters: DeepSpeed's ProcessTopology, Megatron's order strings and RankGenerator, views, the MPU."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hypergrid import DimsError, GridSpecError, HyperCommGrid, RankError
from hypergrid.compat.deepspeed import PipeDataParallelTopology, PipeModelDataParallelTopology, ProcessTopology
from hypergrid.compat.megatron import RankGenerator, grid_from_order, moe_grids
from hypergrid.compat.mpu import MPU
from tests.references import (
    deepspeed_axis_comm_lists,
    deepspeed_filter_match,
    deepspeed_get_coord,
    deepspeed_rank_repr,
    megatron_rank_groups,
)

AXES = ["pipe", "data", "model", "expert"]


@given(st.data())
def test_process_topology_equals_deepspeed(data: st.DataObject) -> None:
    axes = data.draw(st.permutations(AXES))[: data.draw(st.integers(1, 4))]
    dims = [data.draw(st.integers(1, 3)) for _ in axes]
    topo = ProcessTopology(axes, dims)
    assert topo.world_size() == len(deepspeed_filter_match(axes, dims))
    rank = data.draw(st.integers(0, topo.world_size() - 1))
    assert topo.get_coord(rank)._asdict() == deepspeed_get_coord(axes, dims, rank)
    assert topo.get_rank(**topo.get_coord(rank)._asdict()) == rank
    for axis in axes:
        assert topo.get_axis_comm_lists(axis) == deepspeed_axis_comm_lists(axes, dims, axis)
        assert topo.get_dim(axis) == dims[axes.index(axis)]
        idx = data.draw(st.integers(0, dims[axes.index(axis)] - 1))
        assert topo.get_axis_list(axis, idx) == deepspeed_filter_match(axes, dims, **{axis: idx})
    criteria = {
        a: data.draw(st.integers(0, dims[axes.index(a)] - 1))
        for a in data.draw(st.lists(st.sampled_from(axes), unique=True))
    }
    assert topo.filter_match(**criteria) == deepspeed_filter_match(axes, dims, **criteria)
    assert topo.get_rank_repr(rank) == deepspeed_rank_repr(axes, dims, rank, ["data", "pipe"], "_", "-")


def test_deepspeed_docstring_examples() -> None:
    x = ProcessTopology(axes=["x", "y"], dims=[2, 3])
    assert x.get_rank(x=0, y=1) == 1 and x.get_dim("y") == 3
    assert (x.get_coord(rank=1).x, x.get_coord(rank=1).y) == (0, 1)
    assert x.get_axis_list(axis="x", idx=0) == [0, 1, 2] and x.get_axis_list(axis="y", idx=0) == [0, 3]
    topo = ProcessTopology(axes=["pipe", "data", "model"], dims=[2, 2, 2])
    assert topo.get_axis_comm_lists("pipe") == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert topo.filter_match(pipe=0, data=1) == [2, 3]
    ab = ProcessTopology(axes=["a", "b"], dims=[2, 2])
    assert ab.get_rank_repr(rank=3) == "a_01-b_01" and ab.get_rank_repr(rank=3, omit_axes=["a"]) == "b_01"
    assert PipeDataParallelTopology(num_pp=2, num_dp=3).get_axis_names() == ["pipe", "data"]
    assert PipeModelDataParallelTopology(num_pp=2, num_mp=2, num_dp=1).get_dim("model") == 2


@pytest.mark.parametrize(
    ("call", "error", "text"),
    [
        (lambda t: t.get_axis_list("tensor", 0), DimsError, "'tensor'"),  # DeepSpeed: ValueError too
        (lambda t: t.filter_match(tensor=0), DimsError, "'tensor'"),  # DeepSpeed: AttributeError
        (lambda t: t.get_rank(pipe=0), RankError, "missing"),
        (lambda t: t.get_rank(pipe=5, data=0), RankError, "pipe=5"),
        (lambda t: t.get_coord(99), RankError, "99"),
    ],
)
def test_deepspeed_errors_are_clear(call: object, error: type, text: str) -> None:
    topo = ProcessTopology(axes=["pipe", "data"], dims=[2, 2])
    with pytest.raises(error, match=text):
        call(topo)  # type: ignore[operator]


@given(st.data())
def test_megatron_order_strings(data: st.DataObject) -> None:
    names = data.draw(st.permutations(["tp", "cp", "ep", "dp", "pp"]))
    sizes = {name: data.draw(st.integers(1, 3)) for name in names}
    order = "-".join(names)
    grid = grid_from_order(order, sizes)
    generator = RankGenerator(order=order, **sizes)
    token = "-".join(data.draw(st.lists(st.sampled_from(names), min_size=1, unique=True)))
    expected = megatron_rank_groups(order, sizes, token)
    assert grid.get_rank_enum(token) == expected == generator.get_ranks(token)


def test_megatron_spec_and_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    grid = grid_from_order("tp-cp-pp-dp", tp=2, cp=3, pp=4, dp=5)
    assert grid.shape == [2, 3, 4, 5]
    # Megatron-Core 0.19 appends the missing size-1 dims as tp, pp, dp, ep, cp, gtp_remat (checked in its 3.12 env).
    assert RankGenerator(tp=2, ep=1, dp=2, pp=1, cp=1, order="tp-dp").order == "tp-dp-pp-ep-cp-gtp_remat"
    monkeypatch.setenv("WORLD_SIZE", "16")
    assert grid_from_order("tp-dp", tp=4).shape == [4, 4]  # dp inferred
    with pytest.raises(GridSpecError, match="pp=2"):
        RankGenerator(tp=2, ep=1, dp=2, pp=2, cp=1, order="tp-dp")
    with pytest.raises(DimsError, match="xp"):
        RankGenerator(tp=1, ep=1, dp=1, pp=1, cp=1, order="tp-xp")
    with pytest.raises(DimsError, match="'ep'"):
        grid_from_order("tp-dp", tp=2, ep=2)


def test_moe_folding_shares_pp(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WORLD_SIZE", "32")
    dense, expert = moe_grids(tp=2, pp=2, etp=2, ep=4, cp=2)
    assert (dense.dim_names, dense.shape) == (["tp", "cp", "dp", "pp"], [2, 2, 4, 2])
    assert (expert.dim_names, expert.shape) == (["etp", "ep", "edp", "pp"], [2, 4, 2, 2])
    assert expert.shared_dims == ("pp",)
    assert expert.get_rank_enum("pp") == dense.get_rank_enum("pp")
    with pytest.raises(GridSpecError, match="does not divide"):
        moe_grids(tp=2, pp=2, etp=3, ep=4)


def test_views_check_size_and_shared_dims() -> None:
    grid = HyperCommGrid([2, 2, 2], ["tp", "dp", "pp"])
    assert grid.view([4, 2], ["ep", "pp"]).shared_dims == ("pp",)
    with pytest.raises(GridSpecError, match="same 8 ranks"):
        grid.view([2, 2], ["ep", "pp"])
    with pytest.raises(GridSpecError, match="Shared dim 'pp' has different membership across views"):
        grid.view([2, 4], ["pp", "ep"])  # pp innermost in the view: other groups
    with pytest.raises(GridSpecError, match="'cp'"):
        grid.view([4, 2], ["ep", "pp"], shared_dims=["cp"])
    assert grid.view([4, 2], ["ep", "pp"], shared_dims=[]).shared_dims == ()


def test_mpu_offline_sizes_and_dims() -> None:
    mpu = MPU(HyperCommGrid([2, 2, 2], ["tp", "pp", "dp"]), create=False)
    assert (mpu.data_dims, mpu.tensor_dims, mpu.pipe_dims, mpu.model_dims) == (("dp",), ("tp",), ("pp",), ("pp", "tp"))
    assert mpu.get_model_parallel_world_size() == 4 and mpu.get_pipe_parallel_world_size() == 2
    with pytest.raises(DimsError, match="'cp'"):
        MPU(HyperCommGrid([2, 2], ["tp", "dp"]), pipe="cp", create=False)
