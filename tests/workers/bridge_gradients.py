"""Worker of the bridge's gradient rule (spawned gloo processes, module level): one step, three loss conventions.

An encoder (``Linear(4, 6)``, ``tanh``) on one grid feeds a decoder (``Linear(6, 3)``) on another through
``hypergrid.Bridge``; each part holds its ``dp`` replica's rows of a global batch of 6. Every rank builds every
pair's grids and creates both grids' ``dp`` groups (creation is collective over the world), then takes one
backward pass under each convention of ``CONVENTIONS`` and reports the gradients after its side's reduction over
``dp``. The test compares them with the gradient of the global mean loss in one process.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from hypergrid import Bridge, HyperCommGrid

BATCH, FEATURES, HIDDEN, OUT = 6, 4, 6, 3
#: name -> (the encoder's dp size, the decoder's dp size); the encoder on the first ranks, the decoder after it.
PAIRS = {"dp 2 -> 3": (2, 3), "dp 3 -> 2": (3, 2)}
#: How each replica's loss is written, and how each side reduces its gradients over dp:
#: "mean": the mean over the replica's rows, averaged over dp (DDP's habit), the bridge's gradient sent as it is;
#: "mean, scaled": the same, the gradient sent back scaled by dp_src / dp_dst (the rule of docs/bridge.md);
#: "share": the replica's share of the global mean (its rows' sum over the global batch), summed over dp.
CONVENTIONS = ("mean", "mean, scaled", "share")


def data() -> tuple[torch.Tensor, torch.Tensor]:
    """The global batch and targets, the same on every rank."""
    generator = torch.Generator().manual_seed(7)
    return torch.randn(BATCH, FEATURES, generator=generator), torch.randn(BATCH, OUT, generator=generator)


def models() -> tuple[torch.nn.Linear, torch.nn.Linear]:
    """The encoder and the decoder, initialized the same way on every rank."""
    torch.manual_seed(0)
    return torch.nn.Linear(FEATURES, HIDDEN), torch.nn.Linear(HIDDEN, OUT)


def one_process() -> dict[str, dict[str, torch.Tensor]]:
    """The reference: the gradients of the global mean loss of the whole model on the whole batch."""
    encoder, decoder = models()
    x, y = data()
    torch.nn.functional.mse_loss(decoder(torch.tanh(encoder(x))), y).backward()
    parts = {"encoder": encoder, "decoder": decoder}
    return {part: {name: p.grad for name, p in model.named_parameters()} for part, model in parts.items()}  # type: ignore[misc]


def _step(bridge: Bridge, encoder_grid: HyperCommGrid, decoder_grid: HyperCommGrid, convention: str) -> dict[str, Any]:
    """One forward and backward pass on this rank's side; its gradients after the reduction over dp."""
    rank = dist.get_rank()
    on_encoder = rank < encoder_grid.size
    grid = encoder_grid if on_encoder else decoder_grid
    encoder, decoder = models()
    part = encoder if on_encoder else decoder
    x, y = data()
    rows = grid.own_chunk(x if on_encoder else y, "dp", dim=0)
    if on_encoder:
        hidden = torch.tanh(encoder(rows))
        bridge.send_forward(hidden.detach())
        hidden.backward(bridge.recv_backward())
    else:
        hidden = bridge.recv_forward().requires_grad_()
        out = decoder(hidden)
        if convention == "share":
            loss = (out - rows).square().sum() / (BATCH * OUT)
        else:
            loss = torch.nn.functional.mse_loss(out, rows)
        loss.backward()
        grad = hidden.grad
        assert grad is not None
        if convention == "mean, scaled":
            grad = grad * encoder_grid.group_size("dp") / decoder_grid.group_size("dp")
        bridge.send_backward(grad)
    if convention == "share":
        for p in part.parameters():
            grid.all_reduce(p.grad, "dp")  # type: ignore[arg-type]
    else:
        grid.average_gradients(part, "dp")
    return {name: p.grad for name, p in part.named_parameters()}


def gradients() -> dict[str, dict[str, Any]]:
    """Every pair under every convention: this rank's side ("encoder" or "decoder") and its gradients."""
    out: dict[str, dict[str, Any]] = {}
    for pair, (dp_src, dp_dst) in PAIRS.items():
        encoder_grid = HyperCommGrid([1, dp_src], ["tp", "dp"])
        decoder_grid = HyperCommGrid([1, dp_dst], ["tp", "dp"], rank_offset=dp_src)
        encoder_grid.create_pgs(["dp"])  # every rank, both grids: creation is collective over the world
        decoder_grid.create_pgs(["dp"])
        bridge = Bridge(encoder_grid, decoder_grid)
        side = "encoder" if dist.get_rank() < dp_src else "decoder"
        for convention in CONVENTIONS:
            out[f"{pair}/{convention}"] = {"side": side, "grads": _step(bridge, encoder_grid, decoder_grid, convention)}
        bridge.destroy()
        encoder_grid.destroy()
        decoder_grid.destroy()
    return out
