"""A world re-formed after one member's attempt failed in ``init_process_group`` (tests/grid/test_reform_names.py)."""

from __future__ import annotations

import datetime
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

from hypergrid.binding import reform


def reform_after_a_failed_init(failing: int) -> dict[str, Any]:
    """Every rank tears its world down; ``failing`` first tries a world its peers never join (torch times it out
    inside ``init_process_group``, as a member of a shrink attempt whose peer died in the handshake), then every
    rank re-forms the world together and all-reduces its rank + 1."""
    rank, size = dist.get_rank(), dist.get_world_size()
    base, how = c10d._get_default_store(), reform.formed()
    reform.tear_down(None)
    failed = None
    if rank == failing:
        alone = dist.PrefixStore("test/alone", base)  # type: ignore[attr-defined]
        try:
            second = datetime.timedelta(seconds=1)
            dist.init_process_group("gloo", store=alone, rank=rank, world_size=size, timeout=second)
        except RuntimeError as error:  # DistStoreError / DistBackendError: torch gave up waiting for the others
            failed = type(error).__name__
    counted = c10d._world.group_count  # torch counted the group it failed to form (the others' count is 0)
    reform.reform_world(base, 1, None, rank, size, how, None, datetime.timedelta(seconds=60), bound_s=10.0)
    value = torch.tensor([float(rank + 1)])
    dist.all_reduce(value)
    return {"failed": failed, "counted": counted, "sum": value.item(), "name": c10d._world.pg_names[dist.group.WORLD]}
