"""HSDP + tensor parallelism on torchtitan's meshes from one hypergrid grid: 8 CPU processes, equal to one process.

    python examples/torchtitan_hsdp_tp.py [--steps 5]

``hypergrid.compat.torchtitan.TitanMeshes`` gives every mesh torchtitan's ``ParallelDims`` would build
(``dp_replicate 2 x dp_shard 2 x tp 2`` here), all from one grid: no torchtitan needed (with torchtitan,
``hypergrid.compat.torchtitan.build_mesh(parallel_dims)`` puts the same meshes behind its accessors). A
two-layer MLP is split over ``tp`` (column- then row-wise) and sharded by FSDP2 over ``dp_shard``, replicated
over ``dp_replicate`` (HSDP): FSDP concatenates the data-parallel and tensor-parallel meshes, which works
because both derive from the grid's one root mesh. Each of the 4 data-parallel replicas trains on its own
batch; rank 0 then trains the same model in one process on the 4 batches at once and prints the largest
difference between the two sets of weights.
"""

from __future__ import annotations

import argparse
import pathlib
import sys
from typing import Any

import torch
import torch.distributed as dist

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

from hypergrid import spawn
from hypergrid.compat.torchtitan import TitanMeshes

REPLICATE, SHARD, TP, LR = 2, 2, 2, 0.1


def model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.GELU(), torch.nn.Linear(64, 16))


def batch(replica: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The batch of data-parallel replica ``replica`` at ``step`` (the data loader's job)."""
    generator = torch.Generator().manual_seed(1000 * step + replica)
    inputs = torch.randn(8, 16, generator=generator)
    return inputs, torch.sin(inputs)


def train(steps: int) -> dict[str, Any]:
    """One rank's part: the meshes, tensor parallelism, HSDP, ``steps`` SGD steps; the full weights at the end."""
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    meshes = TitanMeshes(
        dp_replicate=REPLICATE, dp_shard=SHARD, cp=1, tp=TP, pp=1, ep=1, world_size=dist.get_world_size(),
        device_type="cpu",
    )  # fmt: skip
    dense = meshes.global_meshes["dense"]  # (pp, dp_replicate, dp_shard, cp, tp)
    tp_mesh, hsdp_mesh = meshes.single_axis["tp"], dense["dp_replicate", "dp_shard"]
    net = parallelize_module(model(), tp_mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
    fully_shard(net, mesh=hsdp_mesh)
    optimizer = torch.optim.SGD(net.parameters(), lr=LR)
    me = meshes.grid.my_coord()
    replica = me.dp_replicate * SHARD + me.dp_shard
    losses = []
    for step in range(steps):
        inputs, targets = batch(replica, step)
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(net(inputs), targets)
        loss.backward()
        optimizer.step()
        losses.append(float(loss))
    weights = {name: param.full_tensor().detach().clone() for name, param in net.named_parameters()}
    groups = len(meshes.grid.communicators())
    meshes.grid.destroy()
    return {"losses": losses, "weights": weights, "groups": groups}


def one_process(steps: int) -> dict[str, torch.Tensor]:
    """The same training in one process: each step on the 4 replicas' batches together."""
    net = model()
    optimizer = torch.optim.SGD(net.parameters(), lr=LR)
    for step in range(steps):
        pairs = [batch(replica, step) for replica in range(REPLICATE * SHARD)]
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(net(torch.cat([x for x, _ in pairs])), torch.cat([y for _, y in pairs])).backward()
        optimizer.step()
    return {name: param.detach().clone() for name, param in net.named_parameters()}


def run(steps: int) -> dict[str, Any]:
    """Train on 8 processes and in one; the largest weight difference between the two, and what rank 0 saw."""
    results = spawn(train, REPLICATE * SHARD * TP, (steps,), timeout_s=300)
    reference = one_process(steps)
    difference = max(
        float((result["weights"][name] - value).abs().max()) for result in results for name, value in reference.items()
    )
    return {"difference": difference, "losses": results[0]["losses"], "groups": results[0]["groups"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=5)
    args = parser.parse_args()
    out = run(args.steps)
    for step, loss in enumerate(out["losses"]):
        print(f"step {step}: loss of rank 0's replica {loss:.6f}")
    print(f"communicators per rank: {out['groups']}")
    print(f"largest difference from one process: {out['difference']:.3g}")


if __name__ == "__main__":
    main()
