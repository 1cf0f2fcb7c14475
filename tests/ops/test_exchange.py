"""``grid.exchange``: crossing transfers complete, edges are ignored, and docs/toolkit.md's GPipe equals one process."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from hypergrid import DimsError, HyperCommGrid, InvalidArgumentError, spawn
from tests.ops.test_toolkit_docs import example
from tests.workers import author as workers
from tests.workers import toolkit as toolkit_workers

MICRO_BATCHES = 4


@pytest.mark.processes
@pytest.mark.timeout(120)
def test_neighbours_sending_to_each_other_in_one_step_do_not_deadlock() -> None:
    numel = 2**20  # 4 MiB each way
    results = spawn(workers.crossing_exchange, 2, (numel,), timeout_s=60)
    assert [r["incoming"] for r in results] == [[2.0], [1.0]]  # each got the other's tensor, whole
    assert [r["untouched"] for r in results] == [[-1.0] * 3] * 2  # arguments past an edge: left alone


@pytest.mark.processes
@pytest.mark.timeout(180)
def test_the_gpipe_example_matches_one_process() -> None:
    stages = spawn(toolkit_workers.run_source, 2, (example("gpipe_two_stages"), "gpipe_two_stages"), timeout_s=120)
    torch.manual_seed(0)
    model = [torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh()), torch.nn.Linear(16, 4)]
    batch, target = torch.randn(MICRO_BATCHES, 3, 8), torch.randn(MICRO_BATCHES, 3, 4)
    outputs = [model[1](model[0](batch[k])) for k in range(MICRO_BATCHES)]
    loss = sum(torch.nn.functional.mse_loss(y, target[k]) for k, y in enumerate(outputs)) / MICRO_BATCHES
    loss.backward()
    assert [s["stage"] for s in stages] == [0, 1]
    assert stages[0]["outputs"] is None
    for got, want in zip(stages[1]["outputs"], outputs):
        torch.testing.assert_close(torch.tensor(got), want.detach())
    for stage, part in zip(stages, model):
        want_grads: dict[str, Any] = {name: p.grad for name, p in part.named_parameters()}
        assert stage["grads"].keys() == want_grads.keys()
        for name, grad in want_grads.items():
            torch.testing.assert_close(torch.tensor(stage["grads"][name]), grad, msg=f"stage {stage['stage']} {name}")


@pytest.mark.usefixtures("one_rank_world")
@pytest.mark.parametrize(
    ("dim", "kwargs", "error", "text"),
    [
        ("pp", {"send_next": [1.0]}, InvalidArgumentError, r"send_next=\[1.0\]: expected a torch.Tensor"),
        ("pp", {"recv_prev": "x"}, InvalidArgumentError, r"exchange: recv_prev='x': expected a torch.Tensor or None"),
        ("pp-tp", {}, DimsError, "exchange: dim='pp-tp': expected one dim name"),
        ("xp", {}, DimsError, "'xp'"),
    ],
)
def test_bad_arguments_are_refused_before_any_group_is_created(
    dim: str, kwargs: dict[str, Any], error: type, text: str
) -> None:
    grid = HyperCommGrid([1, 1], ["tp", "pp"])
    with pytest.raises(error, match=text):
        grid.exchange(dim, **kwargs)
    assert grid.created_keys == []


@pytest.mark.usefixtures("one_rank_world")
def test_one_stage_is_first_and_last_so_nothing_moves() -> None:
    grid = HyperCommGrid([1], ["pp"])
    buffer = torch.full((2,), 7.0)
    grid.exchange(send_next=torch.ones(2), recv_next=buffer, send_prev=torch.ones(2), recv_prev=buffer)
    assert buffer.tolist() == [7.0, 7.0]
    assert grid.created_keys == ["pp"]  # the group is still created: every stage takes part
    grid.destroy()
