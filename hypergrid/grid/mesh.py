"""DeviceMesh export: torch ``DeviceMesh`` objects whose process groups are the grid's own, from one root."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from hypergrid.binding.facet import Facet, require_initialized
from hypergrid.errors import DimsError
from hypergrid.layout.meshspec import MeshDims, MeshPlan
from hypergrid.validation import check_str
from hypergrid.values import shown

#: What a device type looks like (torch's ``cpu``, ``cuda``, ``xpu``, ``privateuseone``, ...).
DEVICE_TYPE = r"[a-z][a-z0-9_]{0,31}"

if TYPE_CHECKING:
    from hypergrid.grid.gridmesh import MeshSources

__all__ = ["MeshExport"]


class MeshExport(Facet):
    """Export to ``torch.distributed.device_mesh.DeviceMesh`` (a facet object of ``HyperCommGrid``)."""

    def _mesh_sources(self) -> MeshSources:
        """The root grid's meshes (created on the first export; ``destroy`` forgets what it releases)."""
        registry = self._core.registry  # the root's, shared with its views
        sources: MeshSources | None = registry.device_meshes
        if sources is None:
            from hypergrid.grid.gridmesh import MeshSources  # torch's device_mesh module: imported on first use

            sources = registry.device_meshes = MeshSources(self._core.root)
        return sources

    def to_device_mesh(self, dims: MeshDims, device_type: str = "cpu") -> Any:
        """A torch ``DeviceMesh`` over ``dims`` whose process groups are this grid's (no second set).

        Mesh dims come in the order given (``["dp", "tp"]``: dp outer, tp inner,
        as ``init_device_mesh`` would take them). An element may be a tuple of
        grid dims forming one mesh dim, named by joining them with ``_`` and
        named outermost first: ``["dp", ("pp", "tp")]`` gives mesh dims
        ``("dp", "pp_tp")``, whose second dim's groups are the grid's family
        over ``pp`` and ``tp``. A mapping names the mesh dims:
        ``{"batch": ("dp_replicate", "dp_shard"), "tp": "tp"}``. A dim this
        grid lacks is taken from the base grid or a registered view over the
        same ranks (MoE: ``["pp", "dp_replicate", "efsdp", "ep"]``); one
        combined mesh dim takes its dims from one of them. The mapping
        ``{"world": <every dim, outermost first>}`` gives the root mesh itself.

        Every mesh of a grid and its views derives from one root mesh (1-D,
        ``"world"``, over the grid's ranks), so torch slices, concatenates
        (FSDP) and flattens them as its own; flattening takes the grid's family
        over the flattened dims instead of creating a group. The same request
        returns the same object until ``destroy`` releases its groups. A size-1
        dim holds no real communicator, and the all-dims family of a grid over
        the whole world is the default group (see ``docs/toolkit.md``).

        **Collective** on first use of each mesh dim's family (through ``pg``),
        in the order given: every rank that takes part in creation calls it,
        including ranks outside a sub-grid, which then get ``RankError``.

        Args:
            dims: the mesh dims, as above.
            device_type: the mesh's device type (``"cpu"``, ``"cuda"``, ...).

        Raises:
            DimsError: unknown or repeated dims, a combined dim not named
                outermost first or mixing factorizations, or mesh dims whose
                ranks overlap.
            InvalidArgumentError: ``device_type`` is not a device type (a short lowercase name).
            RankError: the caller is outside the grid (after taking part in creation).

        Examples:
            >>> import torch.distributed as dist
            >>> from hypergrid import HyperCommGrid
            >>> dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
            >>> grid = HyperCommGrid([1, 1, 1], ["tp", "pp", "dp"])
            >>> mesh = grid.to_device_mesh(["dp", ("pp", "tp")])
            >>> mesh.mesh_dim_names, mesh.get_group("pp_tp") is grid.get_pg("pp-tp")
            (('dp', 'pp_tp'), True)
            >>> named = grid.to_device_mesh({"batch": ("dp", "pp"), "tp": "tp"})
            >>> named is grid.to_device_mesh({"batch": ("dp", "pp"), "tp": "tp"})
            True
            >>> named._get_root_mesh() is mesh._get_root_mesh()
            True
            >>> grid.destroy(); dist.destroy_process_group()
        """
        return self.to_device_meshes([dims], device_type)[0]

    def to_device_meshes(self, dims_list: Sequence[MeshDims], device_type: str = "cpu") -> list[Any]:
        """``to_device_mesh`` of each element of ``dims_list``, their new families created in one step.

        The families none of the meshes has yet are created with one
        ``create_pgs`` call (one guard round) per factorization, instead of one
        creation per family: what a framework that builds many meshes at start-up
        wants. Collective like ``to_device_mesh``.

        Raises:
            DimsError: ``dims_list`` is not a list, or as ``to_device_mesh`` for an element.
            (and every other error of ``to_device_mesh``)

        Examples:
            >>> import torch.distributed as dist
            >>> from hypergrid import HyperCommGrid
            >>> dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
            >>> grid = HyperCommGrid([1, 1], ["tp", "dp"])
            >>> dp, both = grid.to_device_meshes([["dp"], {"batch": ("dp", "tp")}])
            >>> both is grid.to_device_mesh({"batch": ("dp", "tp")}), dp.mesh_dim_names
            (True, ('dp',))
            >>> grid.destroy(); dist.destroy_process_group()
        """
        if not isinstance(dims_list, (list, tuple)):
            raise DimsError(
                f"to_device_meshes takes a list of mesh dims (each as to_device_mesh takes), got {shown(dims_list)}"
            )
        check_str("to_device_mesh", "device_type", device_type, DEVICE_TYPE, "a device type like 'cpu' or 'cuda'")
        views = self._core.registry.views
        others = [(name, view.layout) for name, view in views.items() if name != self._core.view_name]
        plans = [MeshPlan(self._core.grid.layout, dims, others, space=self._core.view_name) for dims in dims_list]
        require_initialized("to_device_mesh")
        return self._mesh_sources().source(device_type).export(plans)
