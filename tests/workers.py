"""Functions run inside spawned gloo processes (module level, so spawn can import them)."""

from __future__ import annotations

import os
import time
from typing import Any

import torch
import torch.distributed as dist

from hypergrid import GroupExistsError, HyperCommGrid


def _allreduce_rank(group: Any) -> int:
    value = torch.tensor([dist.get_rank()], dtype=torch.int64)
    dist.all_reduce(value, group=group)
    return int(value.item())


def grid_scenarios() -> dict[str, Any]:
    """Every family of a [2,2,2] grid, then an offset grid, then destroy and re-create."""
    rank = dist.get_rank()
    grid = HyperCommGrid([2, 2, 2], ["tp", "cp", "dp"])
    layout = grid.layout
    out: dict[str, Any] = {"rank": rank, "families": {}}
    for family in layout.all_families():
        group = grid.create_pg(list(reversed(family)), group_desc=f"HG_{layout.key(family)}")
        out["families"][layout.key(family)] = {
            "sum": _allreduce_rank(group),
            "ranks": dist.get_process_group_ranks(group),
            "group_rank": dist.get_rank(group),
            "same_object": grid.get_pg(list(family)) is group and grid.get_pg(layout.key(family)) is group,
            "desc": group.group_desc,
        }
    try:
        grid.create_pg(["cp", "tp"])
        out["recreate"] = "no error"
    except GroupExistsError as error:
        out["recreate"] = str(error)

    # An offset grid over ranks 4..7: ranks 0..3 are outside and get None.
    offset = HyperCommGrid([2, 2], ["tp", "dp"], rank_offset=4)
    out["in_offset_grid"] = offset.is_current_rank_in_grid()
    offset_groups = {}
    for family in offset.layout.all_families():
        group = offset.create_pg(family)
        offset_groups[offset.layout.key(family)] = None if group is None else _allreduce_rank(group)
    out["offset"] = offset_groups
    out["offset_get_pg_none"] = offset.get_pg("dp") is None

    # destroy, then create again: new groups, same membership, working collectives.
    old = grid.get_pg("tp")
    grid.destroy()
    out["after_destroy_keys"] = grid.created_keys
    try:
        dist.get_process_group_ranks(old)
        out["old_still_registered"] = True
    except KeyError:
        out["old_still_registered"] = False
    again = grid.create_pg("tp")
    out["recreated_sum"] = _allreduce_rank(again)
    out["recreated_is_new"] = again is not old
    grid.destroy()
    offset.destroy()
    return out


def fail_on_rank(bad_rank: int) -> int:
    """Raise on one rank; the others wait in a collective that will never complete."""
    if dist.get_rank() == bad_rank:
        raise RuntimeError(f"deliberate failure on rank {bad_rank}")
    dist.barrier()
    return dist.get_rank()


def exit_on_rank(bad_rank: int) -> int:
    """One rank dies without a word (as a killed process would)."""
    if dist.get_rank() == bad_rank:
        os._exit(17)
    dist.barrier()
    return dist.get_rank()


def sleep_forever() -> None:
    time.sleep(3600)


def environment() -> dict[str, str]:
    keys = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")
    return {key: os.environ[key] for key in keys} | {"dist_rank": str(dist.get_rank())}
