"""8 gloo ranks: process_groups from a grid and in one call (guard on), every field on every rank; DeviceMeshes."""

from __future__ import annotations

from typing import Any

import pytest

from hypergrid import spawn
from tests.compat.megatron_reference import mine, reference
from tests.compat.test_megatron_api import _group_sets
from tests.workers import megatron as workers_megatron

pytestmark = [pytest.mark.processes, pytest.mark.timeout(400)]

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
    "dp_cp_gtp_remat": ["dp", "cp"],
    "gtp_remat": ["cp"],  # size 1 (absent): single ranks
    "intra_dist_opt": ["tp", "cp", "dp", "pp"],  # one optimizer instance: the whole grid
}
EXPERT_FIELDS = {
    "ep": ["ep"],
    "expt_tp": ["expt_tp"],
    "tp_ep": ["expt_tp", "ep"],
    "tp_ep_pp": ["expt_tp", "ep", "pp"],
    "tp_ep_pp_with_egtp_remat": ["expt_tp", "ep", "pp"],
    "expt_dp": ["expt_dp"],
    "intra_expt_dp": ["expt_dp"],
    "expt_dp_gtp_remat": ["expt_dp"],
    "expt_gtp_remat": ["expt_tp"],  # size 1: single ranks
}


@pytest.fixture(scope="module")
def results() -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = spawn(workers_megatron.megatron_scenarios, 8, timeout_s=240)
    return out


@pytest.fixture(scope="module")
def one_call() -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = spawn(workers_megatron.megatron_one_call, 8, timeout_s=300)
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
        assert all(fields[name] is None for name in ("hcp", "inter_dist_opt", "dp_cp_ag", "expt_dp_ag"))
        assert result["pp_shared"] is True and result["again_same"] is True


def _expected(sizes: dict[str, Any]) -> dict[str, Any]:
    defaults = dict(tp=1, pp=1, cp=1, ep=1, gtp_remat=1, egtp_remat=1, distributed_optimizer_instances=1,
                    order="tp-cp-ep-dp-pp", hierarchical_cp=None, all_gather=False)  # fmt: skip
    full = {**defaults, **sizes}
    return reference(
        8, full["tp"], full["pp"], full["cp"], full["ep"], full.get("etp", full["tp"]), full["gtp_remat"],
        full["egtp_remat"], full["distributed_optimizer_instances"], full["order"], full["hierarchical_cp"],
        full["all_gather"],
    )  # fmt: skip


def _summary(members: Any) -> Any:
    """What the worker's _summary reports for a group with these members (ranks, their sum)."""
    if members is None:
        return None
    if members and isinstance(members[0], list):
        return [_summary(level) for level in members]
    return members, sum(members)


@pytest.mark.parametrize("name", list(workers_megatron.ONE_CALLS))
def test_one_call_fields_on_every_rank_and_its_batches(one_call: list[dict[str, Any]], name: str) -> None:
    expected = _expected(workers_megatron.ONE_CALLS[name])
    for rank, result in enumerate(one_call):
        for field, got in result[name]["fields"].items():
            assert got == _summary(mine(expected[field], rank)), (rank, field)
    batches = one_call[0][name]["batches"]
    if name == "moe":  # one guarded batch: the expert families are the grid's (sharing)
        assert batches == [(None, None)]
    elif name == "moe_view":  # one for the grid, one for the expert view
        assert batches == [(None, None), ("expert", None)]
    else:  # and one per view each feature needs, then the "ag" twins (both the grid's families here)
        assert batches == [
            (None, None), ("megatron.dist_opt", None), ("megatron.expert_dist_opt", None), ("megatron.hcp", None),
            (None, "ag"),
        ]  # fmt: skip
    assert all(result[name]["batches"] == batches for result in one_call)


def test_ranks_that_ask_for_different_collections_all_fail_in_the_first_round(
    one_call: list[dict[str, Any]],
) -> None:
    for result in one_call:
        message = result["desync"]
        assert message is not None and "all_gather=True" in message and "all_gather=False" in message
        message = result["desync_expert"]  # the grid families agree; the expert layout in the request does not
        assert message is not None and "[1, 2, 1, 4, 1]" in message and "[2, 1, 1, 4, 1]" in message


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
