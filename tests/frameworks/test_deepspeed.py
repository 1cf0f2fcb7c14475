"""The DeepSpeed tier (``make test-frameworks``): DeepSpeed 0.19 on hypergrid's grids, on CPU with gloo.

- The contract, read from the installed DeepSpeed: every public method and attribute of its
  ``PipelineParallelGrid`` exists on hypergrid's; every method DeepSpeed calls on an ``mpu`` exists on
  hypergrid's ``MPU`` (the sequence-parallel ones only when the grid has an ``sp`` dim); the checkpoint
  writer's view of the grid is DeepSpeed's own.
- Training: a ``PipelineModule`` (pp 2 x dp 2) built on hypergrid's grid through ``pipeline_module``, and
  ZeRO-2 data parallelism with each kind of mpu, are bitwise identical to DeepSpeed's own grid and groups.

Skipped where DeepSpeed is not installed (the tier installs it).
"""

from __future__ import annotations

import os
from typing import Any

import pytest

os.environ.setdefault("DS_ACCELERATOR", "cpu")
pytest.importorskip("deepspeed")

import torch

from hypergrid import spawn
from tests.workers import ds_train

pytestmark = [pytest.mark.processes, pytest.mark.timeout(600)]
WORLD = 4
# Called on an mpu by DeepSpeed, but not an mpu's method: the marker of DeepSpeed's own Ulysses module (an mpu
# that has it is taken for that module) and a method of deepspeed.utils.groups, which DeepSpeed assigns to mpu.
NOT_FOR_AN_MPU = {"initialize_sequence_parallel", "_init_tp_mesh_device"}


def _same(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return (
        len(a["losses"]) == len(b["losses"]) == ds_train.STEPS
        and all(torch.equal(x, y) for x, y in zip(a["losses"], b["losses"]))
        and a["params"].keys() == b["params"].keys()
        and all(torch.equal(a["params"][name], b["params"][name]) for name in a["params"])
    )


def test_the_grid_and_mpu_contract() -> None:
    results = spawn(ds_train.contract, WORLD, timeout_s=300)
    for rank, out in enumerate(results):
        assert {"get_data_parallel_group_ranks", "get_pipeline_model_parallel_rank"} <= set(out["grid_methods"])
        assert out["grid_missing"] == [] and out["grid_attributes_missing"] == []
        assert "get_sequence_parallel_world_size" in out["mpu_calls"]
        assert [name for name in out["mpu_missing"] if name not in NOT_FOR_AN_MPU] == []
        assert out["no_sequence"] == []  # without an sp dim DeepSpeed's hasattr probes find nothing
        info = out["writer_info"]
        assert info["hypergrid_grid"] == info["deepspeed"] == info["mpu"]
        # DeepSpeed's (pipe 2, data 2), data fastest: data peers are consecutive ranks.
        first = rank - rank % 2
        assert info["deepspeed"]["dp_peer_ranks"] == [first, first + 1] and info["deepspeed"]["pp_rank"] == rank // 2
        # sp 2 x dp 2 (sp inner): sp pairs of consecutive ranks, sequence-data the whole world; sp is not model.
        pair = [rank - rank % 2, rank - rank % 2 + 1]
        assert out["sequence"] == (2, rank % 2, pair, 4, [0, 1, 2, 3], ("pp", "tp"))


@pytest.mark.parametrize("zero_stage", [0, 1])
def test_pipeline_module_on_hypergrids_grid_is_bitwise_deepspeeds(zero_stage: int) -> None:
    ours = spawn(ds_train.pipeline_run, WORLD, ("hypergrid", zero_stage), timeout_s=300)
    theirs = spawn(ds_train.pipeline_run, WORLD, ("deepspeed", zero_stage), timeout_s=300)
    for rank, (a, b) in enumerate(zip(ours, theirs)):
        assert a["grid"] == "hypergrid.compat.deepspeed_pipe.PipelineParallelGrid"
        assert b["grid"] == "deepspeed.runtime.pipe.topology.PipelineParallelGrid"
        assert a["stage"] == b["stage"] == rank // 2
        assert _same(a, b), rank
    assert not torch.equal(ours[0]["losses"][0], ours[0]["losses"][-1])  # it trained


def test_zero2_with_hypergrids_mpu_or_grid_is_bitwise_deepspeeds() -> None:
    runs = {kind: spawn(ds_train.data_parallel_run, WORLD, (kind, 2), timeout_s=300) for kind in ds_train.MPU_KINDS}
    for rank in range(WORLD):
        reference = runs["none"][rank]  # DeepSpeed's own groups, no mpu
        for kind in ("mpu", "hypergrid_grid", "deepspeed_grid"):
            assert _same(runs[kind][rank], reference), (kind, rank)
    assert not torch.equal(runs["mpu"][0]["losses"][0], runs["mpu"][1]["losses"][0])  # replicas saw other data
