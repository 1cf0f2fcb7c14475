"""Workers of the DeepSpeed tier: real DeepSpeed training on hypergrid's grids against DeepSpeed's own.

DeepSpeed 0.19 on CPU: ``DS_ACCELERATOR=cpu`` (set by ``make test-frameworks``), gloo. Every run builds its
model from the same seed and data, so runs that differ only in whose groups they use must agree bitwise.
"""

from __future__ import annotations

import dataclasses
import inspect
import os
import re
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist

STEPS = 3
# The mpu of a data-parallel run: none (DeepSpeed's own groups), hypergrid's MPU or grid, DeepSpeed's grid.
MPU_KINDS = ("none", "mpu", "hypergrid_grid", "deepspeed_grid")


def _deepspeed() -> Any:
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    import deepspeed

    deepspeed.init_distributed(dist_backend="gloo")
    return deepspeed


def _samples(replica: int, count: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Micro-batches of data-parallel replica ``replica``, the same in every run."""
    generator = torch.Generator().manual_seed(1000 + replica)
    for _ in range(count):
        yield torch.randn(2, 8, generator=generator), torch.randn(2, 4, generator=generator)


def _config(zero_stage: int, accumulation: int, world_dp: int) -> dict[str, Any]:
    return {
        "train_micro_batch_size_per_gpu": 2,
        "gradient_accumulation_steps": accumulation,
        "train_batch_size": 2 * accumulation * world_dp,
        "optimizer": {"type": "SGD", "params": {"lr": 0.05}},
        "zero_optimization": {"stage": zero_stage},
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 10**6,
        "wall_clock_breakdown": False,
    }


def _layers() -> list[Any]:
    from deepspeed.pipe import LayerSpec

    return [
        LayerSpec(torch.nn.Linear, 8, 16),
        LayerSpec(torch.nn.Tanh),
        LayerSpec(torch.nn.Linear, 16, 16),
        LayerSpec(torch.nn.Tanh),
        LayerSpec(torch.nn.Linear, 16, 4),
    ]


def pipeline_run(kind: str, zero_stage: int) -> dict[str, Any]:
    """A PipelineModule, pp 2 x dp 2, on DeepSpeed's grid (``"deepspeed"``) or hypergrid's (``"hypergrid"``)."""
    deepspeed = _deepspeed()
    from deepspeed.pipe import PipelineModule
    from deepspeed.runtime.pipe.topology import PipeDataParallelTopology as DeepSpeedTopology

    from hypergrid.compat.deepspeed import PipeDataParallelTopology, pipeline_module

    torch.manual_seed(0)
    common = {"layers": _layers(), "loss_fn": torch.nn.MSELoss(), "partition_method": "uniform"}
    if kind == "hypergrid":
        model = pipeline_module(topology=PipeDataParallelTopology(num_pp=2, num_dp=2), **common)
    else:
        model = PipelineModule(topology=DeepSpeedTopology(num_pp=2, num_dp=2), **common)
    engine, _, _, _ = deepspeed.initialize(
        model=model, model_parameters=list(model.parameters()), config=_config(zero_stage, 2, 2)
    )
    grid = model.mpu()
    data = _samples(grid.get_data_parallel_rank(), 2 * STEPS)
    losses = [engine.train_batch(data_iter=data).detach().clone() for _ in range(STEPS)]
    return {
        "grid": f"{type(grid).__module__}.{type(grid).__name__}",
        "stage": grid.get_stage_id(),
        "losses": losses,
        "params": {name: param.detach().clone() for name, param in model.named_parameters()},
    }


def data_parallel_run(kind: str, zero_stage: int) -> dict[str, Any]:
    """ZeRO over 4 data-parallel ranks of a plain module, with each kind of mpu (``"none"``: DeepSpeed's groups)."""
    deepspeed = _deepspeed()
    from deepspeed.runtime.pipe.topology import PipeDataParallelTopology as DeepSpeedTopology
    from deepspeed.runtime.pipe.topology import PipelineParallelGrid as DeepSpeedGrid

    from hypergrid import HyperCommGrid
    from hypergrid.compat.deepspeed import PipeDataParallelTopology, PipelineParallelGrid
    from hypergrid.compat.mpu import MPU

    world = dist.get_world_size()
    mpu: Any = None
    if kind == "mpu":
        mpu = MPU(HyperCommGrid([1, 1, world], ["tp", "pp", "dp"]))
    elif kind == "hypergrid_grid":
        mpu = PipelineParallelGrid(PipeDataParallelTopology(num_pp=1, num_dp=world))
    elif kind == "deepspeed_grid":
        mpu = DeepSpeedGrid(DeepSpeedTopology(num_pp=1, num_dp=world))
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))
    engine, _, _, _ = deepspeed.initialize(
        model=model, model_parameters=list(model.parameters()), config=_config(zero_stage, 1, world), mpu=mpu
    )
    losses = []
    for inputs, targets in _samples(dist.get_rank(), STEPS):
        loss = torch.nn.functional.mse_loss(engine(inputs), targets)
        engine.backward(loss)
        engine.step()
        losses.append(loss.detach().clone())
    params = {name: param.detach().clone() for name, param in model.named_parameters()}
    if zero_stage == 3:
        from deepspeed.zero import GatheredParameters

        with GatheredParameters(list(model.parameters())):
            params = {name: param.detach().clone() for name, param in model.named_parameters()}
    return {"losses": losses, "params": params}


