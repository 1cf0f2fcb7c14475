"""Worker functions for ``hypergrid.Bridge`` (spawned gloo processes, module level).

Every rank builds every case's grids and bridge (so that ordinals agree); the
boundary ranks move a deterministic global tensor (``arange``) forward and a
second one (its negation plus 0.5) back, and report what they received. The
test compares with its own slicing of the same global tensors.
"""

from __future__ import annotations

import os
import time
from typing import Any

import torch
import torch.distributed as dist

from hypergrid import Bridge, HyperCommGrid, HyperGridError
from hypergrid.layout.bridge_plan import boundary_ranks, held_slice

#: name -> (src (shape, names, offset), dst (shape, names, offset), global shape, batch_dim, seq_dim, dtype)
CASES: dict[str, tuple[Any, ...]] = {
    "dp 2 -> 3, tp copies": (([2, 2], ["tp", "dp"], 0), ([3], ["dp"], 4), (6, 5), 0, None, torch.float32),
    "same ranks, cp-sharded sequence": (
        ([2, 2, 2], ["tp", "cp", "dp"], 0),
        ([4, 2], ["dp", "cp"], 0),
        (8, 12, 3),
        0,
        1,
        torch.bfloat16,
    ),
    "pp on both, batch_dim 1": (([2, 2], ["tp", "pp"], 0), ([2, 2], ["dp", "pp"], 4), (3, 4), 1, None, torch.float64),
    "overlapping dp 8 -> tp2 dp4, int": (
        ([1, 8], ["tp", "dp"], 0),
        ([2, 4], ["tp", "dp"], 0),
        (16, 2),
        0,
        None,
        torch.int64,
    ),
    "cp copies, offset overlap": (([2, 2], ["cp", "dp"], 2), ([2, 3], ["cp", "dp"], 0), (6, 4), 0, None, torch.float32),
}


