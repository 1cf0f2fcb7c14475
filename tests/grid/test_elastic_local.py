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
