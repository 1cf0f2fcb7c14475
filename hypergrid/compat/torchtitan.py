"""torchtitan's meshes from one hypergrid grid: ``ParallelDims.build_mesh`` replaced by one call.

torchtitan (0.3) builds its meshes by unflattening a 1-D world mesh several
times, one set of process groups per unflatten (size-1 and unused axes on
torch's fake backend). Here every mesh is an export of one ``HyperCommGrid``
(``tp``, ``cp``, ``dp_shard``, ``dp_replicate``, ``pp``, innermost first) and
its expert view (``ep``, ``efsdp``, ``dp_replicate``, ``pp``): the same members
on every rank, one root mesh, each family's group created once and shared::

    parallel_dims = ParallelDims.from_config(config.parallelism, world_size)
    hypergrid.compat.torchtitan.build_mesh(parallel_dims)   # instead of parallel_dims.build_mesh()
    parallel_dims.get_mesh(["dp_replicate", "dp_shard"])     # torchtitan's accessors, hypergrid's meshes

(HSDP's mesh for ``fully_shard`` under the default ``spmd_backend="spmd_types"``
and ``full_dtensor``; ``["dp_replicate", "fsdp"]`` under ``partial_dtensor``:
docs/migrate/torchtitan.md has the table.)

``TitanMeshes`` computes the meshes without torchtitan installed; ``build_mesh``
puts them in a ``ParallelDims`` (the fields torchtitan 0.3's accessors read),
so ``get_mesh``, ``get_optional_mesh``, ``spmd_meshes``, ``world_mesh`` and the
rest answer with hypergrid's meshes.

The meshes, by ``spmd_backend`` (torchtitan's names; ``batch`` is
``dp_replicate`` x ``dp_shard``, ``fsdp`` is ``dp_shard`` x ``cp``, ``dp`` is
``batch`` under ``spmd_types``, ``loss`` is ``batch`` x ``cp``):

- ``world``: every rank (the grid's root mesh; the default group on a whole world);
- ``dataloading``: ``(pp, batch, cp, tp)``; ``loss``: ``(loss_mesh,)``;
- ``dense``: ``(pp, dp_replicate, fsdp, tp)`` (``partial_dtensor``) or
  ``(pp, dp_replicate, dp_shard, cp, tp)`` (``full_dtensor``, ``spmd_types``);
- ``spmd_dense_for_fwdbwd`` (``spmd_types``): ``(dp, cp, tp)``;
- ``sparse``: ``(pp, dp_replicate, efsdp, ep)`` with ``efsdp = dp_shard * cp * tp / ep``;
  ``spmd_sparse_for_fwdbwd`` (``spmd_types``, ``ep > 1``): ``(dp_replicate, efsdp, ep)``.

Examples:
    >>> import torch.distributed as dist
    >>> dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    >>> meshes = TitanMeshes(dp_replicate=1, dp_shard=1, cp=1, tp=1, pp=1, ep=1, world_size=1, device_type="cpu")
    >>> sorted(meshes.global_meshes), meshes.single_axis["batch"].mesh_dim_names
    (['dataloading', 'dense', 'loss', 'sparse', 'spmd_dense_for_fwdbwd'], ('batch',))
    >>> meshes.world is meshes.grid.to_device_mesh({"world": ("pp", "dp_replicate", "dp_shard", "cp", "tp")})
    True
    >>> meshes.grid.destroy(); dist.destroy_process_group()
"""

from __future__ import annotations

from typing import Any

import torch

from hypergrid.errors import GridSpecError
from hypergrid.grid import HyperCommGrid
from hypergrid.grid.mesh import DEVICE_TYPE
from hypergrid.layout.spec import MAX_WORLD_SIZE
from hypergrid.validation import check_choice, check_instance, check_str, public, public_methods, refuse
from hypergrid.values import as_int

__all__ = ["DENSE_DIMS", "EXPERT_DIMS", "TitanMeshes", "build_mesh"]

