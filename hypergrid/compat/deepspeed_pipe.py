"""DeepSpeed's ``PipelineParallelGrid``, its groups created through a ``HyperCommGrid``.

The topology's axes become the grid's dims (reversed: DeepSpeed's last axis is
hypergrid's innermost dim); the axes ``pipe``, ``data`` and ``model`` that the
topology lacks are added as dims of size 1, which moves no rank. The four
families DeepSpeed builds are created with ``create_pg``, in DeepSpeed's order
(model = every dim but ``data``, then ``data``, ``pipe``, ``model``), the same
on every rank.

Examples:
    >>> import torch.distributed as dist
    >>> dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    >>> grid = PipelineParallelGrid()
    >>> grid.get_stage_id(), grid.is_first_stage, grid.is_last_stage, grid.p2p_groups
    (0, True, True, [[0, 0]])
    >>> grid.grid.created_keys
    ['model-pipe', 'data', 'pipe', 'model']
    >>> grid.grid.destroy(); dist.destroy_process_group()
"""

from __future__ import annotations

import warnings
from typing import Any

import torch.distributed as dist

from hypergrid.compat.deepspeed_topology import PipeDataParallelTopology, _prime_factors
from hypergrid.errors import NotInitializedError, WorldSizeError
from hypergrid.grid import HyperCommGrid

__all__ = ["PipelineParallelGrid"]

# The axes PipelineParallelGrid reads; absent ones count as size 1 (DeepSpeed's max(get_dim(axis), 1)).
_ROLES = ("pipe", "data", "model")


def _default_topology(world: int) -> PipeDataParallelTopology:
    """DeepSpeed's default: prime factors of the world dealt to pipe and data in turn, pipe first."""
    num_pp = num_dp = 1
    for index, prime in enumerate(_prime_factors(world)):
        if index % 2 == 0:
            num_pp *= prime
        else:
            num_dp *= prime
    return PipeDataParallelTopology(num_pp=num_pp, num_dp=num_dp)


