"""Spawned-rank scenarios for DeviceMesh export: one root per grid, cached meshes, flatten, size-1 and world groups.

A torchtitan-like grid at world 8: ``tp 2 x cp 1 x dp_shard 2 x dp_replicate 2 x pp 1`` (innermost first), with
an expert view ``ep 4 x efsdp 1 x dp_replicate 2 x pp 1``. Training runs compare FSDP2 + tensor parallelism on
the grid's meshes against the same run on torch's own ``init_device_mesh`` meshes. Workers return raw results;
the tests decide what to expect.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

from hypergrid import HyperCommGrid, HyperGridError

SHAPE, DIMS = [2, 1, 2, 2, 1], ["tp", "cp", "dp_shard", "dp_replicate", "pp"]
EXPERT_SHAPE, EXPERT_DIMS = [4, 1, 2, 1], ["ep", "efsdp", "dp_replicate", "pp"]
STEPS = 3


def _held_groups() -> int:
    return len(c10d._world.pg_map)


def _ranks(mesh: Any) -> list[int]:
    return [int(r) for r in mesh.mesh.flatten().tolist()]


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 16))


def batch(index: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The inputs and targets of data-parallel replica ``index`` (the same on its tensor-parallel ranks)."""
    generator = torch.Generator().manual_seed(100 + index)
    return torch.randn(4, 16, generator=generator), torch.randn(4, 16, generator=generator)


def train(dp_mesh: Any, tp_mesh: Any, dp_index: int) -> dict[str, Any]:
    """FSDP2 over ``dp_mesh`` (1-D: FSDP, 2-D: HSDP) after tensor parallelism over ``tp_mesh``; SGD, 3 steps."""
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    model = parallelize_module(_model(), tp_mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
    fully_shard(model, mesh=dp_mesh)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    inputs, targets = batch(dp_index)
    losses = []
    for _ in range(STEPS):
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(inputs), targets)
        loss.backward()
        optimizer.step()
        losses.append(loss.detach().clone())
    params = {name: param.full_tensor().detach().clone() for name, param in model.named_parameters()}
    return {"losses": losses, "params": params}


def single_process_reference(replicas: int) -> dict[str, Any]:
    """The same model trained in one process on every replica's batch at once (the global mean loss)."""
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    inputs = torch.cat([batch(i)[0] for i in range(replicas)])
    targets = torch.cat([batch(i)[1] for i in range(replicas)])
    for _ in range(STEPS):
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(inputs), targets).backward()
        optimizer.step()
    return {name: param.detach().clone() for name, param in model.named_parameters()}


