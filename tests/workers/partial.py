"""A shrink called by only some live ranks (tests/grid/test_partial_shrink.py)."""

from __future__ import annotations

import time
from typing import Any

import torch
import torch.distributed as dist

from hypergrid import HyperCommGrid, HyperGridError


def partial_shrink(callers: list[int], timeout_s: float) -> dict[str, Any]:
    """``callers`` call ``shrink`` (nobody died); the others go on to a grid call once the callers are done."""
    rank = dist.get_rank()
    grid = HyperCommGrid([2, dist.get_world_size() // 2], ["tp", "dp"])
    grid.create_pg("dp")
    store: Any = dist.distributed_c10d._get_default_store()
    # Meet on the store, not with a collective: the callers' shrink severs the world's connections at once, which
    # would break a torch barrier that a slower rank is still completing.
    store.set(f"test/ready/{rank}", "1")
    store.wait([f"test/ready/{other}" for other in range(dist.get_world_size())])
    if rank in callers:
        began = time.monotonic()
        try:
            regrid = grid.shrink(dim="dp", timeout_s=timeout_s)
        except HyperGridError as error:
            store.set(f"test/shrunk/{rank}", "1")
            return {"error": type(error).__name__, "seconds": time.monotonic() - began}
        store.set(f"test/shrunk/{rank}", "1")
        return {"dead": list(regrid.dead), "seconds": time.monotonic() - began, "world": dist.get_world_size()}
    store.wait([f"test/shrunk/{caller}" for caller in callers])
    errors = []
    for _ in range(2):  # FencedError both times, whatever this rank's watcher has read by then
        try:
            grid.all_reduce(torch.ones(1), "dp")
        except HyperGridError as error:
            errors.append(type(error).__name__)
    return {"errors": errors}
