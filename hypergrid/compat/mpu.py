"""An MPU-style object over a grid, for trainers that expect one (DeepSpeed, Megatron-style getters).

Examples:
    >>> from hypergrid import HyperCommGrid
    >>> mpu = MPU(HyperCommGrid([2, 2, 2], ["tp", "pp", "dp"]), create=False)
    >>> mpu.get_data_parallel_world_size(), mpu.get_tensor_model_parallel_world_size()
    (2, 2)
    >>> mpu.model_dims
    ('pp', 'tp')
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch.distributed as dist

from hypergrid.grid import HyperCommGrid
from hypergrid.layout import Dims

__all__ = ["MPU"]


def _role(attribute: str) -> tuple[Callable[[MPU], Any], Callable[[MPU], int], Callable[[MPU], int]]:
    """The group / rank / world-size getters of the role whose dims are ``MPU.<attribute>``."""

    def group(self: MPU) -> dist.ProcessGroup | None:
        return self.grid.pg(list(getattr(self, attribute)))

    def rank(self: MPU) -> int:
        return self.grid.group_rank(getattr(self, attribute))

    def world_size(self: MPU) -> int:
        return self.grid.group_size(getattr(self, attribute))

    return group, rank, world_size


class MPU:
    """Data / tensor / pipeline / model parallel getters over a ``HyperCommGrid``.

    Args:
        grid: the grid.
        data: the dims of the data-parallel role (a name, key or list).
        tensor: the dims of the tensor-parallel role.
        pipe: the dims of the pipeline role.
        model: the dims of the model-parallel group (default: every dim but ``data``'s).
        create: create the four families now (collective, in this order:
            data, tensor, pipe, model); otherwise they are created on first use
            of a group getter (collective too).
    """

    def __init__(
        self,
        grid: HyperCommGrid,
        *,
        data: Dims = "dp",
        tensor: Dims = "tp",
        pipe: Dims = "pp",
        model: Dims | None = None,
        create: bool = True,
    ) -> None:
        self.grid = grid
        layout = grid.layout
        self.data_dims = layout.canonical_dims(data)
        self.tensor_dims = layout.canonical_dims(tensor)
        self.pipe_dims = layout.canonical_dims(pipe)
        rest = [name for name in layout.dim_names if name not in self.data_dims]
        self.model_dims = layout.canonical_dims(rest if model is None else model) if (model or rest) else ()
        if create:
            for dims in (self.data_dims, self.tensor_dims, self.pipe_dims, self.model_dims):
                if dims:
                    grid.pg(list(dims))

    def get_global_rank(self) -> int:
        return dist.get_rank()

    # One (group, rank, world size) triple per role, from the role's dims.
    get_data_parallel_group, get_data_parallel_rank, get_data_parallel_world_size = _role("data_dims")
    get_tensor_model_parallel_group, get_tensor_model_parallel_rank, get_tensor_model_parallel_world_size = _role(
        "tensor_dims"
    )
    get_pipe_parallel_group, get_pipe_parallel_rank, get_pipe_parallel_world_size = _role("pipe_dims")
    get_model_parallel_group, get_model_parallel_rank, get_model_parallel_world_size = _role("model_dims")
    # Megatron's names for the pipeline getters.
    get_pipeline_model_parallel_group = get_pipe_parallel_group
    get_pipeline_model_parallel_rank = get_pipe_parallel_rank
    get_pipeline_model_parallel_world_size = get_pipe_parallel_world_size

    def get_tensor_model_parallel_src_rank(self) -> int:
        return self.grid.src_rank(self.tensor_dims)

    def is_first_stage(self) -> bool:
        return self.get_pipe_parallel_rank() == 0

    def is_last_stage(self) -> bool:
        return self.get_pipe_parallel_rank() == self.get_pipe_parallel_world_size() - 1
