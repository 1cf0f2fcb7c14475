"""One test's process-wide failure state does not reach the next (`tests/conftest.py`).

A rank's store loss and its fence are process-wide (`hypergrid.binding.worldstate.WORLDS`); a pytest
process runs many tests, each with its own stores. The two tests below run in this order (pytest keeps a
module's order): the first loses the store and fences the process as a watcher thread left over from a failed
test would; the second must start clean and create and use a grid.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

import hypergrid
from hypergrid.binding import alarm
from hypergrid.binding.worldstate import WORLDS


def test_first_a_leftover_watcher_loses_the_store_and_fences_the_process() -> None:
    alarm.lose_store(RuntimeError("Connection reset by peer"))
    WORLDS.fence = "left over from a failed test"
    assert alarm.store_lost("a grid call") is not None and alarm.fenced() is not None


def test_then_the_next_test_starts_clean_and_its_grid_works(one_rank_world: None) -> None:
    assert alarm.store_lost("a grid call") is None and alarm.fenced() is None
    grid = hypergrid.HyperCommGrid([1], ["dp"])
    group = grid.create_pg(["dp"])
    tensor = torch.ones(1)
    dist.all_reduce(tensor, group=group)
    assert tensor.item() == 1.0
    grid.destroy()