#: The grid's dims, innermost first (torchtitan's mesh order reversed).
DENSE_DIMS = ("tp", "cp", "dp_shard", "dp_replicate", "pp")
#: The expert view's dims, innermost first; ``dp_replicate`` and ``pp`` are shared with the grid.
EXPERT_DIMS = ("ep", "efsdp", "dp_replicate", "pp")
#: The expert view's registered name.
EXPERT_VIEW = "torchtitan_expert"

_BACKENDS = ("partial_dtensor", "full_dtensor", "spmd_types")
_BATCH = ("dp_replicate", "dp_shard")


def _default_device_type() -> str:
    """The accelerator's device type when there is one, else ``"cpu"`` (torchtitan falls back to ``"cuda"``)."""
    accelerator = torch.accelerator.current_accelerator() if torch.accelerator.is_available() else None
    return "cpu" if accelerator is None else accelerator.type


def _degrees(degrees: dict[str, object]) -> dict[str, int]:
    """torchtitan's degrees as ints: each in 1..2**31-1 (``dp_shard`` may be -1), else refused naming it."""
    checked = {}
    for name, value in degrees.items():
        number = as_int(value)
        if number is None or not (1 <= number <= MAX_WORLD_SIZE or (name, number) == ("dp_shard", -1)):
            more = " (or -1: the rest of the world)" if name == "dp_shard" else ""
            raise refuse("", name, value, f"a positive int up to {MAX_WORLD_SIZE}{more}")
        checked[name] = number
    return checked


#: What ``build_mesh`` reads and writes on a ``ParallelDims`` (torchtitan 0.3).
_DEGREES = ("dp_replicate", "dp_shard", "cp", "tp", "pp", "ep", "world_size")
_FIELDS = ("_world_mesh", "_single_axis_meshes", "_multi_axis_meshes", "_spmd_meshes")
_METHODS = ("get_activated_mesh", "_validate_meshes")


def _check_parallel_dims(parallel_dims: object) -> None:
    """``parallel_dims`` has what torchtitan 0.3's ``ParallelDims`` has (read before anything is built)."""
    try:
        fields = vars(parallel_dims)
    except TypeError:
        fields = {}
    missing = [name for name in (*_DEGREES, "spmd_backend") if not hasattr(parallel_dims, name)]
    missing += [name for name in _FIELDS if name not in fields]
    missing += [name for name in _METHODS if not callable(getattr(parallel_dims, name, None))]
    if missing:
        raise refuse(
            "",
            "parallel_dims",
            parallel_dims,
            f"a torchtitan 0.3 ParallelDims (this {type(parallel_dims).__name__} has no {missing}): "
            "hypergrid.compat.torchtitan fills the fields of torchtitan 0.3's ParallelDims",
        )


