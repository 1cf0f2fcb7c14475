"""DeviceMeshes of a grid's own groups, every one deriving from ONE root mesh per grid (and device type).

torch combines meshes only when they derive from one root; here the root is a 1-D mesh named ``"world"`` over the
grid's ranks, and every exported mesh is a layout over it whose dims hold the grid's registered groups.
``GridMesh`` is torch's ``DeviceMesh`` whose slicing keeps the class, whose ``_flatten`` takes the grid's family
and whose ``_unflatten`` splits a dim into the grid's families: docs/toolkit.md ("One root") says what each does
and what a pickled mesh or torch's own ``_concatenate`` gives.

This module imports ``torch.distributed.device_mesh`` (about 1.5 s), so the
grid imports it on the first export only.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed._mesh_layout import _FlatLayout, _MeshLayout
from torch.distributed.device_mesh import DeviceMesh

from hypergrid.binding.registry import PgKey, member_or_none
from hypergrid.errors import DimsError, InvalidArgumentError, RankError
from hypergrid.layout.meshspec import Axis, MeshPlan, Space, axis_signature, family_of_axis
from hypergrid.values import shown

__all__ = ["ROOT_NAME", "GridMesh", "MeshSource", "MeshSources"]

#: The name of the root mesh's one dim: every rank of the grid.
ROOT_NAME = "world"

#: A mesh dim's origin: the factorization (``"base"`` or a view) and its dims, outermost first.
MeshDimOrigin = tuple[str, tuple[str, ...]]


class GridMesh(DeviceMesh):
    """A torch ``DeviceMesh`` whose groups are a grid's; see the module docstring.

    ``_hg_families`` maps each mesh dim name to its family; the root mesh also
    holds ``_hg_source``, the ``MeshSource`` that resolves families to groups.
    """

    _hg_families: dict[str, MeshDimOrigin]
    _hg_source: MeshSource

    def _source(self) -> MeshSource:
        source: MeshSource = self._get_root_mesh()._hg_source  # type: ignore[attr-defined]
        return source

    def _family_of(self, name: str) -> MeshDimOrigin:
        if name in self._hg_families:
            return self._hg_families[name]
        return self._get_root_mesh()._flatten_mapping[name]._hg_families[name]  # type: ignore[attr-defined,no-any-return]

    def _create_sub_mesh(self, layout: _MeshLayout, submesh_dim_names: tuple[str, ...]) -> DeviceMesh:
        submesh = super()._create_sub_mesh(layout, submesh_dim_names)
        return _adopt(submesh, {name: self._family_of(name) for name in submesh_dim_names})

    def _create_flatten_mesh(self, mesh_dim_name: str, backend_override: Any = (None, None)) -> None:
        _refuse_override("_flatten", backend_override)
        root, source = self._get_root_mesh(), self._source()
        if mesh_dim_name in (root.mesh_dim_names or ()):
            raise ValueError(
                f"_flatten: {mesh_dim_name!r} is the name of the root mesh's dim {root.mesh_dim_names}; "
                "give the flattened dim another name"
            )
        layout = _MeshLayout([self._layout.collapse()])
        known = root._flatten_mapping.get(mesh_dim_name)
        if known is not None:
            if known._layout == layout:
                return
            raise ValueError(
                f"_flatten: {mesh_dim_name!r} already names a flattened dim of this grid's meshes with another "
                f"layout ({known._layout}, not {layout}); give the flattened dim another name"
            )
        first = self._family_of(self.mesh_dim_names[0]) if self.mesh_dim_names else None
        family = source.family(_axis_of(layout[0]), first[0] if first else None, "_flatten")
        flat = source.build(layout, {mesh_dim_name: family}, "_flatten", entry=("flat", mesh_dim_name))
        root._flatten_mapping[mesh_dim_name] = flat

    def _create_unflatten_mesh(
        self,
        dim: int,
        mesh_sizes: tuple[int, ...],
        mesh_dim_names: tuple[str, ...],
        backend_override: tuple[Any, ...] = ((None, None),),
    ) -> DeviceMesh:
        for override in backend_override:
            _refuse_override("_unflatten", override)
        inner = _MeshLayout.from_sizes_strides(tuple(mesh_sizes))
        if inner.numel() != self._layout[dim].numel():
            raise ValueError(
                f"_unflatten: sizes {tuple(mesh_sizes)} hold {inner.numel()} ranks, but dim {dim} of this mesh "
                f"has {self._layout[dim].numel()}"
            )
        split = self._layout[dim].composition(inner)
        names = list(self.mesh_dim_names or ())
        owner = self._family_of(names[dim])[0]
        families = {name: self._family_of(name) for name in names if name != names[dim]}
        for name, axis in zip(mesh_dim_names, split):
            families[name] = self._source().family(_axis_of(axis), owner, "_unflatten")
        names[dim : dim + 1] = list(mesh_dim_names)
        layout = self._layout.splice(dim, dim + 1, split)
        return self._source().build(layout, {name: families[name] for name in names}, "_unflatten", entry=None)

    def __reduce_ex__(self, protocol: Any) -> Any:
        """Pickled as a plain ``DeviceMesh``: loading needs torch only."""
        state = {key: value for key, value in self.__getstate__().items() if not key.startswith("_hg_")}
        return object.__new__, (DeviceMesh,), state


def _adopt(mesh: DeviceMesh, families: dict[str, MeshDimOrigin]) -> GridMesh:
    """Make a mesh torch built from a ``GridMesh`` one too (same state, plus its dims' families)."""
    mesh.__class__ = GridMesh
    adopted: GridMesh = mesh  # type: ignore[assignment]
    adopted._hg_families = families
    return adopted


def _refuse_override(call: str, override: Any) -> None:
    if tuple(override) != (None, None):
        raise InvalidArgumentError(
            f"{call}: backend_override={override!r}: a grid's mesh takes its groups from the grid; create the "
            "family with that backend (grid.create_pg(..., backend=..., tag=...)) instead"
        )


def _axis_of(flat: _FlatLayout) -> Axis:
    return tuple((int(size), int(stride)) for size, stride in flat.sizes_and_strides)


class MeshSource:
    """One grid's meshes on one device type: the root, the exported meshes, the groups they hold.

    Args:
        grid: the root grid (a ``HyperCommGrid``; not imported here, which imports this module).
        device_type: the meshes' device type.
    """

    def __init__(self, grid: Any, device_type: str) -> None:
        self.grid = grid
        self.device_type = device_type
        layout = grid.layout
        ranks = torch.arange(layout.rank_offset, layout.rank_offset + layout.size, dtype=torch.int)
        root = GridMesh(
            device_type,
            _layout=_MeshLayout([_FlatLayout((layout.size,), (1,))]),
            _rank_map=ranks,
            mesh_dim_names=(ROOT_NAME,),
            _init_backend=False,
        )
        root._dim_group_names = []  # the grid's all-dims group, once the root itself is exported
        root._hg_families = {ROOT_NAME: ("base", tuple(layout.dim_names[::-1]))}
        root._hg_source = self
        self.root = root
        # Each cached mesh (a request, the root, a flattened dim of the root) and the families it holds.
        self.meshes: dict[Hashable, GridMesh] = {}
        self.holds: dict[Hashable, set[PgKey]] = {}
        # The names of the groups in the root's group registry, by family.
        self.names: dict[PgKey, set[str]] = {}

    def spaces(self, first: str | None) -> list[Space]:
        """Every factorization of the grid's ranks: ``first`` (a view name), then the base, then the views."""
        views = self.grid._core.registry.views
        order = ([first] if first in views else []) + [name for name in views if name != first]
        return [(name, views[name].layout) for name in order]

    def family(self, axis: Axis, first: str | None, call: str) -> MeshDimOrigin:
        """The family whose groups lie along ``axis``, searched from ``first``; ``DimsError`` if none has."""
        found = family_of_axis(self.spaces(first), axis)
        if found is None:
            raise DimsError(
                f"{call}: no family of the grid or its views has the groups of a mesh dim with (size, stride) "
                f"{list(axis)} over ranks {self.grid.rank_offset}.. of the grid {self.grid.shape} "
                f"{self.grid.dim_names}; register a view with such a dim (grid.view(...)) first"
            )
        return found

    def create(self, families: Sequence[MeshDimOrigin]) -> None:
        """Create the families not created yet: one ``create_pgs`` (one guard round) per factorization.

        Collective like ``create_pgs``; every rank sees the same registry, so every rank batches the same.
        """
        grid = self.grid
        missing: dict[str, dict[PgKey, list[str]]] = {}
        scheduled: set[PgKey] = set()
        for view, dims in families:
            key = grid._core.key(list(dims), view, None, None, None)
            if key not in grid._core.registry.groups and key not in scheduled:
                scheduled.add(key)
                missing.setdefault(view, {})[key] = list(dims)
        for view, batch in missing.items():
            grid.create_pgs(list(batch.values()), view=view)

    def _groups(self, families: Sequence[MeshDimOrigin], call: str) -> list[tuple[PgKey, dist.ProcessGroup]]:
        """The caller's group of each family, created on first use (every rank creates before any refuses)."""
        grid = self.grid
        self.create(families)
        keys = [grid._core.key(list(dims), view, None, None, None) for view, dims in families]
        groups = [member_or_none(grid._core.registry.groups[key]) for key in keys]
        if any(group is None for group in groups):
            raise RankError(
                f"{call}: rank {dist.get_rank()} is outside the grid of shape {grid.shape} {grid.dim_names} "
                f"(ranks {grid.rank_offset}..{grid.rank_offset + grid.size - 1}); only the grid's ranks hold its meshes"
            )
        return list(zip(keys, groups))  # type: ignore[arg-type]

    def _register(self, entry: Hashable | None, held: list[tuple[PgKey, dist.ProcessGroup]]) -> None:
        """Put the groups in the root's group registry (torch looks them up there); remember who holds them."""
        for key, group in held:
            self.root._pg_registry[group.group_name] = group
            self.names.setdefault(key, set()).add(group.group_name)
        if entry is not None:
            self.holds[entry] = {key for key, _ in held}

    def build(
        self, layout: _MeshLayout, families: dict[str, MeshDimOrigin], call: str, *, entry: Hashable | None
    ) -> GridMesh:
        """A mesh over the root with ``layout``, whose dims hold the groups of ``families`` (in mesh order)."""
        held = self._groups(list(families.values()), call)
        mesh = GridMesh(
            self.device_type,
            _layout=layout,
            _rank_map=self.root._rank_map,
            mesh_dim_names=tuple(families),
            _root_mesh=self.root,
            _init_backend=False,
        )
        mesh._dim_group_names = [group.group_name for _, group in held]
        mesh._hg_families = dict(families)
        self._register(entry, held)
        return mesh

    def export(self, plans: Sequence[MeshPlan]) -> list[GridMesh]:
        """The mesh of each plan, built on the first request and the same object afterwards.

        The families of every new mesh are created first, together (``create``).
        """
        new = [plan for plan in plans if _request(plan) not in self.meshes]
        self.create([family for plan in new for family in zip(plan.spaces, plan.members)])
        return [self._export(plan) for plan in plans]

    def _export(self, plan: MeshPlan) -> GridMesh:
        request = _request(plan)
        if request in self.meshes:
            return self.meshes[request]
        families = dict(zip(plan.names, zip(plan.spaces, plan.members)))
        if plan.names == (ROOT_NAME,) and axis_signature(self.grid.layout, plan.axes[0]).group_size == self.grid.size:
            mesh = self._root_itself(families[ROOT_NAME])
        else:
            layout = _MeshLayout([_FlatLayout(*zip(*axis)) for axis in plan.axes])
            mesh = self.build(layout, families, "to_device_mesh", entry=request)
        self.meshes[request] = mesh
        return mesh

    def _root_itself(self, family: MeshDimOrigin) -> GridMesh:
        """The root mesh, its one dim holding the grid's all-dims group (the default group for a whole world)."""
        held = self._groups([family], "to_device_mesh")
        root = self.root
        root._dim_group_names = [group.group_name for _, group in held]
        root._hg_families = {ROOT_NAME: family}
        self._register(ROOT_NAME, held)
        return root

    def released(self, keys: set[Hashable]) -> None:
        """Forget every mesh (and flattened dim) that holds a group of a released family."""
        root = self.root
        for key in keys & self.names.keys():
            for name in self.names.pop(key):  # type: ignore[call-overload]
                root._pg_registry.pop(name, None)
        for entry, held in list(self.holds.items()):
            if held.isdisjoint(keys):
                continue
            del self.holds[entry]
            self.meshes.pop(entry, None)
            if entry == ROOT_NAME:
                root._dim_group_names = []
            elif isinstance(entry, tuple) and entry[0] == "flat":
                root._flatten_mapping.pop(entry[1], None)

    @property
    def empty(self) -> bool:
        return not self.holds


def _request(plan: MeshPlan) -> Hashable:
    """What identifies an export: each mesh dim's name, factorization and dims."""
    return tuple(zip(plan.names, plan.spaces, plan.members))


class MeshSources:
    """A grid's ``MeshSource`` per device type, forgotten with the families they hold (``destroy``).

    Registered once with the grid's group pool, which reports every release.
    """

    def __init__(self, grid: Any) -> None:
        self.grid = grid
        self.by_device: dict[str, MeshSource] = {}
        grid._core.registry.pool.on_release(self.released)

    def source(self, device_type: str) -> MeshSource:
        if not isinstance(device_type, str) or not device_type:
            raise InvalidArgumentError(
                f"to_device_mesh: device_type must be a str like 'cpu' or 'cuda', got {shown(device_type)}"
            )
        if device_type not in self.by_device:
            self.by_device[device_type] = MeshSource(self.grid, device_type)
        return self.by_device[device_type]

    def released(self, keys: Iterable[Hashable]) -> None:
        gone = set(keys)
        for device_type, source in list(self.by_device.items()):
            source.released(gone)
            if source.empty:
                del self.by_device[device_type]
