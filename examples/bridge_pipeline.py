"""An encoder on tp1 x dp3 feeding a decoder on tp2 x dp2, 7 local CPU processes, through ``hypergrid.Bridge``.

    python examples/bridge_pipeline.py [--steps 3]

Ranks 0-2 run the encoder (``Linear(8, 16)`` and ``tanh``), each on a third of
the global batch of 12 samples; ranks 3-6 run the decoder, a ``Linear(16, 4)``
whose output features are split over ``tp`` (2 per rank), each ``dp`` replica
on half of the batch. Megatron-Core's ``BridgeCommunicator`` refuses this pair
(dp 3 and dp 2 do not divide one another); the bridge sends each decoder rank
its 6 rows straight from the two encoder ranks that hold them, and each encoder
rank its gradient rows back. Each replica's loss is its share of the global
loss (its rows' squared errors over the global batch), so both parts sum their
gradients over ``dp``, whatever the two dp sizes (docs/bridge.md's gradient
rule), and take ``--steps`` SGD steps. Rank 0 compares the trained weights with the
same model trained in one process and prints the result; the exit code is 1
if they differ.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import torch
import torch.distributed as dist

import hypergrid
from hypergrid import autograd

BATCH, FEATURES, HIDDEN, OUT, LR = 12, 8, 16, 4, 0.1


def data(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The global batch of a step, the same on every rank."""
    generator = torch.Generator().manual_seed(100 + step)
    return torch.randn(BATCH, FEATURES, generator=generator), torch.randn(BATCH, OUT, generator=generator)


def models() -> tuple[torch.nn.Linear, torch.nn.Linear]:
    """The encoder's and the decoder's layers, initialized the same way on every rank."""
    torch.manual_seed(0)
    return torch.nn.Linear(FEATURES, HIDDEN), torch.nn.Linear(HIDDEN, OUT)


def one_process(steps: int) -> tuple[torch.nn.Linear, torch.nn.Linear, list[float]]:
    """The reference: the whole model on the whole batch."""
    encoder, decoder = models()
    losses = []
    for step in range(steps):
        x, y = data(step)
        loss = (decoder(torch.tanh(encoder(x))) - y).square().sum() / BATCH
        loss.backward()
        losses.append(loss.item())
        with torch.no_grad():
            for p in [*encoder.parameters(), *decoder.parameters()]:
                p -= LR * p.grad  # type: ignore[operator]
                p.grad = None
    return encoder, decoder, losses


def worker(steps: int) -> dict[str, Any]:
    """One rank's part; returns its parameters after training (and, on the decoder, the losses)."""
    rank = dist.get_rank()
    encoder_grid = hypergrid.HyperCommGrid([1, 3], ["tp", "dp"])
    decoder_grid = hypergrid.HyperCommGrid([2, 2], ["tp", "dp"], rank_offset=3)
    encoder_grid.create_pgs(["dp"])  # group creation is collective over the world: every rank creates both grids'
    decoder_grid.create_pgs(["tp", "dp", "tp-dp"])
    bridge = hypergrid.Bridge(encoder_grid, decoder_grid)
    encoder, decoder = models()
    if rank < 3:
        part: torch.nn.Module = encoder
        grid = encoder_grid
    else:
        grid, tp = decoder_grid, decoder_grid.my_coord().tp
        columns = slice(tp * OUT // 2, (tp + 1) * OUT // 2)
        part = torch.nn.Linear(HIDDEN, OUT // 2)
        with torch.no_grad():
            part.weight.copy_(decoder.weight[columns])
            part.bias.copy_(decoder.bias[columns])
    dp, rows = grid.my_coord().dp, BATCH // grid.group_size("dp")
    losses = []
    for step in range(steps):
        x, y = data(step)
        mine = slice(dp * rows, (dp + 1) * rows)
        if rank < 3:
            hidden = torch.tanh(encoder(x[mine]))
            bridge.send_forward(hidden.detach())
            hidden.backward(bridge.recv_backward())
        else:
            hidden = bridge.recv_forward().requires_grad_()
            inputs = autograd.copy_to(hidden, grid, "tp")  # the input's gradient is summed over tp in backward
            loss = (part(inputs) - y[mine, columns]).square().sum() / BATCH
            loss.backward()
            bridge.send_backward(hidden.grad)  # type: ignore[arg-type]
            total = loss.detach().reshape(1)
            grid.all_reduce(total, "tp-dp")
            losses.append(total.item())
        for p in part.parameters():
            grid.all_reduce(p.grad, "dp")  # type: ignore[arg-type]
            with torch.no_grad():
                p -= LR * p.grad  # type: ignore[operator]
            p.grad = None
    bridge.destroy()
    encoder_grid.destroy()
    decoder_grid.destroy()
    return {"params": {name: p.detach() for name, p in part.named_parameters()}, "losses": losses}


def compare(results: list[dict[str, Any]], steps: int) -> tuple[bool, list[float], list[float]]:
    """Whether the ranks' weights equal one process's after ``steps`` steps; the two loss curves."""
    encoder, decoder, losses = one_process(steps)
    same = all(
        torch.allclose(results[rank]["params"][name], p, atol=1e-6)
        for rank in range(3)
        for name, p in encoder.named_parameters()
    )
    for rank in range(3, 7):
        tp = (rank - 3) % 2
        columns = slice(tp * OUT // 2, (tp + 1) * OUT // 2)
        for name, p in decoder.named_parameters():
            same = same and torch.allclose(results[rank]["params"][name], p[columns], atol=1e-6)
    return same, results[3]["losses"], losses


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()
    results = hypergrid.spawn(worker, 7, (args.steps,), timeout_s=120)
    same, seven, one = compare(results, args.steps)
    print("losses, 7 ranks (encoder tp1 x dp3 -> decoder tp2 x dp2):", " ".join(f"{v:.6f}" for v in seven))
    print("losses, one process:                                      ", " ".join(f"{v:.6f}" for v in one))
    print("trained weights equal one process's:", same)
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