@public_methods
class TitanMeshes:
    """Every mesh torchtitan's ``ParallelDims.build_mesh`` provides, exported from one grid and its expert view.

    Collective: every rank builds it, with the same arguments (each family is
    created once, through the grid's guard).

    Args:
        dp_replicate, dp_shard, cp, tp, pp, ep: torchtitan's degrees
            (``dp_shard=-1``: the rest of the world).
        world_size: the number of ranks (the grid's size).
        spmd_backend: torchtitan's ``"partial_dtensor"``, ``"full_dtensor"`` or ``"spmd_types"``.
        grid: a grid with dims ``DENSE_DIMS`` of these sizes to take the meshes from
            (default: a new one over the first ``world_size`` ranks).
        device_type: the meshes' device type (default: the accelerator's, else ``"cpu"``).

    Attributes:
        grid: the grid; ``expert`` its expert view (a grid bound to it).
        world: the 1-D mesh of every rank.
        global_meshes: ``dataloading``, ``loss``, ``dense``, ``sparse`` and the spmd meshes, by torchtitan's keys.
        single_axis: torchtitan's one-dimensional meshes by name.

    Raises:
        InvalidArgumentError: a degree is not a positive int (``dp_shard`` may be -1),
            ``spmd_backend`` is unknown, ``grid`` is not a grid, or ``device_type`` not a device type.
        GridSpecError: the degrees do not multiply to ``world_size``, ``ep`` does
            not divide ``dp_shard * cp * tp``, or ``grid`` has other dims or sizes.
    """

    def __init__(
        self,
        *,
        dp_replicate: int,
        dp_shard: int,
        cp: int,
        tp: int,
        pp: int,
        ep: int,
        world_size: int,
        spmd_backend: str = "spmd_types",
        grid: HyperCommGrid | None = None,
        device_type: str | None = None,
    ) -> None:
        degrees = _degrees(
            {"dp_replicate": dp_replicate, "dp_shard": dp_shard, "cp": cp, "tp": tp, "pp": pp, "ep": ep,
             "world_size": world_size}
        )  # fmt: skip
        dp_replicate, dp_shard, cp, tp, pp, ep, world_size = (degrees[name] for name in _DEGREES)
        check_choice("", "spmd_backend", spmd_backend, _BACKENDS)
        check_instance("", "grid", grid, HyperCommGrid, "None or a HyperCommGrid", optional=True)
        if device_type is not None:
            check_str("", "device_type", device_type, DEVICE_TYPE, "None or a device type like 'cpu' or 'cuda'")
        if dp_shard == -1:
            dp_shard = world_size // (dp_replicate * cp * tp * pp)
        sizes = {"tp": tp, "cp": cp, "dp_shard": dp_shard, "dp_replicate": dp_replicate, "pp": pp}
        if dp_shard < 1 or dp_replicate * dp_shard * cp * tp * pp != world_size:
            raise GridSpecError(
                f"dp_replicate {dp_replicate} x dp_shard {dp_shard} x cp {cp} x tp {tp} x pp {pp} "
                f"!= world_size {world_size}"
            )
        if (dp_shard * cp * tp) % ep:
            raise GridSpecError(f"ep={ep} must divide dp_shard * cp * tp = {dp_shard * cp * tp}")
        shape = [sizes[name] for name in DENSE_DIMS]
        if grid is None:
            grid = HyperCommGrid(shape, list(DENSE_DIMS))
        elif (grid.shape, grid.dim_names) != (shape, list(DENSE_DIMS)):
            raise GridSpecError(
                f"grid {grid.shape} {grid.dim_names} must be {shape} {list(DENSE_DIMS)} for these degrees"
            )
        self.grid = grid
        self.spmd_backend = spmd_backend
        self.device_type = _default_device_type() if device_type is None else device_type
        efsdp = dp_shard * cp * tp // ep
        self.expert = grid.view([ep, efsdp, dp_replicate, pp], list(EXPERT_DIMS), name=EXPERT_VIEW)
        self._build(ep)

    def mesh(self, dims: Any) -> Any:
        """``grid.to_device_mesh(dims)`` on this object's device type (the same object for the same request)."""
        return self.grid.to_device_mesh(dims, self.device_type)

    def _build(self, ep: int) -> None:
        everything = tuple(reversed(DENSE_DIMS))
        if self.spmd_backend == "partial_dtensor":
            dense_dims: Any = {"pp": "pp", "dp_replicate": "dp_replicate", "fsdp": ("dp_shard", "cp"), "tp": "tp"}
        else:
            dense_dims = list(everything)
        requests = [
            {"world": everything},
            {"pp": "pp", "batch": _BATCH, "cp": "cp", "tp": "tp"},
            {"loss_mesh": (*_BATCH, "cp")},
            ["pp", "dp_replicate", "efsdp", "ep"],
            dense_dims,
            {"dp": _BATCH, "cp": "cp", "tp": "tp"},
            ["dp_replicate", "efsdp", "ep"],
        ]
        # Every family of every mesh in one creation step per factorization (one guard round each).
        self.world, dataloading, loss, sparse, dense, fwdbwd, sparse_fwdbwd = self.grid.to_device_meshes(
            requests, self.device_type
        )
        self.global_meshes: dict[str, Any] = {
            "dataloading": dataloading,
            "loss": loss,
            "dense": dense,
            "sparse": sparse,
        }
        self.single_axis: dict[str, Any] = {
            "pp": dataloading["pp"],
            "batch": dataloading["batch"],
            "loss": loss,
            "dp_replicate": dense["dp_replicate"],
            "cp": dataloading["cp"],
            "tp": dataloading["tp"],
            "ep": sparse["ep"],
            "efsdp": sparse["efsdp"],
        }
        if self.spmd_backend == "partial_dtensor":
            self.single_axis["fsdp"] = dense["fsdp"]
        else:
            self.single_axis["dp_shard"] = dense["dp_shard"]
        if self.spmd_backend == "spmd_types":
            self.global_meshes["spmd_dense_for_fwdbwd"] = fwdbwd
            self.single_axis["dp"] = fwdbwd["dp"]
            if ep > 1:
                self.global_meshes["spmd_sparse_for_fwdbwd"] = sparse_fwdbwd

    def install(self, parallel_dims: Any) -> Any:
        """Put these meshes in a torchtitan ``ParallelDims`` (0.3's fields) and return the world mesh.

        torchtitan's own code then computes its spmd meshes from them
        (``get_activated_mesh``) and checks their sizes (``_validate_meshes``).

        Raises:
            InvalidArgumentError: ``parallel_dims`` lacks the fields of torchtitan 0.3's ``ParallelDims``.
        """
        _check_parallel_dims(parallel_dims)
        parallel_dims._world_mesh = self.world
        parallel_dims._global_meshes = dict(self.global_meshes)
        parallel_dims._single_axis_meshes = dict(self.single_axis)
        parallel_dims._multi_axis_meshes = {}
        parallel_dims._validate_meshes()
        if self.spmd_backend == "full_dtensor":
            dense_axes = ["dp_replicate", "dp_shard", "cp", "tp"]
        elif self.spmd_backend == "spmd_types":
            dense_axes = ["dp", "cp", "tp"]
        else:
            dense_axes = ["dp_replicate", "fsdp", "tp"]
        candidates = (parallel_dims.get_activated_mesh(axes) for axes in (dense_axes, ["dp_replicate", "efsdp", "ep"]))
        parallel_dims._spmd_meshes = [mesh for mesh in candidates if mesh is not None]
        return self.world


