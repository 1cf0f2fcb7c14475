"""``hypergrid.compat.torchtitan`` without torchtitan: the checks, and the meshes in a one-rank world.

The oracle against torchtitan's own ``build_mesh`` (world 8, five configurations) is in tests/frameworks.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from hypergrid import GridSpecError, HyperCommGrid, InvalidArgumentError
from hypergrid.compat.torchtitan import DENSE_DIMS, TitanMeshes

ONES = {"dp_replicate": 1, "dp_shard": 1, "cp": 1, "tp": 1, "pp": 1, "ep": 1, "world_size": 1}


@pytest.mark.parametrize(
    ("change", "error", "match"),
    [
        ({"tp": 0}, InvalidArgumentError, "tp=0"),
        ({"dp_shard": -2}, InvalidArgumentError, "dp_shard=-2"),
        ({"ep": True}, InvalidArgumentError, "ep=True"),
        ({"spmd_backend": "dtensor"}, InvalidArgumentError, "spmd_backend='dtensor'"),
        ({"tp": 2}, GridSpecError, "!= world_size 1"),
        ({"tp": 2, "world_size": 2, "ep": 4}, GridSpecError, "ep=4 must divide"),
        ({"grid": HyperCommGrid([1], ["dp"])}, GridSpecError, "must be"),
    ],
)
def test_bad_degrees_are_refused_before_anything_is_built(change: dict[str, Any], error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        TitanMeshes(**{**ONES, **change})


@pytest.mark.parametrize("backend", ["spmd_types", "full_dtensor", "partial_dtensor"])
def test_the_tables_in_a_one_rank_world(one_rank_world: None, backend: str) -> None:
    meshes = TitanMeshes(**ONES, spmd_backend=backend, device_type="cpu")
    shared = {"pp", "batch", "loss", "dp_replicate", "cp", "tp", "ep", "efsdp"}
    extra = {"spmd_types": {"dp", "dp_shard"}, "full_dtensor": {"dp_shard"}, "partial_dtensor": {"fsdp"}}[backend]
    assert set(meshes.single_axis) == shared | extra
    dense = {"partial_dtensor": ("pp", "dp_replicate", "fsdp", "tp")}.get(backend, tuple(reversed(DENSE_DIMS)))
    assert meshes.global_meshes["dense"].mesh_dim_names == dense
    assert meshes.global_meshes["sparse"].mesh_dim_names == ("pp", "dp_replicate", "efsdp", "ep")
    assert meshes.global_meshes["loss"].mesh_dim_names == ("loss_mesh",)
    roots = {id(mesh._get_root_mesh()) for mesh in [*meshes.single_axis.values(), *meshes.global_meshes.values()]}
    assert roots == {id(meshes.world)}
    again = TitanMeshes(**ONES, spmd_backend=backend, grid=meshes.grid, device_type="cpu")
    assert again.global_meshes["dataloading"] is meshes.global_meshes["dataloading"]  # cached on the grid
    with pytest.raises(InvalidArgumentError, match=r"torchtitan 0\.3's ParallelDims"):
        meshes.install(SimpleNamespace(_world_mesh=None))
    meshes.grid.destroy()
