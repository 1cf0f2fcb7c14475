"""Functions run inside spawned gloo processes for the Megatron API tests (module level, so spawn can import them)."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from hypergrid import HyperCommGrid
from hypergrid.compat.megatron import PG_FIELDS, process_groups


def _summary(group: Any) -> tuple[list[int], int] | None:
    """The group's ranks and the all_reduce sum of the members' ranks (None where the rank is in no group)."""
    if group is None:
        return None
    value = torch.tensor([dist.get_rank()], dtype=torch.int64)
    dist.all_reduce(value, group=group)
    return dist.get_process_group_ranks(group), int(value.item())


def megatron_scenarios() -> dict[str, Any]:
    """process_groups over a dense grid and an expert view; DeviceMeshes of a grid with views, on 8 ranks."""
    out: dict[str, Any] = {}
    grid = HyperCommGrid([2, 1, 2, 2], ["tp", "cp", "dp", "pp"])
    grid.register_view("expert", [1, 4, 1, 2], ["expt_tp", "ep", "expt_dp", "pp"], shared_dims=["pp"])
    pgs = process_groups(grid, "expert")
    out["class"] = type(pgs).__name__
    out["fields"] = {name: _summary(getattr(pgs, name, None)) for name in PG_FIELDS}
    out["pp_shared"] = pgs.pp is grid.get_pg("pp", view="expert") and pgs.tp_ep_pp is not pgs.pp
    out["again_same"] = process_groups(grid, "expert", embedding=False).dp is pgs.dp  # reused, not re-created
    # DeviceMesh: the dense grid (which has a view) and a grid returned by view().
    mesh = grid.to_device_mesh(["dp", "tp"])
    out["dense_mesh"] = (mesh.mesh.tolist(), mesh.get_group("dp") is grid.get_pg("dp"))
    expert = grid.view([1, 4, 1, 2], ["expt_tp", "ep", "expt_dp", "pp"], ["pp"], name="expert")
    emesh = expert.to_device_mesh(["pp", "ep"])
    out["expert_mesh"] = (
        emesh.mesh.tolist(),
        emesh.get_group("ep") is grid.get_pg("ep", view="expert"),
        emesh.get_group("pp") is grid.get_pg("pp"),
        _summary(emesh.get_group("ep")),
    )
    for group in (pgs.embd, pgs.pos_embd):
        if group is not None:
            dist.destroy_process_group(group)
    grid.destroy()
    out["empty_after_destroy"] = grid._pgs == {}
    return out