@public
def build_mesh(parallel_dims: Any, *, grid: HyperCommGrid | None = None, device_type: str | None = None) -> Any:
    """torchtitan's ``parallel_dims.build_mesh()``, with every mesh exported from one hypergrid grid.

    Collective, like torchtitan's. Returns the world mesh; afterwards the
    ``ParallelDims`` accessors answer with hypergrid's meshes.

    Args:
        parallel_dims: a torchtitan (0.3) ``ParallelDims``.
        grid: as for ``TitanMeshes`` (default: a new grid).
        device_type: as for ``TitanMeshes``.

    Raises:
        InvalidArgumentError, GridSpecError: as ``TitanMeshes`` and ``TitanMeshes.install``; checked before
            any mesh is built.
    """
    _check_parallel_dims(parallel_dims)
    meshes = TitanMeshes(
        dp_replicate=parallel_dims.dp_replicate,
        dp_shard=parallel_dims.dp_shard,
        cp=parallel_dims.cp,
        tp=parallel_dims.tp,
        pp=parallel_dims.pp,
        ep=parallel_dims.ep,
        world_size=parallel_dims.world_size,
        spmd_backend=parallel_dims.spmd_backend,
        grid=grid,
        device_type=device_type,
    )
    return meshes.install(parallel_dims)
