"""Scale without a cluster: torch's fake backend at 65,536 ranks, one process.

For a few sampled ranks, the process groups create_pg hands back hold exactly
the ranks the pure own-group computation predicts.
"""

from __future__ import annotations

import pytest
import torch.distributed as dist
from torch.testing._internal.distributed.fake_pg import FakeStore

from hypergrid import HyperCommGrid
from tests.references import node_halves

WORLD = 65_536
SHAPE = [8, 4, 2, 1024]
NAMES = ["tp", "cp", "pp", "dp"]
FAMILIES = [["tp"], ["dp"], ["cp", "tp"], ["dp", "cp"], ["pp", "dp", "tp"]]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("rank", [0, 1, 12_345, 40_000, WORLD - 1])
def test_created_groups_equal_the_pure_own_group(rank: int) -> None:
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=WORLD)
    try:
        grid = HyperCommGrid(SHAPE, NAMES)
        for family in FAMILIES:
            group = grid.create_pg(family)
            assert group is not None
            expected = grid.layout.group_ranks(family, rank)
            assert dist.get_process_group_ranks(group) == expected
            assert dist.get_rank(group) == expected.index(rank)
            assert group.size() == grid.layout.group_size(family)
        grid.destroy()
    finally:
        dist.destroy_process_group()


@pytest.mark.timeout(300)
def test_offset_grid_at_scale_leaves_outsiders_without_groups() -> None:
    dist.init_process_group("fake", store=FakeStore(), rank=5, world_size=WORLD)
    try:
        grid = HyperCommGrid([8, 1024], ["tp", "dp"], rank_offset=WORLD // 2)
        assert not grid.is_current_rank_in_grid()
        assert grid.create_pg("dp") is None
        assert grid.get_pg("dp") is None
    finally:
        dist.destroy_process_group()


@pytest.mark.timeout(300)
@pytest.mark.parametrize("rank", [3, 40_000])
def test_hierarchy_halves_at_scale_hold_the_node_cut_of_the_own_group(rank: int) -> None:
    # Expected: the own group of the family, cut by rank // 8 (within) or by position on the node (across).
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=WORLD)
    try:
        grid = HyperCommGrid([4, 4, 2, 2048], ["tp", "cp", "pp", "dp"], strategy="local")
        for family in (["dp", "cp"], ["dp", "pp", "cp", "tp"], ["tp"]):
            inner, outer = node_halves(grid.layout.group_ranks(family, rank), 8)
            node = next(part for part in inner if rank in part)
            across = next(part for part in outer if rank in part)
            for half, expected in (("within", node), ("across", across)):
                group = grid.create_pg(family, ranks_per_node=8, **{half: "node"})
                assert group is not None
                assert dist.get_process_group_ranks(group) == expected, (family, half)
        grid.destroy()
    finally:
        dist.destroy_process_group()
