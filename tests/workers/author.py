"""Spawned-rank scenarios of a framework author's day: big results, hangs, coordinates, gradients, pipelines.

Workers return raw results; the tests compute what to expect independently.
"""

from __future__ import annotations

import threading
from typing import Any

import torch
import torch.distributed as dist

from hypergrid import HyperCommGrid

MIB_FLOATS = 2**20 // 4  # float32 elements in 1 MiB


def tensor_for(rank: int, index: int) -> torch.Tensor:
    """The ``index``-th 1 MiB tensor rank ``rank`` returns: values unique to both."""
    return torch.arange(MIB_FLOATS, dtype=torch.float32) + 1e6 * rank + 1e4 * index


def eight_tensors() -> dict[str, torch.Tensor]:
    """Eight 1 MiB tensors, the return value that used to get lost in ``spawn``."""
    return {f"t{index}": tensor_for(dist.get_rank(), index) for index in range(8)}


def unpicklable_on(bad_rank: int) -> Any:
    """A lock (pickle refuses it) on ``bad_rank``, a number elsewhere."""
    return threading.Lock() if dist.get_rank() == bad_rank else dist.get_rank()


def deadlock() -> None:
    """The naive pipeline exchange, deadlocked on purpose: both ranks send first (gloo's send waits for the recv)."""
    outgoing, incoming = torch.ones(4), torch.zeros(4)
    if dist.get_rank() == 0:
        dist.send(outgoing, dst=1)  # stage 0 sends its activation forward
    else:
        dist.send(outgoing, dst=0)  # stage 1 sends its gradient back
    dist.recv(incoming, src=1 - dist.get_rank())


def coordinates() -> dict[str, Any]:
    """This rank's coordinates, as returned and as every rank sees them through ``all_gather_object``."""
    grid = HyperCommGrid([2, 2], ["tp", "dp"])
    mine = grid.my_coord()
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, mine)
    return {"mine": mine, "gathered": gathered, "type_is_shared": all(type(c) is type(mine) for c in gathered)}


def build_model() -> torch.nn.Module:
    """The model of the averaging test (seeded): float32 and float64 layers, a tied weight, a frozen bias."""
    torch.manual_seed(0)
    model = torch.nn.ModuleDict(
        {
            "embed": torch.nn.Linear(6, 8),
            "hidden": torch.nn.Linear(8, 8),
            "skip": torch.nn.Linear(6, 8, bias=False),
            "float64": torch.nn.Linear(8, 1).double(),
            "unused": torch.nn.Linear(3, 3),  # never in the forward: no gradient, skipped
        }
    )
    model["skip"].weight = model["embed"].weight  # tied: one parameter, two uses
    model["hidden"].bias.requires_grad_(False)
    return model


def model_loss(model: torch.nn.Module, batch: torch.Tensor) -> torch.Tensor:
    out = torch.tanh(model["hidden"](model["embed"](batch))) + model["skip"](batch)
    return (model["float64"](out.double()).square().mean() + out.square().mean()).float()


def averaged_gradients(bucket_mb: float) -> dict[str, Any]:
    """Each dp coordinate of a [2, 4] tp x dp grid takes its quarter of a batch; gradients averaged over dp."""
    grid = HyperCommGrid([2, 4], ["tp", "dp"])
    model = build_model()
    batch = torch.randn(16, 6)  # seeded: the same batch everywhere
    mine = batch.chunk(4)[grid.group_rank("dp")]
    model_loss(model, mine).backward()
    grid.average_gradients(model, "dp", bucket_mb=bucket_mb)
    grads = {name: None if p.grad is None else p.grad.clone() for name, p in model.named_parameters()}
    grid.destroy()
    return grads


def crossing_exchange(numel: int) -> dict[str, Any]:
    """Two stages send to each other in the same step (activation forward, gradient back), plus edge arguments."""
    grid = HyperCommGrid([2], ["pp"])
    rank = dist.get_rank()
    outgoing = torch.full((numel,), float(rank + 1))
    incoming = torch.zeros(numel)
    untouched = torch.full((3,), -1.0)
    if grid.is_first("pp"):  # recv_prev / send_prev beyond the first stage: ignored
        grid.exchange("pp", send_next=outgoing, recv_next=incoming, recv_prev=untouched, send_prev=outgoing)
    else:  # send_next / recv_next beyond the last stage: ignored
        grid.exchange("pp", send_prev=outgoing, recv_prev=incoming, recv_next=untouched, send_next=outgoing)
    grid.destroy()
    return {"incoming": incoming.unique().tolist(), "untouched": untouched.tolist()}
