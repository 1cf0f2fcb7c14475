"""Worker functions: average_gradients on DTensor parameters (tensor parallel and FSDP2) on 4 gloo ranks.

The mesh is (dp=2, tp=2), dp outer: ranks [[0, 1], [2, 3]], the same groups
as the grid [2, 2] over (tp, dp): tp groups {0, 1} {2, 3}, dp groups {0, 2} {1, 3}.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from hypergrid import HyperCommGrid, HyperGridError


def _gradient(rank: int) -> torch.Tensor:
    return torch.arange(4.0).reshape(2, 2) + 10 * rank


def _outcome(run: Any) -> Any:
    try:
        return run()
    except HyperGridError as error:
        return f"{type(error).__name__}: {error}"


def scenarios() -> dict[str, Any]:
    """Each rank's local shards after average_gradients, or the error it raised."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor, Partial, Replicate, Shard

    rank = dist.get_rank()
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    grid = HyperCommGrid([2, 2], ["tp", "dp"])
    out: dict[str, Any] = {}

    def parameter(submesh: Any, placements: list[Any]) -> torch.nn.Parameter:
        param = torch.nn.Parameter(DTensor.from_local(torch.zeros(2, 2), submesh, placements))
        param.grad = DTensor.from_local(_gradient(rank), submesh, placements)
        return param

    def averaged(param: torch.nn.Parameter, dims: str) -> Any:
        grid.average_gradients([param], dims)
        assert param.grad is not None
        return param.grad.to_local().tolist()

    # Tensor parallel: sharded over tp, replicated over dp: the local shards are averaged over dp.
    out["tp shard, over dp"] = _outcome(lambda: averaged(parameter(mesh["tp"], [Shard(0)]), "dp"))
    out["2-D mesh, replicate dp and shard tp, over dp"] = _outcome(
        lambda: averaged(parameter(mesh, [Replicate(), Shard(0)]), "dp")
    )
    # Sharded over dp (as FSDP2 shards): averaging over dp would mix parts; over tp it is what the user asks.
    out["dp shard, over dp"] = _outcome(lambda: averaged(parameter(mesh, [Shard(0), Replicate()]), "dp"))
    out["dp shard, over tp"] = _outcome(lambda: averaged(parameter(mesh, [Shard(0), Replicate()]), "tp"))
    out["partial"] = _outcome(lambda: averaged(parameter(mesh["tp"], [Partial()]), "dp"))
    # FSDP2 itself: its parameters' gradients are sharded over the dp mesh (and already reduced by it).
    model = torch.nn.Linear(4, 4)
    fully_shard(model, mesh=mesh["dp"])
    model(torch.ones(2, 4)).sum().backward()
    out["fsdp2 over dp"] = _outcome(lambda: grid.average_gradients(model, "dp"))
    grid.destroy()
    return out
