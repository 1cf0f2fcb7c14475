"""Functions run inside spawned gloo processes for the Megatron API tests (module level, so spawn can import them)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.distributed as dist

from hypergrid import HyperCommGrid
from hypergrid.compat.megatron import PG_FIELDS, destroy_process_groups, grid_of, process_groups
from hypergrid.errors import DesyncError


def _summary(group: Any) -> Any:
    """The group's ranks and the all_reduce sum of the members' ranks (None where the rank is in no group)."""
    if group is None:
        return None
    if isinstance(group, list):  # hcp: one group per level
        return [_summary(level) for level in group]
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
    destroy_process_groups(pgs)
    out["empty_after_destroy"] = grid._pgs == {}
    return out


@contextmanager
def _batches() -> Iterator[list[tuple[str | None, str | None]]]:
    """The (view, tag) of every create_pgs call (one guard round each)."""
    calls: list[tuple[str | None, str | None]] = []
    real = HyperCommGrid.create_pgs

    def counted(self: HyperCommGrid, *args: Any, **kwargs: Any) -> Any:
        calls.append((kwargs.get("view"), kwargs.get("tag")))
        return real(self, *args, **kwargs)

    HyperCommGrid.create_pgs = counted  # type: ignore[method-assign]
    try:
        yield calls
    finally:
        HyperCommGrid.create_pgs = real  # type: ignore[method-assign]


ONE_CALLS: dict[str, dict[str, Any]] = {
    "moe": dict(tp=2, pp=2, ep=2, etp=1),  # every expert family has a dense family's members
    "moe_view": dict(tp=2, ep=4, etp=1),  # ep 4 spans tp and half of dp: the expert view's own families
    "everything": dict(
        tp=2, cp=2, ep=2, etp=1, distributed_optimizer_instances=2, hierarchical_cp=[2], all_gather=True
    ),
}


def megatron_one_call() -> dict[str, Any]:
    """The one-call form on 8 ranks (guard on): every field, the batches it took; then ranks that disagree."""
    out: dict[str, Any] = {}
    for name, sizes in ONE_CALLS.items():
        with _batches() as calls:
            pgs = process_groups(**sizes)
        out[name] = {
            "fields": {field: _summary(getattr(pgs, field)) for field in PG_FIELDS},
            "batches": calls,
            "communicators": len(grid_of(pgs).communicators()),
        }
        destroy_process_groups(pgs)
    last = dist.get_rank() == 7
    disagreements = {
        # One rank asks for the all-gather twins, the others do not.
        "desync": dict(tp=2, pp=2, all_gather=last),
        # ep and etp swapped on one rank: both fold into the same grid families, only the expert view differs.
        "desync_expert": dict(tp=2, ep=2 if last else 1, etp=1 if last else 2),
    }
    for name, sizes in disagreements.items():
        try:  # all of them fail in the first round
            process_groups(**sizes, guard_timeout_s=60.0)
            out[name] = None
        except DesyncError as error:
            out[name] = str(error)
    return out