class PipelineParallelGrid:
    """DeepSpeed's pipeline x data x model grid over the world, with its attributes and MPU getters.

    Collective: every rank of the world constructs it, with the same topology.
    ``is_first_stage`` and ``is_last_stage`` are attributes (bools), as in
    DeepSpeed. ``grid`` is the underlying ``HyperCommGrid``.

    Args:
        topology: a ``ProcessTopology`` (or anything with ``get_axis_names`` and
            ``get_dim``); default: pipe and data from the world size's prime
            factors, as DeepSpeed does.
        process_group: accepted and ignored, as in DeepSpeed (which leaves it a
            TODO); a group that is not the whole world gets a warning.

    Raises:
        WorldSizeError: the topology's size differs from the world size
            (DeepSpeed asserts "Invalid Grid").
        NotInitializedError: torch.distributed is not initialized.

    Examples:
        >>> import torch.distributed as dist
        >>> from hypergrid.compat.deepspeed import ProcessTopology
        >>> dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        >>> grid = PipelineParallelGrid(ProcessTopology(axes=["pipe", "data"], dims=[1, 1]))
        >>> grid.get_data_parallel_world_size(), grid.get_slice_parallel_rank(), grid.stage_to_global(0)
        (1, 0, 0)
        >>> grid.grid.destroy(); dist.destroy_process_group()
    """

    def __init__(self, topology: Any = None, process_group: dist.ProcessGroup | None = None) -> None:
        if not (dist.is_available() and dist.is_initialized()):
            raise NotInitializedError("PipelineParallelGrid needs torch.distributed to be initialized")
        self.global_rank = dist.get_rank()
        self.world_size = dist.get_world_size()
        if process_group is not None and dist.get_world_size(process_group) != self.world_size:
            warnings.warn(
                "PipelineParallelGrid ignores process_group (as DeepSpeed does) and lays out the whole world",
                stacklevel=2,
            )
        self._topo = _default_topology(self.world_size) if topology is None else topology
        axes = list(self._topo.get_axis_names())
        sizes = [self._topo.get_dim(axis) for axis in axes]
        if not self._is_grid_valid():
            raise WorldSizeError(
                f"Invalid Grid: topology {axes} x {sizes} has {self._topo_size()} ranks, "
                f"but the world has {self.world_size}"
            )
        missing = [axis for axis in _ROLES if axis not in axes]
        self.grid = HyperCommGrid(sizes[::-1] + [1] * len(missing), axes[::-1] + missing)
        self.data_parallel_size = max(self._topo.get_dim("data"), 1)
        self.pipe_parallel_size = max(self._topo.get_dim("pipe"), 1)
        self.model_parallel_size = max(self._topo.get_dim("model"), 1)
        self.slice_parallel_size = self.model_parallel_size
        self.stage_id = self.get_stage_id()
        self.data_parallel_id = self.get_data_parallel_id()
        me = self.global_rank

        # DeepSpeed's order of creation: model (all but data), data, pipe, slice (model).
        model_dims = [name for name in self.grid.dim_names if name != "data"]
        self.ds_model_proc_group = self.grid.create_pg(model_dims)
        self.ds_model_world_size = self.grid.group_size(model_dims)
        self.ds_model_rank = self.grid.group_rank(model_dims, me)

        self.dp_groups = self.grid.get_rank_enum("data")
        self.dp_proc_group = self.grid.create_pg("data")
        self.dp_group = self.grid.group_ranks("data", me)

        self.is_first_stage = self.stage_id == 0
        self.is_last_stage = self.stage_id == self.pipe_parallel_size - 1
        self.p2p_groups = self._build_p2p_groups()

        self.pipe_groups = self.grid.get_rank_enum("pipe")
        self.pp_proc_group = self.grid.create_pg("pipe")
        self.pp_group = self.grid.group_ranks("pipe", me)

        self.slice_proc_group = self.grid.create_pg("model")
        self.slice_group = self.grid.group_ranks("model", me)
        if self.model_parallel_size > 1:
            self.mp_group: list[int] = []
            self.model_groups = self.grid.get_rank_enum("model")

    def _topo_size(self) -> int:
        size = 1
        for axis in self._topo.get_axis_names():
            size *= self._topo.get_dim(axis)
        return size

    def _is_grid_valid(self) -> bool:
        """Whether the topology has exactly as many ranks as the world."""
        return self._topo_size() == dist.get_world_size()

    def _build_p2p_groups(self) -> list[list[int]]:
        """``[rank, next stage's rank]`` for every rank of the world, wrapping at the last stage."""
        pairs = []
        for rank in range(self.world_size):
            buddy = self.grid.shift("pipe", periodic=True, rank=rank)[1]
            assert buddy is not None  # periodic: never past an edge
            pairs.append([rank, buddy])
        return pairs

    def get_stage_id(self) -> int:
        """The calling rank's pipeline stage (its ``pipe`` coordinate; 0 without a pipe axis)."""
        return int(self.grid.coord_of(self.global_rank).pipe)

    def get_data_parallel_id(self) -> int:
        """The calling rank's ``data`` coordinate (0 without a data axis)."""
        return int(self.grid.coord_of(self.global_rank).data)

    def stage_to_global(self, stage_id: int, **kwargs: int) -> int:
        """The rank at stage ``stage_id`` with the caller's other coordinates (some replaced by ``kwargs``).

        Raises:
            RankError: a coordinate out of range or an unknown axis.
        """
        return self.grid.rank_of(self.global_rank, pipe=stage_id, **kwargs)

    def topology(self) -> Any:
        """The topology this grid was built from."""
        return self._topo

    def get_global_rank(self) -> int:
        """The calling rank in the world."""
        return self.global_rank

    # -- MPU getters (DeepSpeed's names) -------------------------------------

    def get_pipe_parallel_rank(self) -> int:
        """The caller's pipeline stage."""
        return self.stage_id

    def get_pipe_parallel_world_size(self) -> int:
        """The number of pipeline stages."""
        return self.pipe_parallel_size

    # Megatron's names for the pipeline getters (DeepSpeed's checkpoint writer calls them).
    get_pipeline_model_parallel_rank = get_pipe_parallel_rank
    get_pipeline_model_parallel_world_size = get_pipe_parallel_world_size

    def get_pipe_parallel_group(self) -> dist.ProcessGroup | None:
        """The caller's group along ``pipe`` (one pipeline)."""
        return self.pp_proc_group

    def get_data_parallel_rank(self) -> int:
        """The caller's ``data`` coordinate (which pipeline it is in)."""
        return self.data_parallel_id

    def get_data_parallel_world_size(self) -> int:
        """The number of pipelines (size of ``data``)."""
        return self.data_parallel_size

    def get_data_parallel_group(self) -> dist.ProcessGroup | None:
        """The caller's group along ``data`` (gradient all-reduce)."""
        return self.dp_proc_group

    def get_data_parallel_group_ranks(self) -> list[int]:
        """The global ranks of the caller's group along ``data`` (``dp_group``)."""
        return self.dp_group

    def get_model_parallel_rank(self) -> int:
        """The caller's rank in its group over every axis but ``data``."""
        return self.ds_model_rank

    def get_model_parallel_world_size(self) -> int:
        """The size of the group over every axis but ``data``."""
        return self.ds_model_world_size

    def get_model_parallel_group(self) -> dist.ProcessGroup | None:
        """The caller's group over every axis but ``data`` (overflow checks)."""
        return self.ds_model_proc_group

    def get_slice_parallel_rank(self) -> int:
        """The caller's ``model`` coordinate (tensor slicing); 0 without a model axis."""
        return int(self.grid.coord_of(self.global_rank).model)

    def get_slice_parallel_world_size(self) -> int:
        """The size of ``model`` (1 without a model axis)."""
        return self.slice_parallel_size

    def get_slice_parallel_group(self) -> dist.ProcessGroup | None:
        """The caller's group along ``model`` (a group of one without a model axis)."""
        return self.slice_proc_group

    # Megatron's names for the tensor-slicing getters (what DeepSpeed's bwc helpers look for first).
    get_tensor_model_parallel_rank = get_slice_parallel_rank
    get_tensor_model_parallel_world_size = get_slice_parallel_world_size
    get_tensor_model_parallel_group = get_slice_parallel_group
