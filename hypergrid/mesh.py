"""DeviceMesh export: a torch ``DeviceMesh`` whose process groups are the grid's own."""

from __future__ import annotations

import itertools
from typing import Any

import torch

from hypergrid.errors import WorldSizeError
from hypergrid.facet import GridFacet
from hypergrid.layout import KEY_SEPARATOR, Dims

__all__ = ["MeshExport"]


class MeshExport(GridFacet):
    """Export to ``torch.distributed.device_mesh.DeviceMesh`` (a mixin of ``HyperCommGrid``)."""

    def to_device_mesh(self, dims: Dims, device_type: str = "cpu") -> Any:
        """A torch ``DeviceMesh`` over ``dims`` whose process groups are this grid's (no second set).

        Mesh dims come in the order given (``["dp", "tp"]``: dp outer, tp inner,
        as ``init_device_mesh`` would take them). **Collective** on first use of
        each dim's family (through ``pg``). The caller must be in the grid.
        """
        from torch.distributed.device_mesh import DeviceMesh

        names = list(dims.split(KEY_SEPARATOR)) if isinstance(dims, str) else list(dims)
        self.layout.dim_indices(names)  # validates: known, distinct, non-empty
        rank = self._rank(None)
        if not self.layout.contains(rank):
            raise WorldSizeError(f"rank {rank} is outside the grid {self.shape} (offset {self.rank_offset})")
        groups = [group for group in (self.pg(name) for name in names) if group is not None]
        coord = self.layout.coord_of(rank)._asdict()
        shape = [self.layout.dim_size(name) for name in names]
        points = itertools.product(*(range(size) for size in shape))
        mesh = [self.layout.rank_at(**{**coord, **dict(zip(names, point))}) for point in points]
        tensor = torch.tensor(mesh, dtype=torch.int).reshape(shape)
        return DeviceMesh.from_group(groups, device_type, mesh=tensor, mesh_dim_names=tuple(names))
