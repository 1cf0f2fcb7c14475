"""8 gloo ranks: process_groups() over a dense grid and an expert view, and DeviceMeshes of grids with views."""

from __future__ import annotations

from typing import Any

import pytest

from hypergrid import spawn
from tests.compat.test_megatron_api import _group_sets
from tests.workers import megatron as workers_megatron

pytestmark = [pytest.mark.processes, pytest.mark.timeout(300)]

DENSE = ([2, 1, 2, 2], ["tp", "cp", "dp", "pp"])
EXPERT = ([1, 4, 1, 2], ["expt_tp", "ep", "expt_dp", "pp"])
# Megatron's fields and the dims of their families, from process_groups_config.py's comments.
DENSE_FIELDS = {
    "tp": ["tp"],
    "pp": ["pp"],
    "cp": ["cp"],
    "dp": ["dp"],
    "mp": ["tp", "pp"],
    "tp_cp": ["tp", "cp"],
    "dp_cp": ["dp", "cp"],
    "tp_dp_cp": ["tp", "dp", "cp"],
    "intra_dp_cp": ["dp", "cp"],
}
EXPERT_FIELDS = {
    "ep": ["ep"],
    "expt_tp": ["expt_tp"],
    "tp_ep": ["expt_tp", "ep"],
    "tp_ep_pp": ["expt_tp", "ep", "pp"],
    "expt_dp": ["expt_dp"],
    "intra_expt_dp": ["expt_dp"],
}


@pytest.fixture(scope="module")
def results() -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = spawn(workers_megatron.megatron_scenarios, 8, timeout_s=240)
    return out


def _mine(groups: set[frozenset[int]], rank: int) -> list[int]:
    return sorted(next(group for group in groups if rank in group))


def test_process_groups_fields_hold_the_grids_groups(results: list[dict[str, Any]]) -> None:
    for rank, result in enumerate(results):
        fields = result["fields"]
        assert result["class"] == "ProcessGroupCollection"
        for table, (shape, names) in ((DENSE_FIELDS, DENSE), (EXPERT_FIELDS, EXPERT)):
            for name, dims in table.items():
                expected = _mine(_group_sets(shape, names, dims), rank)
                assert fields[name] == (expected, sum(expected)), (rank, name)
        stage_group = _mine(_group_sets(*DENSE, ["pp"]), rank)  # this rank's pipeline
        first, last = stage_group[0], stage_group[-1]
        assert fields["embd"] == (([first, last], first + last) if rank in (first, last) else None)
        assert fields["pos_embd"] == (([first], first) if rank == first else None)
        assert all(fields[name] is None for name in ("hcp", "inter_dist_opt", "intra_dist_opt"))
        assert result["pp_shared"] is True and result["again_same"] is True


def _row_and_column(mesh: list[list[int]], rank: int) -> tuple[list[int], list[int]]:
    """The mesh row (inner mesh dim) and column (outer mesh dim) through ``rank``."""
    i = next(i for i, row in enumerate(mesh) if rank in row)
    j = mesh[i].index(rank)
    return mesh[i], [row[j] for row in mesh]


def test_device_mesh_of_grids_with_views(results: list[dict[str, Any]]) -> None:
    for rank, result in enumerate(results):
        dense_mesh, same_dp = result["dense_mesh"]
        dp, tp = _mine(_group_sets(*DENSE, ["dp"]), rank), _mine(_group_sets(*DENSE, ["tp"]), rank)
        assert same_dp is True and _row_and_column(dense_mesh, rank) == (tp, dp)
        mesh, same_ep, same_pp, ep_summary = result["expert_mesh"]
        ep = _mine(_group_sets(*EXPERT, ["ep"]), rank)
        pp = _mine(_group_sets(*EXPERT, ["pp"]), rank)
        assert same_ep is True and same_pp is True and ep_summary == (ep, sum(ep))
        assert _row_and_column(mesh, rank) == (ep, pp)
        assert result["empty_after_destroy"] is True
