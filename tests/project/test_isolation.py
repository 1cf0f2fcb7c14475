"""A world's failure state never reaches another world: nothing process-wide to poison (issue 44).

A rank's fence and its store's loss belong to its world and its job (`hypergrid.agreement.world.World`, held by
its grids), not to the process. A pytest process runs many tests, each with its own worlds and stores: a world
that failed, was fenced and lost its store (as a watcher thread left over from a failed test would make it)
must leave the next world, in the same process, clean. Before the world object, both were process-wide and one
leftover watcher made 151 later tests fail in a CI run.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

import hypergrid
from hypergrid.errors import FencedError


def _one_rank_world() -> None:
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)


def test_a_fenced_world_with_its_store_lost_leaves_the_next_world_clean() -> None:
    _one_rank_world()
    grid = hypergrid.HyperCommGrid([1], ["dp"])
    old = grid._core.registry.world
    old.job.lose_store(RuntimeError("Connection reset by peer"))
    old.alarm.fence("left over from a failed test")
    with pytest.raises(hypergrid.StoreLostError):
        grid.create_pg(["dp"])
    dist.destroy_process_group()
    _one_rank_world()
    try:
        fresh = hypergrid.HyperCommGrid([1], ["dp"])
        assert fresh._core.registry.world is not old and fresh._core.registry.world.alarm.fenced is None
        tensor = torch.ones(1)
        dist.all_reduce(tensor, group=fresh.create_pg(["dp"]))
        assert tensor.item() == 1.0
        fresh.destroy()
        with pytest.raises(FencedError):  # the old world's grid is still fenced: its state is its own
            old.alarm.check_fence("a call on the old world")
    finally:
        dist.destroy_process_group()
