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

from collections.abc import Sequence

import torch.distributed as dist

from hypergrid.grid import HyperCommGrid
from hypergrid.layout import Dims

__all__ = ["MPU"]


class MPU:
    """Data / tensor / pipeline / model parallel getters over a :class:`HyperCommGrid`.

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

    def _group(self, dims: Sequence[str]) -> dist.ProcessGroup | None:
        return self.grid.pg(list(dims))

    def get_global_rank(self) -> int:
        return dist.get_rank()

    # data parallel
    def get_data_parallel_group(self) -> dist.ProcessGroup | None:
        return self._group(self.data_dims)

    def get_data_parallel_rank(self) -> int:
        return self.grid.group_rank(self.data_dims)

    def get_data_parallel_world_size(self) -> int:
        return self.grid.group_size(self.data_dims)

    # tensor (model) parallel, Megatron names
    def get_tensor_model_parallel_group(self) -> dist.ProcessGroup | None:
        return self._group(self.tensor_dims)

    def get_tensor_model_parallel_rank(self) -> int:
        return self.grid.group_rank(self.tensor_dims)

    def get_tensor_model_parallel_world_size(self) -> int:
        return self.grid.group_size(self.tensor_dims)

    def get_tensor_model_parallel_src_rank(self) -> int:
        return self.grid.src_rank(self.tensor_dims)

    # pipeline parallel, DeepSpeed and Megatron names
    def get_pipe_parallel_group(self) -> dist.ProcessGroup | None:
        return self._group(self.pipe_dims)

    def get_pipe_parallel_rank(self) -> int:
        return self.grid.group_rank(self.pipe_dims)

    def get_pipe_parallel_world_size(self) -> int:
        return self.grid.group_size(self.pipe_dims)

    get_pipeline_model_parallel_group = get_pipe_parallel_group
    get_pipeline_model_parallel_rank = get_pipe_parallel_rank
    get_pipeline_model_parallel_world_size = get_pipe_parallel_world_size

    def is_first_stage(self) -> bool:
        return self.get_pipe_parallel_rank() == 0

    def is_last_stage(self) -> bool:
        return self.get_pipe_parallel_rank() == self.get_pipe_parallel_world_size() - 1

    # model parallel: everything but data
    def get_model_parallel_group(self) -> dist.ProcessGroup | None:
        return self._group(self.model_dims)

    def get_model_parallel_rank(self) -> int:
        return self.grid.group_rank(self.model_dims)

    def get_model_parallel_world_size(self) -> int:
        return self.grid.group_size(self.model_dims)