# -- the grid contract -----------------------------------------------------------------------------------------


def _called_on(source: str, receiver: str) -> set[str]:
    return set(re.findall(rf"\b{receiver}\.([A-Za-z_]\w*)\(", source))


def contract() -> dict[str, Any]:
    """What DeepSpeed's installed source asks of a grid and an mpu, and what hypergrid's answer."""
    deepspeed = _deepspeed()
    from deepspeed.runtime.model_checkpointing.utils import _create_model_parallel_info
    from deepspeed.runtime.pipe.topology import PipeDataParallelTopology as DeepSpeedTopology
    from deepspeed.runtime.pipe.topology import PipelineParallelGrid as DeepSpeedGrid

    from hypergrid import HyperCommGrid
    from hypergrid.compat.deepspeed import PipeDataParallelTopology, PipelineParallelGrid
    from hypergrid.compat.mpu import MPU

    root = os.path.dirname(deepspeed.__file__)
    mpu_calls: set[str] = set()
    for folder, _, files in os.walk(root):
        for name in files:
            if name.endswith(".py"):
                with open(os.path.join(folder, name), encoding="utf-8") as handle:
                    mpu_calls |= _called_on(handle.read(), "mpu")
    methods = inspect.getmembers(DeepSpeedGrid, inspect.isfunction)
    public = sorted(name for name, _ in methods if not name.startswith("_"))
    theirs = DeepSpeedGrid(DeepSpeedTopology(num_pp=2, num_dp=dist.get_world_size() // 2))
    ours = PipelineParallelGrid(PipeDataParallelTopology(num_pp=2, num_dp=dist.get_world_size() // 2))
    grid = HyperCommGrid([1, dist.get_world_size() // 2, 2], ["tp", "dp", "pp"])  # DeepSpeed's pipe x data
    mpu = MPU(grid)
    sequence_grid = HyperCommGrid([1, 1, 2, dist.get_world_size() // 2], ["tp", "pp", "sp", "dp"])
    with_sequence = MPU(sequence_grid)
    out = {
        "grid_methods": public,
        "grid_missing": [name for name in public if not callable(getattr(ours, name, None))],
        "grid_attributes": sorted(name for name in vars(theirs) if not name.startswith("_")),
        "grid_attributes_missing": sorted(name for name in vars(theirs) if not hasattr(ours, name)),
        "mpu_calls": sorted(mpu_calls),
        "mpu_missing": sorted(name for name in mpu_calls if not callable(getattr(with_sequence, name, None))),
        "no_sequence": sorted(name for name in mpu_calls if "sequence" in name and hasattr(mpu, name)),
        "writer_info": {
            "deepspeed": dataclasses.asdict(_create_model_parallel_info(theirs)),
            "hypergrid_grid": dataclasses.asdict(_create_model_parallel_info(ours)),
            "mpu": dataclasses.asdict(_create_model_parallel_info(mpu)),
        },
        "sequence": (
            with_sequence.get_sequence_parallel_world_size(),
            with_sequence.get_sequence_parallel_rank(),
            dist.get_process_group_ranks(with_sequence.get_sequence_parallel_group()),
            with_sequence.get_sequence_data_parallel_world_size(),
            dist.get_process_group_ranks(with_sequence.get_sequence_data_parallel_group()),
            with_sequence.model_dims,
        ),
    }
    for hypergrid_grid in (ours.grid, grid, sequence_grid):
        hypergrid_grid.destroy()
    return out
