"""An MPU-style object over a grid, for trainers that expect one (DeepSpeed, Megatron-style getters).

Examples:
    >>> from hypergrid import HyperCommGrid
    >>> mpu = MPU(HyperCommGrid([2, 2, 2], ["tp", "pp", "dp"]), create=False)
    >>> mpu.get_data_parallel_world_size(), mpu.get_tensor_model_parallel_world_size()
    (2, 2)
    >>> mpu.model_dims, mpu.context_dims
    (('pp', 'tp'), ())
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch.distributed as dist

from hypergrid.errors import DimsError, InvalidArgumentError
from hypergrid.grid import HyperCommGrid
from hypergrid.layout import Dims

__all__ = ["MPU"]

# The role keywords of MPU(...), in the order create=True creates their families (sequence_data: derived).
_ROLES = ("data", "tensor", "pipe", "model", "context", "expert", "expert_tensor", "expert_data", "sequence")
# Roles whose dims default to a name when the grid has that dim, and are absent otherwise.
_OPTIONAL_DEFAULTS = {"context": "cp", "expert": "ep", "expert_tensor": "etp", "expert_data": "edp", "sequence": "sp"}
_EXPERT_ROLES = ("expert", "expert_tensor", "expert_data")


def _role(name: str) -> tuple[Callable[[MPU], Any], Callable[[MPU], int], Callable[[MPU], int]]:
    """The group / rank / world-size getters of role ``name`` (dims in ``MPU.<name>_dims``).

    A role with no dims (say, no context parallelism) has rank 0 and world
    size 1, as Megatron's getters report with a parallel size of 1; asking
    for its group raises ``DimsError``.
    """

    def group(self: MPU) -> dist.ProcessGroup | None:
        dims = getattr(self, f"{name}_dims")
        if not dims:
            raise DimsError(
                f"this MPU has no {name} dims, so no {name} group: give MPU(..., {name}=...) "
                f"one of the grid's dims {self._grid_for(name).dim_names}"
            )
        return self._grid_for(name).pg(list(dims))

    def rank(self: MPU) -> int:
        dims = getattr(self, f"{name}_dims")
        return self._grid_for(name).group_rank(dims) if dims else 0

    def world_size(self: MPU) -> int:
        dims = getattr(self, f"{name}_dims")
        return self._grid_for(name).group_size(dims) if dims else 1

    return group, rank, world_size


def _check_vp_stage(vp_stage: int | None) -> None:
    if vp_stage is not None and vp_stage != 0:
        raise InvalidArgumentError(
            f"vp_stage={vp_stage!r}: this MPU has no virtual pipeline, so the only virtual stage is 0"
        )


class MPU:
    """Data / tensor / pipeline / model / context / expert parallel getters over a ``HyperCommGrid``.

    Every role is named by its dims, as a name, key or list. Megatron's and
    DeepSpeed's getter names are both provided.

    Args:
        grid: the grid.
        data: the dims of the data-parallel role.
        tensor: the dims of the tensor-parallel role.
        pipe: the dims of the pipeline role.
        model: the dims of the model-parallel group (default: every dim of
            ``grid`` but the data, context and sequence dims, Megatron's tp-pp group).
        context: the context-parallel dims (default ``"cp"`` if the grid has it).
        expert: the expert-parallel dims (default ``"ep"`` if ``expert_grid`` has it).
        expert_tensor: the expert tensor-parallel dims (default ``"etp"`` if present).
        expert_data: the expert data-parallel dims (default ``"edp"`` if present).
        sequence: the sequence-parallel dims (DeepSpeed Ulysses; default ``"sp"``
            if the grid has it). With sequence dims the MPU has DeepSpeed's
            ``get_sequence_parallel_*`` getters and ``get_sequence_data_parallel_*``
            (the data and sequence dims together, what ZeRO shards over);
            without them it has neither, so DeepSpeed's ``hasattr`` probes fall
            back as they do for any mpu.
        expert_grid: the grid holding the expert dims, usually the expert view
            of ``hypergrid.compat.megatron.moe_grids`` (default: ``grid``).
        create: create the roles' families now (collective, in the order of
            the keywords above); otherwise each is created on first use of its
            group getter (collective too).

    Raises:
        DimsError: a role names a dim its grid does not have (the message lists
            the keywords and the grid's dims), or repeats one.
    """

    def __init__(
        self,
        grid: HyperCommGrid,
        *,
        data: Dims = "dp",
        tensor: Dims = "tp",
        pipe: Dims = "pp",
        model: Dims | None = None,
        context: Dims | None = None,
        expert: Dims | None = None,
        expert_tensor: Dims | None = None,
        expert_data: Dims | None = None,
        sequence: Dims | None = None,
        expert_grid: HyperCommGrid | None = None,
        create: bool = True,
    ) -> None:
        self.grid = grid
        self.expert_grid = grid if expert_grid is None else expert_grid
        given: dict[str, Dims | None] = {
            "context": context,
            "expert": expert,
            "expert_tensor": expert_tensor,
            "expert_data": expert_data,
            "sequence": sequence,
        }
        for role, default in _OPTIONAL_DEFAULTS.items():
            if given[role] is None and default in self._grid_for(role).dim_names:
                given[role] = default
        self.data_dims = self._dims("data", data)
        self.tensor_dims = self._dims("tensor", tensor)
        self.pipe_dims = self._dims("pipe", pipe)
        self.context_dims = self._dims("context", given["context"])
        self.expert_dims = self._dims("expert", given["expert"])
        self.expert_tensor_dims = self._dims("expert_tensor", given["expert_tensor"])
        self.expert_data_dims = self._dims("expert_data", given["expert_data"])
        self.sequence_dims = self._dims("sequence", given["sequence"])
        self.sequence_data_dims = self._dims("sequence_data", self.data_dims + self.sequence_dims)
        kept = self.data_dims + self.context_dims + self.sequence_dims
        rest = [name for name in grid.dim_names if name not in kept]
        self.model_dims = self._dims("model", rest if model is None else model)
        if self.sequence_dims:  # only then: DeepSpeed probes these with hasattr
            self.get_sequence_parallel_group = self._sequence_group
            self.get_sequence_parallel_rank = self._sequence_rank
            self.get_sequence_parallel_world_size = self._sequence_world_size
            self.get_sequence_data_parallel_group = self._sequence_data_group
            self.get_sequence_data_parallel_rank = self._sequence_data_rank
            self.get_sequence_data_parallel_world_size = self._sequence_data_world_size
        if create:
            for role in (*_ROLES, "sequence_data"):
                dims = getattr(self, f"{role}_dims")
                if dims:
                    self._grid_for(role).pg(list(dims))

    def _grid_for(self, role: str) -> HyperCommGrid:
        return self.expert_grid if role in _EXPERT_ROLES else self.grid

    def _dims(self, role: str, dims: Dims | None) -> tuple[str, ...]:
        if dims is None or (isinstance(dims, (list, tuple)) and not dims):
            return ()
        grid = self._grid_for(role)
        try:
            return grid.layout.canonical_dims(dims)
        except DimsError as error:
            keywords = ", ".join(f"{name}=" for name in _ROLES)
            raise DimsError(
                f"MPU role {role}={dims!r} does not name dims of the grid {grid.dim_names} ({error}); "
                f"name each role's dims with the keywords {keywords}"
            ) from None

    def get_global_rank(self) -> int:
        return dist.get_rank()

    # One (group, rank, world size) triple per role, from the role's dims.
    get_data_parallel_group, get_data_parallel_rank, get_data_parallel_world_size = _role("data")
    get_tensor_model_parallel_group, get_tensor_model_parallel_rank, get_tensor_model_parallel_world_size = _role(
        "tensor"
    )
    get_pipe_parallel_group, get_pipe_parallel_rank, get_pipe_parallel_world_size = _role("pipe")
    get_model_parallel_group, get_model_parallel_rank, get_model_parallel_world_size = _role("model")
    get_context_parallel_group, get_context_parallel_rank, get_context_parallel_world_size = _role("context")
    get_expert_model_parallel_group, get_expert_model_parallel_rank, get_expert_model_parallel_world_size = _role(
        "expert"
    )
    get_expert_tensor_parallel_group, get_expert_tensor_parallel_rank, get_expert_tensor_parallel_world_size = _role(
        "expert_tensor"
    )
    get_expert_data_parallel_group, get_expert_data_parallel_rank, get_expert_data_parallel_world_size = _role(
        "expert_data"
    )
    # Bound as get_sequence_parallel_* / get_sequence_data_parallel_* when the MPU has sequence dims.
    _sequence_group, _sequence_rank, _sequence_world_size = _role("sequence")
    _sequence_data_group, _sequence_data_rank, _sequence_data_world_size = _role("sequence_data")
    # DeepSpeed's names for the tensor-slicing getters.
    get_slice_parallel_group = get_tensor_model_parallel_group
    get_slice_parallel_rank = get_tensor_model_parallel_rank
    get_slice_parallel_world_size = get_tensor_model_parallel_world_size
    # Megatron's names for the pipeline getters.
    get_pipeline_model_parallel_group = get_pipe_parallel_group
    get_pipeline_model_parallel_rank = get_pipe_parallel_rank
    get_pipeline_model_parallel_world_size = get_pipe_parallel_world_size

    def get_tensor_model_parallel_src_rank(self) -> int:
        return self.grid.src_rank(self.tensor_dims)

    def get_data_parallel_group_ranks(self) -> list[int]:
        """The global ranks of the caller's data-parallel group (DeepSpeed's checkpoint writer asks)."""
        return self.grid.group_ranks(self.data_dims)

    def get_context_parallel_global_ranks(self) -> list[int]:
        """The global ranks of the caller's context-parallel group (``[rank]`` without context dims)."""
        return self.grid.group_ranks(self.context_dims) if self.context_dims else [dist.get_rank()]

    def _pipeline_ranks(self) -> list[int]:
        return self.grid.group_ranks(self.pipe_dims)

    def get_pipeline_model_parallel_first_rank(self) -> int:
        """The global rank of the first stage of the caller's pipeline."""
        return self._pipeline_ranks()[0]

    def get_pipeline_model_parallel_last_rank(self) -> int:
        """The global rank of the last stage of the caller's pipeline."""
        return self._pipeline_ranks()[-1]

    def get_pipeline_model_parallel_next_rank(self) -> int:
        """The global rank of the next stage, wrapping around from the last to the first."""
        ranks = self._pipeline_ranks()
        return ranks[(self.get_pipe_parallel_rank() + 1) % len(ranks)]

    def get_pipeline_model_parallel_prev_rank(self) -> int:
        """The global rank of the previous stage, wrapping around from the first to the last."""
        ranks = self._pipeline_ranks()
        return ranks[(self.get_pipe_parallel_rank() - 1) % len(ranks)]

    def is_pipeline_first_stage(self, ignore_virtual: bool = True, vp_stage: int | None = None) -> bool:
        """Whether the caller is the first pipeline stage (there is no virtual pipeline: one chunk per stage)."""
        _check_vp_stage(vp_stage)
        return self.get_pipe_parallel_rank() == 0

    def is_pipeline_last_stage(self, ignore_virtual: bool = True, vp_stage: int | None = None) -> bool:
        """Whether the caller is the last pipeline stage (there is no virtual pipeline: one chunk per stage)."""
        last = self.get_pipe_parallel_world_size() - 1
        _check_vp_stage(vp_stage)
        return self.get_pipe_parallel_rank() == last

    # DeepSpeed's names.
    is_first_stage = is_pipeline_first_stage
    is_last_stage = is_pipeline_last_stage