def global_tensors(shape: tuple[int, ...], dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """The activation and the gradient of a case, the same on every process."""
    numel = 1
    for size in shape:
        numel *= size
    activation = torch.arange(numel, dtype=torch.float64).reshape(shape)
    return activation.to(dtype), (0.5 - activation).to(dtype if dtype.is_floating_point else torch.float32)


def local_slice(
    tensor: torch.Tensor, grid: HyperCommGrid, rank: int, batch_dim: int, seq_dim: int | None
) -> torch.Tensor:
    seq = None if seq_dim is None else tensor.shape[seq_dim]
    rows, positions = held_slice(grid.layout, rank, tensor.shape[batch_dim], seq)
    out = tensor.narrow(batch_dim, rows[0], rows[1] - rows[0])
    if seq_dim is not None and positions is not None:
        out = out.narrow(seq_dim, positions[0], positions[1] - positions[0])
    return out.clone()


def _grid(spec: tuple[list[int], list[str], int], **kwargs: Any) -> HyperCommGrid:
    return HyperCommGrid(spec[0], spec[1], spec[2], guard_timeout_s=60, **kwargs)


def _one_way(
    send: Any,
    recv: Any,
    sending: bool,
    receiving: bool,
    tensor: torch.Tensor,
    grid: HyperCommGrid,
    rank: int,
    case: Any,
) -> torch.Tensor | None:
    """One direction of a case on ``rank``: send its slice (and get its own, on both sides), or receive."""
    if sending:
        got = send(local_slice(tensor, grid, rank, case[3], case[4]))
        return got if receiving else None
    return recv() if receiving else None


def run_case(name: str, case: tuple[Any, ...], rank: int) -> dict[str, Any]:
    src_spec, dst_spec, shape, batch_dim, seq_dim, dtype = case
    src, dst = _grid(src_spec), _grid(dst_spec)
    bridge = Bridge(src, dst, batch_dim=batch_dim, seq_dim=seq_dim)
    activation, grad = global_tensors(shape, dtype)
    sender = rank in boundary_ranks(src.layout, "last")
    receiver = rank in boundary_ranks(dst.layout, "first")
    out: dict[str, Any] = {}
    forward = _one_way(bridge.send_forward, bridge.recv_forward, sender, receiver, activation, src, rank, case)
    backward = _one_way(bridge.send_backward, bridge.recv_backward, receiver, sender, grad, dst, rank, case)
    out.update({key: got for key, got in (("forward", forward), ("backward", backward)) if got is not None})
    bridge.destroy()
    return out


def pipelined(rank: int) -> dict[str, Any]:
    """Three micro-batches through the combined calls: src dp4 on ranks 0-3 -> dst tp2 dp2 on ranks 4-7."""
    src, dst = _grid(([4], ["dp"], 0)), _grid(([2, 2], ["tp", "dp"], 4))
    bridge = Bridge(src, dst)
    xs = [torch.arange(8.0).reshape(8, 1) * (k + 1) for k in range(3)]
    out: dict[str, Any] = {}
    if rank < 4:
        mine = [x[2 * rank : 2 * rank + 2] for x in xs]
        bridge.send_forward(mine[0])
        grads = [bridge.send_forward_recv_backward(mine[1]), bridge.send_forward_recv_backward(mine[2])]
        grads.append(bridge.recv_backward())
        out["grads"] = grads
    else:
        got = [bridge.recv_forward()]
        got.append(bridge.send_backward_recv_forward(-got[0]))
        got.append(bridge.send_backward_recv_forward(-got[1]))
        bridge.send_backward(-got[2])
        out["activations"] = got
    bridge.destroy()
    return out


def variable_and_checked(rank: int) -> dict[str, Any]:
    """Shapes that change (variable_shapes) on ranks 0-3; then a checked bridge where rank 0 sends a wrong shape."""
    out: dict[str, Any] = {}
    src, dst = _grid(([2], ["dp"], 0)), _grid(([2], ["dp"], 2))
    bridge = Bridge(src, dst, variable_shapes=True)
    for rows in (2, 3):
        if rank < 2:
            bridge.send_forward(torch.full((rows, 2), float(rank)))
        elif rank < 4:
            out[f"rows {rows}"] = bridge.recv_forward()
    bridge.destroy()
    checked_src = _grid(([2], ["dp"], 0), check_collectives=True)
    checked = Bridge(checked_src, _grid(([2], ["dp"], 2)))
    for step in (0, 1):
        try:
            if rank < 2:
                rows = 3 if (step == 1 and rank == 0) else 2
                checked.send_forward(torch.ones(rows, 2))
            elif rank < 4:
                checked.recv_forward()
            out[f"checked {step}"] = None
        except HyperGridError as error:
            out[f"checked {step}"] = (type(error).__name__, str(error))
    return out


def desync(rank: int) -> dict[str, Any]:
    """Rank 3 builds the bridge with another batch_dim: every participant raises before any data moves."""
    src, dst = _grid(([2], ["dp"], 0)), _grid(([2], ["dp"], 2))
    bridge = Bridge(src, dst, batch_dim=1 if rank == 3 else 0)
    try:
        if rank < 2:
            bridge.send_forward(torch.ones(2, 2))
        elif rank < 4:
            bridge.recv_forward()
    except HyperGridError as error:
        return {"desync": (type(error).__name__, str(error))}
    return {"desync": None}


def everything() -> dict[str, Any]:
    """Every case on 8 ranks, in one spawn."""
    rank = dist.get_rank()
    out: dict[str, Any] = {name: run_case(name, case, rank) for name, case in CASES.items()}
    out["pipelined"] = pipelined(rank)
    out["variable and checked"] = variable_and_checked(rank)
    out["desync"] = desync(rank)
    return out


def a_death() -> dict[str, Any]:
    """4 ranks: src dp2 (0, 1) -> dst dp2 (2, 3); after one transfer rank 3 exits; the survivors transfer again."""
    rank = dist.get_rank()
    bridge = Bridge(_grid(([2], ["dp"], 0)), _grid(([2], ["dp"], 2)))
    x = torch.ones(2, 3)
    bridge.send_forward(x) if rank < 2 else bridge.recv_forward()
    dist.barrier()
    if rank == 3:
        os._exit(1)
    started = time.monotonic()
    try:
        bridge.send_forward(x) if rank < 2 else bridge.recv_forward()
        seen: Any = None
    except HyperGridError as error:
        seen = type(error).__name__
    return {"error": seen, "seconds": time.monotonic() - started}
