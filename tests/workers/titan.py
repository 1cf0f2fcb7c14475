"""Workers of the torchtitan tier: hypergrid's meshes against torchtitan's own ``ParallelDims.build_mesh``.

torchtitan 0.3 needs two patches to build its meshes on CPU, both here and marked ``USER-SIDE CPU PATCH``:
its ``device_type`` falls back to ``"cuda"`` without a GPU, and its size-1 axes use torch's ``"fake"`` backend,
which torch registers only when ``torch.testing._internal.distributed.fake_pg`` is imported.
"""

from __future__ import annotations

from typing import Any

import torch.distributed as dist

WORLD = 8
# torchtitan's degrees at world 8: dense HSDP + TP, context parallel, pipeline, expert parallel 2 and 4.
CONFIGS: dict[str, dict[str, int]] = {
    "dense": {"dp_replicate": 2, "dp_shard": 2, "cp": 1, "tp": 2, "pp": 1, "ep": 1},
    "cp2": {"dp_replicate": 1, "dp_shard": 2, "cp": 2, "tp": 2, "pp": 1, "ep": 1},
    "pp2": {"dp_replicate": 1, "dp_shard": 2, "cp": 1, "tp": 2, "pp": 2, "ep": 1},
    "ep2": {"dp_replicate": 2, "dp_shard": 2, "cp": 1, "tp": 2, "pp": 1, "ep": 2},
    "ep4": {"dp_replicate": 1, "dp_shard": 4, "cp": 1, "tp": 2, "pp": 1, "ep": 4},
}
BACKENDS = ("spmd_types", "full_dtensor", "partial_dtensor")


def patch_torchtitan_for_cpu() -> None:
    """USER-SIDE CPU PATCH (not hypergrid's code): what torchtitan 0.3's own build_mesh needs on a CPU box."""
    import torch.testing._internal.distributed.fake_pg  # noqa: F401  # registers the "fake" backend
    import torchtitan.distributed.parallel_dims as parallel_dims

    parallel_dims.device_type = "cpu"  # torchtitan.tools.utils.device_type is "cuda" when no GPU is found


def describe(mesh: Any) -> tuple[Any, ...] | None:
    """What a mesh is on this rank: dim names, the ranks of its mesh, the ranks of each dim's group."""
    if mesh is None:
        return None
    groups = [dist.get_process_group_ranks(mesh.get_group(i)) for i in range(mesh.ndim)]
    return mesh.mesh_dim_names, mesh.mesh.tolist(), groups


def everything(parallel_dims: Any) -> dict[str, Any]:
    """Every mesh a ParallelDims gives out, through torchtitan's own accessors."""
    out: dict[str, Any] = {"world": describe(parallel_dims.world_mesh)}
    out.update({f"global:{key}": describe(mesh) for key, mesh in parallel_dims._global_meshes.items()})
    out.update({f"axis:{key}": describe(mesh) for key, mesh in parallel_dims._single_axis_meshes.items()})
    out["spmd"] = [describe(mesh) for mesh in parallel_dims.spmd_meshes()]
    out["one_dimensional"] = sorted(parallel_dims.get_all_one_dimensional_meshes())
    for axes in (["dp_replicate", "fsdp"], ["dp_replicate", "dp_shard"], ["batch", "cp"], ["dp_replicate", "efsdp"]):
        try:
            out["optional:" + "-".join(axes)] = describe(parallel_dims.get_optional_mesh(axes))
        except (ValueError, KeyError) as error:
            out["optional:" + "-".join(axes)] = type(error).__name__
    return out


def oracle(backends: tuple[str, ...]) -> dict[str, Any]:
    """torchtitan's meshes and hypergrid's, for every configuration and spmd backend, on this rank."""
    patch_torchtitan_for_cpu()
    from torchtitan.distributed.parallel_dims import ParallelDims

    from hypergrid.compat.torchtitan import build_mesh

    out: dict[str, Any] = {}
    for name, degrees in CONFIGS.items():
        for backend in backends:
            theirs = ParallelDims(**degrees, world_size=WORLD, spmd_backend=backend)
            theirs.build_mesh()
            ours = ParallelDims(**degrees, world_size=WORLD, spmd_backend=backend)
            world = build_mesh(ours, device_type="cpu")
            roots = {id(mesh._get_root_mesh()) for mesh in ours._single_axis_meshes.values()}
            out[f"{name}/{backend}"] = {
                "theirs": everything(theirs),
                "ours": everything(ours),
                "one_root": roots == {id(world)},
                "world_is_default": world.get_group() is dist.group.WORLD,
            }
            world._hg_source.grid.destroy()
    return out
