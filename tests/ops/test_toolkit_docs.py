"""The examples of docs/toolkit.md, run on 4 gloo ranks and checked against single-process references."""

from __future__ import annotations

import pathlib
import re
from typing import Any

import pytest
import torch

from hypergrid import spawn
from tests.workers import toolkit as toolkit_workers

pytestmark = [pytest.mark.processes, pytest.mark.timeout(300)]
PAGE = pathlib.Path(__file__).resolve().parents[2] / "docs" / "toolkit.md"


def example(function: str) -> str:
    """The page's Python block that defines ``function``."""
    blocks = re.findall(r"```python\n(.*?)```", PAGE.read_text(), flags=re.S)
    found = [block for block in blocks if f"def {function}(" in block]
    assert len(found) == 1, f"docs/toolkit.md should define {function} in one Python block"
    return found[0]


@pytest.fixture(scope="module")
def results() -> dict[str, list[Any]]:
    out: dict[str, list[Any]] = {}
    for function in ("tensor_parallel_mlp", "pipeline_4_stages"):
        out[function] = spawn(toolkit_workers.run_source, 4, (example(function), function), timeout_s=120)
    return out


def test_tensor_parallel_mlp_matches_one_process(results: dict[str, list[Any]]) -> None:
    torch.manual_seed(0)
    x = torch.randn(4, 16, requires_grad=True)
    w1, w2 = torch.randn(32, 16), torch.randn(16, 32)
    y = torch.relu(x @ w1.T) @ w2.T
    y.square().sum().backward()
    assert x.grad is not None
    for got_y, got_grad in results["tensor_parallel_mlp"]:  # float32 sums in another order: rounding only
        torch.testing.assert_close(torch.tensor(got_y), y.detach(), rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(torch.tensor(got_grad), x.grad, rtol=1e-4, atol=1e-4)


def test_pipeline_example_matches_one_process(results: dict[str, list[Any]]) -> None:
    torch.manual_seed(0)
    layers = [torch.nn.Linear(8, 8) for _ in range(4)]
    y = torch.randn(2, 8)
    for layer in layers:
        y = torch.tanh(layer(y))
    loss = y.square().mean()
    loss.backward()
    stages = results["pipeline_4_stages"]
    assert [stage["stage"] for stage in stages] == [0, 1, 2, 3]
    assert [stage["loss"] is None for stage in stages] == [True, True, True, False]
    assert stages[3]["loss"] == pytest.approx(loss.item())
    for stage, layer in zip(stages, layers):
        assert layer.weight.grad is not None
        torch.testing.assert_close(torch.tensor(stage["weight_grad"]), layer.weight.grad)
