"""examples/bridge_pipeline.py: an encoder (tp1 x dp3) feeding a decoder (tp2 x dp2) trains as one process."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from examples import bridge_pipeline as example
from hypergrid import spawn

STEPS = 3


def reference() -> torch.nn.Sequential:
    """The same model trained by torch's own SGD on the whole batch (the loss: squared error summed, over the batch)."""
    encoder, decoder = example.models()
    model = torch.nn.Sequential(encoder, torch.nn.Tanh(), decoder)
    optimizer = torch.optim.SGD(model.parameters(), lr=example.LR)
    for step in range(STEPS):
        x, y = example.data(step)
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(x), y, reduction="sum").div(example.BATCH).backward()
        optimizer.step()
    return model


@pytest.mark.processes
@pytest.mark.timeout(150)
def test_the_two_grids_train_like_one_process() -> None:
    results: list[dict[str, Any]] = spawn(example.worker, 7, (STEPS,), timeout_s=120)
    model = reference()
    for rank in range(3):  # the encoder's dp replicas: the whole encoder each
        for name, want in model[0].named_parameters():
            torch.testing.assert_close(results[rank]["params"][name], want.detach(), msg=f"rank {rank} {name}")
    for rank in range(3, 7):  # the decoder's tp ranks hold 2 output features each
        tp = (rank - 3) % 2
        for name, want in model[2].named_parameters():
            torch.testing.assert_close(
                results[rank]["params"][name], want.detach()[2 * tp : 2 * tp + 2], msg=f"rank {rank} {name}"
            )
    assert len(results[3]["losses"]) == STEPS
