"""Worker for the DeepSpeed adapter's process tests (module level, so spawn can import it)."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from hypergrid import DesyncError, WorldSizeError
from hypergrid.compat.deepspeed import PipelineParallelGrid, ProcessTopology


def _sum_of_ranks(group: Any) -> int:
    value = torch.tensor([dist.get_rank()], dtype=torch.int64)
    dist.all_reduce(value, group=group)
    return int(value.item())


def _pass_along_pipe(grid: PipelineParallelGrid) -> int:
    """Send this rank to the next stage (``p2p_groups``), receive from the previous one; return what arrived."""
    me = dist.get_rank()
    buddy = grid.p2p_groups[me][1]
    previous = grid.stage_to_global((grid.get_stage_id() - 1) % grid.get_pipe_parallel_world_size())
    if buddy == me:  # a pipeline of one stage: nothing to pass
        return me
    outgoing = torch.tensor([me], dtype=torch.int64)
    incoming = torch.tensor([-1], dtype=torch.int64)
    ops = [dist.P2POp(dist.isend, outgoing, buddy), dist.P2POp(dist.irecv, incoming, previous)]
    for request in dist.batch_isend_irecv(ops):
        request.wait()
    return int(incoming.item())


def pipeline_grid_scenarios(topologies: list[tuple[list[str], list[int]]]) -> dict[str, Any]:
    """Build a ``PipelineParallelGrid`` per topology (None: DeepSpeed's default) and exercise it."""
    out: dict[str, Any] = {"runs": []}
    for spec in [None, *topologies]:
        grid = PipelineParallelGrid(None if spec is None else ProcessTopology(*spec))
        run = {
            "axes": grid.topology().get_axis_names(),
            "dims": [grid.topology().get_dim(axis) for axis in grid.topology().get_axis_names()],
            "stage": grid.get_stage_id(),
            "data_id": grid.get_data_parallel_id(),
            "first_last": (grid.is_first_stage, grid.is_last_stage),
            "sizes": (
                grid.get_pipe_parallel_world_size(),
                grid.get_data_parallel_world_size(),
                grid.get_model_parallel_world_size(),
                grid.get_slice_parallel_world_size(),
                grid.get_tensor_model_parallel_world_size(),
            ),
            "ranks": (
                grid.get_pipe_parallel_rank(),
                grid.get_data_parallel_rank(),
                grid.get_model_parallel_rank(),
                grid.get_slice_parallel_rank(),
                grid.get_tensor_model_parallel_rank(),
            ),
            "lists": (grid.pp_group, grid.dp_group, grid.slice_group),
            "member_lists": [
                dist.get_process_group_ranks(group)
                for group in (
                    grid.get_pipe_parallel_group(),
                    grid.get_data_parallel_group(),
                    grid.get_model_parallel_group(),
                    grid.get_slice_parallel_group(),
                )
            ],
            "sums": [
                _sum_of_ranks(group)
                for group in (
                    grid.get_pipe_parallel_group(),
                    grid.get_data_parallel_group(),
                    grid.get_model_parallel_group(),
                    grid.get_slice_parallel_group(),
                )
            ],
            "p2p_groups": grid.p2p_groups,
            "received": _pass_along_pipe(grid),
            "stage_to_global": [grid.stage_to_global(stage) for stage in range(grid.get_pipe_parallel_world_size())],
            "tensor_group_is_slice": grid.get_tensor_model_parallel_group() is grid.get_slice_parallel_group(),
            "megatron_names": (
                grid.get_pipeline_model_parallel_rank(),
                grid.get_pipeline_model_parallel_world_size(),
                grid.get_data_parallel_group_ranks(),
            ),
        }
        out["runs"].append(run)
        grid.grid.destroy()
    try:
        PipelineParallelGrid(ProcessTopology(["pipe", "data"], [2, 2]))
        out["too_small"] = "no error"
    except WorldSizeError as error:
        out["too_small"] = str(error)
    # Rank 0 lays out the same 8 ranks differently: every rank must raise instead of hanging.
    spec = (["data", "pipe"], [2, 4]) if dist.get_rank() == 0 else (["pipe", "data"], [4, 2])
    try:
        PipelineParallelGrid(ProcessTopology(*spec))
        out["desync"] = "no error"
    except DesyncError as error:
        out["desync"] = type(error).__name__
    return out
