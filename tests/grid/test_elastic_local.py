"""The elastic grid in one process: a shrink of a one-rank world re-creates every kind of family; views follow."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
import torch.distributed as dist

from hypergrid import HyperCommGrid, Regrid
from hypergrid.errors import GridSpecError, GridTooLargeError, InvalidArgumentError, NotInitializedError
from hypergrid.grid.succession import successor
from hypergrid.layout.shrink import plan_shrink


@pytest.fixture
def world() -> Iterator[None]:
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    if dist.is_initialized():
        dist.destroy_process_group()


def test_shrink_recreates_tags_halves_and_views(world: None) -> None:
    grid = HyperCommGrid([1, 1, 1], ["tp", "cp", "dp"], guard_timeout_s=5.0)
    grid.register_view("expert", [1, 1, 1], ["etp", "ep", "dp"], shared_dims=["dp"])
    grid.create_pgs(["tp", ["dp", "tp"]])
    grid.create_pg("dp", tag="ag")
    grid.create_pg(["cp", "dp"], within="node", ranks_per_node=1)
    grid.create_pg(["ep", "etp"], view="expert")
    grid.create_pg("dp", view="expert")  # a shared family: the base grid's
    before = list(grid.created_keys)
    old_world = dist.group.WORLD
    regrid = grid.shrink()
    assert isinstance(regrid, Regrid) and regrid.epoch == 1 and regrid.dead == () and regrid.rank == 0
    assert dist.group.WORLD is not old_world  # a new default group, epoch 1
    new = regrid.grid
    assert new.created_keys == before
    assert grid.created_keys == []  # the old grid let go of everything
    assert new._views["expert"].shape == [1, 1, 1]
    x = torch.ones(2)
    new.all_reduce(x, ["dp", "tp"])
    assert x.tolist() == [1.0, 1.0]
    again = new.shrink()  # epochs go on
    assert again.epoch == 2 and again.grid.created_keys == before


def test_views_follow_the_dropped_dim_or_are_refused() -> None:
    grid = HyperCommGrid([2, 4], ["tp", "dp"])
    grid.register_view("expert", [2, 4], ["ep", "dp"], shared_dims=["dp"])
    plan = plan_shrink(grid.layout, 8, 0, [3], "dp", "drop")
    new = successor(grid, plan)
    assert new.shape == [2, 3] and new._views["expert"].shape == [2, 3]
    folded = HyperCommGrid([2, 4], ["tp", "dp"])
    folded.register_view("moe", [8], ["ep"])
    with pytest.raises(GridSpecError, match=r"'moe'.*cannot follow"):
        successor(folded, plan)


def test_bad_spares_and_uninitialized_shrink() -> None:
    with pytest.MonkeyPatch.context() as patch, pytest.raises(GridTooLargeError, match="spares=2"):
        patch.setenv("WORLD_SIZE", "9")  # one rank left over after the grid of 8
        HyperCommGrid([2, 4], ["tp", "dp"], spares=2)
    with pytest.raises(InvalidArgumentError, match="spares"):
        HyperCommGrid([2], ["dp"], spares=-1)
    with pytest.raises(NotInitializedError, match="shrink"):
        HyperCommGrid([2], ["dp"]).shrink()


def test_shrink_and_grow_drop_or_fill_only_a_declared_replica_dim_refused_before_torch_is_asked() -> None:
    """Issue 54: ``shrink(dim="tp", policy="drop")`` succeeded: half the model was thrown away, silently."""
    grid = HyperCommGrid([2, 2], ["tp", "dp"])
    assert grid.replicas == ("dp",)
    for call in ("shrink", "grow"):
        with pytest.raises(InvalidArgumentError, match=rf"^{call}: dim='tp' is not a replica dim .*replicas=\['dp'\]"):
            getattr(grid, call)(dim="tp")
    declared = HyperCommGrid([2, 2], ["tp", "edp"], replicas="edp")
    assert declared.replicas == ("edp",)
    with pytest.raises(NotInitializedError, match="shrink"):  # a declared replica dim passes to the next check
        declared.shrink(dim="edp")
    with pytest.raises(InvalidArgumentError, match=r"replicas=\[\]"):  # no dp, none declared: nothing to drop
        HyperCommGrid([2, 2], ["tp", "pp"]).shrink(dim="pp")


@pytest.mark.parametrize(
    ("replicas", "said"),
    [
        ("pp", "'pp' is not a dim of the grid"),
        (["dp", "dp"], "a dim is named twice"),
        (3, "expected a dim name, a list of dim names or None"),
        ([["dp"]], "expected a dim name"),
    ],
)
def test_bad_replicas_are_refused_by_name(replicas: object, said: str) -> None:
    with pytest.raises(InvalidArgumentError, match=f"^HyperCommGrid: replicas=.*{said}"):
        HyperCommGrid([2, 2], ["tp", "dp"], replicas=replicas)  # type: ignore[arg-type]


def test_spares_with_every_replica_dim_of_size_1_are_refused_and_a_shrink_that_leaves_them_so_is_not() -> None:
    """A drafted spare copies its state from a replica peer: with dp 1 there is none (issue 54). A successor that a
    ``drop`` left at dp 1 with its spares still waiting is the job's state, not a user's choice: it is built."""
    with pytest.raises(InvalidArgumentError, match=r"spares=2 with every replica dim of size 1 \(dp=1\)"):
        HyperCommGrid([2, 1], ["tp", "dp"], spares=2)
    HyperCommGrid([2, 2], ["tp", "dp"], spares=2)  # dp 2: a replica holds each shard
    HyperCommGrid([2, 1], ["tp", "dp"])  # no spares: nothing to draft
    grid = HyperCommGrid([2, 2], ["tp", "dp"], spares=1)
    plan = plan_shrink(grid.layout, 5, 1, [3], "dp", "drop")
    assert plan.shape == (2, 1) and plan.spares == 1
    after = successor(grid, plan)
    assert after.shape == [2, 1] and after.spares == 1 and after.replicas == ("dp",)


def test_a_view_declares_no_replica_dim_of_its_own() -> None:
    grid = HyperCommGrid([2, 4], ["tp", "dp"])
    assert grid.view([2, 2, 2], ["tp", "ep", "edp"]).replicas == () and grid.replicas == ("dp",)
