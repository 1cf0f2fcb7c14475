"""Functions run inside spawned gloo processes for the sharing tests (module level, so spawn can import them)."""

from __future__ import annotations

import datetime
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

from hypergrid import DesyncError, HyperCommGrid


def _sum_of_ranks(group: Any) -> int:
    value = torch.tensor([dist.get_rank()], dtype=torch.int64)
    dist.all_reduce(value, group=group)
    return int(value.item())


def shared_families(strategy: str) -> dict[str, Any]:
    """Every family of a [2, 1, 2, 2] grid (cp = 1), twins, then destroy: what each rank sees."""
    held_before = len(c10d._world.pg_names)
    grid = HyperCommGrid([2, 1, 2, 2], ["tp", "cp", "ep", "dp"], strategy=strategy)
    out: dict[str, Any] = {"families": {}}
    groups = {}
    for family in grid.layout.all_families():
        group = grid.create_pg(family)
        groups[grid.layout.key(family)] = group
        out["families"][grid.layout.key(family)] = {"ranks": dist.get_process_group_ranks(group)}
    for key, group in groups.items():
        out["families"][key]["sum"] = _sum_of_ranks(group)
        out["families"][key]["same_as"] = sorted(other for other, g in groups.items() if g is group)
    # A gloo twin of dp and a second dp communicator: separate objects, same members, both work.
    twin = grid.create_pg("dp", backend="gloo", tag="cpu")
    second = grid.create_pg("dp", tag="ag")
    out["twin"] = {
        "distinct": len({id(twin), id(second), id(groups["dp"])}) == 3,
        "ranks": [dist.get_process_group_ranks(twin), dist.get_process_group_ranks(second)],
        "sums": [_sum_of_ranks(twin), _sum_of_ranks(second), _sum_of_ranks(groups["dp"])],
    }
    out["communicators"] = len(grid.communicators())
    grid.destroy()
    out["held_back_to_before"] = len(c10d._world.pg_names) == held_before
    return out


def differing_options(odd_rank: int, what: str) -> str:
    """Every rank asks for dp; ``odd_rank`` with another timeout, tag or backend: the guard's verdict."""
    grid = HyperCommGrid([2, 2], ["tp", "dp"])
    kwargs: dict[str, Any] = {"timeout": datetime.timedelta(seconds=100)}
    if dist.get_rank() == odd_rank:
        kwargs = {
            "timeout": {"timeout": datetime.timedelta(seconds=200)},
            "tag": {**kwargs, "tag": "ag"},
            "backend": {**kwargs, "backend": "gloo", "tag": "cpu"},
        }[what]
    if what == "backend" and dist.get_rank() != odd_rank:
        kwargs["tag"] = "cpu"  # the others ask for the same tag with the default backend
    try:
        grid.create_pg("dp", **kwargs)
    except DesyncError as error:
        return str(error)
    finally:
        grid.destroy()
    return "created"


def differing_options_each(odd_rank: int, whats: list[str]) -> dict[str, str]:
    """``differing_options`` for each of ``whats`` in turn, in one world: each verdict by what differs."""
    return {what: differing_options(odd_rank, what) for what in whats}
