"""DeviceMesh export: a torch ``DeviceMesh`` whose process groups are the grid's own."""

from __future__ import annotations

from typing import Any

import torch

from hypergrid.binding.facet import GridFacet
from hypergrid.layout.meshspec import MeshDims, MeshPlan

__all__ = ["MeshExport"]


class MeshExport(GridFacet):
    """Export to ``torch.distributed.device_mesh.DeviceMesh`` (a mixin of ``HyperCommGrid``)."""

    def to_device_mesh(self, dims: MeshDims, device_type: str = "cpu") -> Any:
        """A torch ``DeviceMesh`` over ``dims`` whose process groups are this grid's (no second set).

        Mesh dims come in the order given (``["dp", "tp"]``: dp outer, tp inner,
        as ``init_device_mesh`` would take them). An element may be a tuple of
        grid dims forming one mesh dim, named by joining them with ``_`` and
        named outermost first: ``["dp", ("pp", "tp")]`` gives mesh dims
        ``("dp", "pp_tp")``, whose second dim's groups are the grid's family
        over ``pp`` and ``tp``.

        **Collective** on first use of each mesh dim's family (through ``pg``),
        in the order given: every rank that takes part in creation calls it,
        including ranks outside a sub-grid, which then get ``RankError``.

        Raises:
            DimsError: unknown or repeated dims, or a combined dim not named outermost first.
            RankError: the caller is outside the grid (after taking part in creation).

        Examples:
            >>> import torch.distributed as dist
            >>> from hypergrid import HyperCommGrid
            >>> dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
            >>> grid = HyperCommGrid([1, 1, 1], ["tp", "pp", "dp"])
            >>> mesh = grid.to_device_mesh(["dp", ("pp", "tp")])
            >>> mesh.mesh_dim_names, mesh.get_group("pp_tp") is grid.get_pg("pp-tp")
            (('dp', 'pp_tp'), True)
            >>> grid.destroy(); dist.destroy_process_group()
        """
        from torch.distributed.device_mesh import DeviceMesh

        plan = MeshPlan(self.layout, dims)
        for group in plan.members:  # every family first: a non-member raises only after all creations
            self.pg(list(group))
        groups = [self._member_pg(list(group), "to_device_mesh") for group in plan.members]
        mesh = torch.from_numpy(plan.ranks(self._rank(None))).to(torch.int)
        return DeviceMesh.from_group(groups, device_type, mesh=mesh, mesh_dim_names=plan.names)
