"""average_gradients on DTensor parameters (issue 25 item 5): their local shards over the family, or one line saying
what to pass. Real DTensors (tensor parallel, FSDP2's ``fully_shard``) on 4 gloo ranks."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from hypergrid import spawn
from tests.workers import dtensor as workers

pytestmark = [pytest.mark.processes, pytest.mark.timeout(300)]
DP_PARTNER = {0: 2, 1: 3, 2: 0, 3: 1}  # the grid [2, 2] over (tp, dp), and the mesh (dp=2, tp=2)
TP_PARTNER = {0: 1, 1: 0, 2: 3, 3: 2}


@pytest.fixture(scope="module")
def outcomes() -> list[dict[str, Any]]:
    results: list[dict[str, Any]] = spawn(workers.scenarios, 4, timeout_s=240)
    return results


def _mean(rank: int, partner: int) -> list[list[float]]:
    return ((workers._gradient(rank) + workers._gradient(partner)) / 2).tolist()


@pytest.mark.parametrize("case", ["tp shard, over dp", "2-D mesh, replicate dp and shard tp, over dp"])
def test_tensor_parallel_shards_are_averaged_over_dp(outcomes: list[dict[str, Any]], case: str) -> None:
    for rank, outcome in enumerate(outcomes):
        assert outcome[case] == _mean(rank, DP_PARTNER[rank]), (rank, outcome[case])


def test_a_dp_sharded_gradient_is_averaged_over_tp_where_the_shards_agree(outcomes: list[dict[str, Any]]) -> None:
    for rank, outcome in enumerate(outcomes):
        assert outcome["dp shard, over tp"] == _mean(rank, TP_PARTNER[rank]), (rank, outcome)


@pytest.mark.parametrize("case", ["dp shard, over dp", "fsdp2 over dp"])
def test_shards_the_family_splits_are_refused_in_one_line_saying_what_to_pass(
    outcomes: list[dict[str, Any]], case: str
) -> None:
    for rank, outcome in enumerate(outcomes):
        text = outcome[case]
        assert isinstance(text, str) and text.startswith("InvalidArgumentError: average_gradients: "), text
        assert "\n" not in text and "different shards" in text and "FSDP2" in text, text
        assert f"{sorted({rank, DP_PARTNER[rank]})}" in text, text


def test_a_partial_gradient_is_refused(outcomes: list[dict[str, Any]]) -> None:
    for outcome in outcomes:
        assert "reduction still pending" in outcome["partial"], outcome["partial"]


def test_plain_gradients_are_unchanged_by_the_dtensor_path() -> None:
    from hypergrid.ops.gradients import local_gradient

    grad = torch.ones(3)
    assert local_gradient(grad, 0, [0, 1]) is grad