def mesh_scenarios() -> dict[str, Any]:
    """Every property of the export on one grid, then the training comparisons."""
    from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

    rank = dist.get_rank()
    grid = HyperCommGrid(SHAPE, DIMS)
    expert = grid.view(EXPERT_SHAPE, EXPERT_DIMS, name="expert")
    out: dict[str, Any] = {"rank": rank}

    # Named combined dims, and the same object for the same request.
    named = grid.to_device_mesh({"batch": ("dp_replicate", "dp_shard"), "tp": "tp"})
    out["named"] = (named.mesh_dim_names, named.mesh.tolist())
    out["named_again_same"] = named is grid.to_device_mesh({"batch": ("dp_replicate", "dp_shard"), "tp": "tp"})
    out["named_batch_is_family"] = named.get_group("batch") is grid.get_pg(["dp_replicate", "dp_shard"])

    # One root: separate exports, a view's mesh, slices and flattened meshes all derive from it.
    dp = grid.to_device_mesh(["dp_replicate", "dp_shard"])
    tp = grid.to_device_mesh(["tp"])
    sparse = grid.to_device_mesh(["pp", "dp_replicate", "efsdp", "ep"])
    from_view = expert.to_device_mesh(["dp_replicate", "ep"])
    root = dp._get_root_mesh()
    out["root"] = (root.mesh_dim_names, _ranks(root))
    sliced = named["tp"]
    out["one_root"] = [m._get_root_mesh() is root for m in (tp, named, sparse, from_view, sliced)]
    out["sparse"] = (sparse.mesh_dim_names, sparse.mesh.tolist())
    out["sparse_groups"] = (
        sparse.get_group("ep") is grid.get_pg("ep", view="expert"),
        sparse.get_group("dp_replicate") is grid.get_pg("dp_replicate"),
        dist.get_process_group_ranks(sparse.get_group("ep")),
    )
    try:
        joined = DeviceMesh._concatenate([dp, tp])
        out["concatenated"] = (joined.mesh_dim_names, joined.mesh.tolist())
    except RuntimeError as error:
        out["concatenated"] = str(error)

    # Flattening resolves to the grid's registered family: no torch group made.
    before = _held_groups()
    flat = dp._flatten()
    out["flat"] = (flat.mesh_dim_names, _ranks(flat), flat._get_root_mesh() is root)
    out["flat_is_family"] = flat.get_group() is grid.get_pg(["dp_replicate", "dp_shard"])
    # efsdp has size 1: the flattened dim has dp_replicate's groups, and takes that family's group.
    out["flat_sparse_is_family"] = sparse["dp_replicate", "efsdp"]._flatten().get_group() is grid.get_pg("dp_replicate")
    out["new_groups_from_flatten"] = _held_groups() - before
    try:
        named["tp"]._flatten("dp_replicate_dp_shard")  # a name taken by another layout
        out["flatten_name_taken"] = "accepted"
    except ValueError as error:
        out["flatten_name_taken"] = "another layout" in str(error)
    unflat = grid.to_device_mesh({"world": ("pp", "dp_replicate", "dp_shard", "cp", "tp")})
    split = unflat._unflatten(0, (2, 4), ("dp_replicate", "rest"))
    out["unflatten"] = (
        split.mesh_dim_names,
        split.mesh.tolist(),
        split.get_group("dp_replicate") is grid.pg("dp_replicate"),
        split._get_root_mesh() is root,
    )
    out["unflatten_rest_ranks"] = dist.get_process_group_ranks(split.get_group("rest"))
    other = HyperCommGrid([2, 4], ["tp", "dp"])  # no family of 4 consecutive ranks: that split is refused
    try:
        other.to_device_mesh({"world": ("dp", "tp")})._unflatten(0, (2, 4), ("a", "b"))
        out["unflatten_refused"] = "accepted"
    except HyperGridError as error:
        out["unflatten_refused"] = type(error).__name__
    other.destroy()

    # Size-1 dims hold no real communicator; the all-dims family of a whole-world grid is the default group.
    ones = grid.to_device_mesh(["pp", "cp"])
    out["size1_backends"] = [dist.get_backend(group) for group in ones.get_all_groups()]
    out["world_is_default"] = (unflat is root, unflat.get_group() is dist.group.WORLD)
    out["real_groups"] = sorted(
        (c["size"], c["backend"]) for c in grid.communicators() if c["backend"] != "fake" and c["size"] > 1
    )
    out["one_rank_real_groups"] = [c["keys"] for c in grid.communicators() if c["size"] == 1 and c["backend"] != "fake"]

    # Pickling gives a plain DeviceMesh that knows nothing of hypergrid.
    import pickle

    loaded = pickle.loads(pickle.dumps(named))
    out["pickled"] = (type(loaded).__name__, loaded.mesh_dim_names, loaded.mesh.tolist())

    # Training: HSDP + TP on separate exports, and FSDP over a named combined dim + TP, against torch's meshes.
    coords = grid.coord_of(rank)
    dp_index = coords.dp_replicate * 2 + coords.dp_shard
    torch_mesh = init_device_mesh("cpu", (2, 2, 2), mesh_dim_names=("dp_replicate", "dp_shard", "tp"))
    out["torch_mesh"] = torch_mesh.mesh.tolist()
    out["hsdp_grid"] = train(dp, tp, dp_index)
    out["hsdp_torch"] = train(torch_mesh["dp_replicate", "dp_shard"], torch_mesh["tp"], dp_index)
    out["fsdp_grid"] = train(named["batch"], named["tp"], dp_index)
    out["fsdp_torch"] = train(torch_mesh["dp_replicate", "dp_shard"]._flatten("batch"), torch_mesh["tp"], dp_index)
    out["reference"] = single_process_reference(4) if rank == 0 else None

    # destroy() forgets the meshes: a new request builds a new mesh on a new root.
    grid.destroy()
    after = grid.to_device_mesh({"batch": ("dp_replicate", "dp_shard"), "tp": "tp"})
    out["after_destroy"] = (after is not named, after._get_root_mesh() is not root, after.mesh.tolist())
    grid.destroy()
    out["sources_left"] = len(grid._core.registry.device_meshes.by_device)
    return out


def subgrid_scenarios() -> dict[str, Any]:
    """A grid over ranks 2..5 of 8: members get meshes of its ranks; the others take part, then get RankError."""
    grid = HyperCommGrid([2, 2], ["tp", "dp"], rank_offset=2)
    out: dict[str, Any] = {}
    try:
        mesh = grid.to_device_mesh({"all": ("dp", "tp")})
        out["mesh"] = (mesh.mesh.tolist(), _ranks(mesh._get_root_mesh()), dist.get_backend(mesh.get_group()))
    except HyperGridError as error:
        out["mesh"] = type(error).__name__
    check = torch.ones(1)
    dist.all_reduce(check)
    out["world_after"] = check.item()
    grid.destroy()
    return out


def size1_fsdp_scenario() -> dict[str, Any]:
    """FSDP2 with a mixed-precision policy over a size-1 data-parallel dim (a fake-backend group) + TP over 2.

    torchtitan keeps a real group under FSDP at degree 1 so that the policy applies; here the run on the grid's
    fake group is compared with the same run on torch's ``init_device_mesh`` (a real one-rank group).
    """
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    def run(dp_mesh: Any, tp_mesh: Any) -> dict[str, Any]:
        model = parallelize_module(_model(), tp_mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
        policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        fully_shard(model, mesh=dp_mesh, mp_policy=policy)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        inputs, targets = batch(0)
        losses = []
        for _ in range(STEPS):
            optimizer.zero_grad()
            loss = torch.nn.functional.mse_loss(model(inputs).float(), targets)
            loss.backward()
            optimizer.step()
            losses.append(loss.detach().clone())
        return {"losses": losses, "params": {n: p.full_tensor().detach().clone() for n, p in model.named_parameters()}}

    grid = HyperCommGrid([2, 1], ["tp", "dp"])
    dp = grid.to_device_mesh(["dp"])
    out = {"backend": dist.get_backend(dp.get_group()), "grid": run(dp, grid.to_device_mesh(["tp"]))}
    torch_mesh = init_device_mesh("cpu", (1, 2), mesh_dim_names=("dp", "tp"))
    out["torch"] = run(torch_mesh["dp"], torch_mesh["tp"])
    grid.destroy()
    return out
