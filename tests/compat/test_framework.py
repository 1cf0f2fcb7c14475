"""Real processes: getters, a folded view, an MPU, node checks and a DeviceMesh running a DTensor op."""

from __future__ import annotations

from typing import Any

import pytest

from hypergrid import GridLayout, spawn
from tests.workers import basic as workers

pytestmark = [pytest.mark.processes, pytest.mark.timeout(300)]
LAYOUT = GridLayout([2, 2, 2], ["tp", "dp", "pp"])


@pytest.fixture(scope="module")
def results() -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = spawn(workers.framework_scenarios, 8, timeout_s=240)
    return out


def test_getters_agree_with_torch_on_every_family(results: list[dict[str, Any]]) -> None:
    for rank, result in enumerate(results):
        assert result["coord"] == LAYOUT.coords_of(rank)
        assert len(result["getters"]) == 7
        assert all(all(checks) for checks in result["getters"].values()), result["getters"]


def test_expert_view_shares_pp_and_has_its_own_ep(results: list[dict[str, Any]]) -> None:
    for rank, result in enumerate(results):
        assert result["moe_shapes"] == ([2, 1, 2, 2], [1, 4, 1, 2])
        assert result["pp_same_object"] is True and result["ep_not_dense"] is True
        expected = [0, 1, 2, 3] if rank < 4 else [4, 5, 6, 7]
        assert result["ep_ranks"] == expected and result["ep_sum"] == sum(expected)
        # destroying the view left the dense grid's pp group alive and working
        assert result["pp_alive_after_view_destroy"] == rank + (rank + 4 if rank < 4 else rank - 4)


def test_mpu_getters(results: list[dict[str, Any]]) -> None:
    for rank, result in enumerate(results):
        same_rank, tp_size, model_size, first, last, same_group = result["mpu"]
        assert same_rank and same_group and (tp_size, model_size) == (2, 4)
        assert (first, last) == (rank < 4, rank >= 4)


def test_device_mesh_uses_the_grids_groups_and_runs_dtensor(results: list[dict[str, Any]]) -> None:
    for rank, result in enumerate(results):
        assert result["mesh_groups_are_grids"] is True
        base = 0 if rank < 4 else 4
        assert result["mesh"] == [[base, base + 1], [base + 2, base + 3]]  # (dp, tp) slice of my pp stage
        assert result["local_shape"] == (2, 4)  # 4 rows sharded over dp=2
        assert result["dtensor_sum"] == 2 * sum(range(16))
        assert result["redistributed"] is True


def test_local_rank_check(results: list[dict[str, Any]]) -> None:
    for rank, result in enumerate(results):
        text = result["wrong_node_size"]
        if rank < 4:
            assert text == "accepted"
        else:
            assert f"LOCAL_RANK='{rank}' on rank {rank}" in text and f"should be {rank % 4}" in text
