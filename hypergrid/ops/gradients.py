"""Gradient averaging over a family (data parallelism by hand): bucketed, one collective per bucket.

Gradients are grouped by dtype and device, packed in order into flat buckets
of at most ``bucket_mb`` MiB (a gradient larger than that is a bucket of its
own), and each bucket is all-reduced once and copied back: a model of a
hundred small parameters costs a few collectives, not a hundred. The average
uses ``ReduceOp.AVG`` where the backend has it (NCCL) and a sum divided by
the group size elsewhere (gloo has no ``AVG``).
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from hypergrid.binding.facet import Facet, member_pg
from hypergrid.binding.failures import communicate
from hypergrid.errors import HyperGridError, InvalidArgumentError
from hypergrid.layout import Dims
from hypergrid.ops.checks import check_code, compare_call
from hypergrid.validation import check_number
from hypergrid.values import first_line, shown

__all__ = ["Gradients", "gradient_buckets", "local_gradient"]

#: Where torch defines ``DTensor``: torch >= 2.5, and 2.4's private name.
_DTENSOR_MODULES = ("torch.distributed.tensor", "torch.distributed._tensor")


def _is_dtensor(grad: object) -> bool:
    """Whether ``grad`` is a ``DTensor``, without importing torch's DTensor module.

    Importing it costs about a second of CPU in every process (it pulls in sympy): 3 s of a
    6-worker job's start on 2 cores. A DTensor exists only once its module was imported, so
    the module is looked up among those already imported.

    Examples:
        >>> _is_dtensor(torch.ones(1))
        False
    """
    for name in _DTENSOR_MODULES:
        dtensor = getattr(sys.modules.get(name), "DTensor", None)
        if dtensor is not None and isinstance(grad, dtensor):
            return True
    return False


_BACKENDS_WITH_AVG = ("nccl",)


def _parameters(module_or_params: object) -> list[torch.Tensor]:
    """The distinct tensors of a module or an iterable of tensors, in order (a shared parameter once)."""
    if isinstance(module_or_params, torch.nn.Module):
        found: Iterable[object] = module_or_params.parameters()
    elif isinstance(module_or_params, torch.Tensor):
        found = [module_or_params]
    elif isinstance(module_or_params, Iterable) and not isinstance(module_or_params, (str, bytes)):
        found = module_or_params
    else:
        raise InvalidArgumentError(
            f"average_gradients needs a torch.nn.Module or an iterable of tensors, got {shown(module_or_params)}"
        )
    out: list[torch.Tensor] = []
    seen: set[int] = set()
    for index, param in enumerate(found):
        if not isinstance(param, torch.Tensor):
            raise InvalidArgumentError(f"average_gradients: item {index} is not a tensor, got {shown(param)}")
        if id(param) not in seen:
            seen.add(id(param))
            out.append(param)
    return out


def gradient_buckets(
    params: list[torch.Tensor], bucket_mb: float, members: Sequence[int] | None = None
) -> list[list[torch.Tensor]]:
    """The gradients of ``params`` packed in order into buckets of one dtype and device, at most ``bucket_mb`` MiB.

    Parameters without a gradient are skipped. A gradient larger than a
    bucket is a bucket of its own. A ``DTensor`` gradient (FSDP2, tensor
    parallelism) stands for its local shard (`local_gradient`; ``members``: the
    ranks it is averaged with).

    Raises:
        InvalidArgumentError: ``bucket_mb`` is not a positive number, a gradient is
            sparse or of an integer or bool dtype, or a DTensor gradient whose local
            shards differ among ``members``.

    Examples:
        >>> ps = [torch.zeros(3, requires_grad=True) for _ in range(3)]
        >>> for p in ps[:2]: p.grad = torch.ones(3)
        >>> [len(bucket) for bucket in gradient_buckets(ps, bucket_mb=25)]
        [2]
    """
    limit = check_number("average_gradients", "bucket_mb", bucket_mb, positive=True) * 2**20
    open_buckets: dict[tuple[torch.dtype, torch.device], tuple[list[torch.Tensor], list[int]]] = {}
    buckets: list[list[torch.Tensor]] = []
    for index, param in enumerate(params):
        if param.grad is None:
            continue
        grad = local_gradient(param.grad, index, members or ())
        if grad.is_sparse:
            raise InvalidArgumentError(
                f"average_gradients: a parameter of shape {list(param.shape)} has a sparse gradient; "
                "only dense gradients are bucketed"
            )
        if not (grad.is_floating_point() or grad.is_complex()):
            raise InvalidArgumentError(
                f"average_gradients: parameter {index} (shape {list(param.shape)}) has a gradient of dtype "
                f"{grad.dtype}, which an average cannot be written back to; expected a floating-point gradient"
            )
        size = grad.numel() * grad.element_size()
        bucket, used = open_buckets.setdefault((grad.dtype, grad.device), ([], [0]))
        if bucket and used[0] + size > limit:
            buckets.append(bucket)
            bucket, used = open_buckets[(grad.dtype, grad.device)] = ([], [0])
        bucket.append(grad)
        used[0] += size
    buckets.extend(bucket for bucket, _ in open_buckets.values() if bucket)
    return buckets


def local_gradient(grad: torch.Tensor, index: int, members: Sequence[int]) -> torch.Tensor:
    """The tensor to average for one gradient: itself, or a ``DTensor``'s local shard (sharing its storage).

    Averaging local shards over a family is right where the family's ranks hold
    the same shard: each ``Shard`` placement's mesh dim must give every member
    in the mesh the caller's coordinate (tensor parallelism, averaged over
    ``dp``). FSDP2's parameters are sharded over the data-parallel ranks (and
    FSDP2 reduces their gradients itself): averaging them over those ranks
    would mix different parts, and is refused; so is a ``Partial`` gradient
    (a reduction still pending).

    Raises:
        InvalidArgumentError: the members hold different shards, or a ``Partial`` placement.

    Examples:
        >>> local_gradient(torch.ones(2), 0, [0, 1]).tolist()
        [1.0, 1.0]
    """
    if not _is_dtensor(grad):
        return grad
    dtensor: Any = grad  # a DTensor (its class is not imported here: `_is_dtensor`)
    mesh = dtensor.device_mesh
    names = mesh.mesh_dim_names or tuple(str(dim) for dim in range(mesh.ndim))
    where = {int(rank): coordinate for coordinate, rank in np.ndenumerate(mesh.mesh.cpu().numpy())}
    mine = where.get(dist.get_rank())
    for dim, placement in enumerate(dtensor.placements):
        what = f"parameter {index} (shape {list(grad.shape)}) has a DTensor gradient {shown(placement)} over mesh dim"
        if placement.is_partial():
            raise InvalidArgumentError(
                f"{what} {names[dim]!r}, a reduction still pending: redistribute it to Shard or Replicate first"
            )
        apart = [m for m in members if mine is not None and m in where and where[m][dim] != mine[dim]]
        if placement.is_shard() and apart:
            raise InvalidArgumentError(
                f"{what} {names[dim]!r}: ranks {sorted({*apart, dist.get_rank()})} of this family hold different "
                "shards, and averaging them would mix different parts; pass parameters the family replicates "
                "(tensor-parallel shards over dp), or let FSDP2 reduce its own gradients"
            )
    local: torch.Tensor = dtensor.to_local()
    return local


def _layout_of(buckets: list[list[torch.Tensor]]) -> tuple[int, int, int, int]:
    """What members of a data-parallel group must agree on: gradients, elements, their shapes and dtypes, buckets."""
    grads = [grad for bucket in buckets for grad in bucket]
    described = (
        ";".join(f"{grad.dtype}{list(grad.shape)}" for grad in grads) + "|" + ",".join(map(str, map(len, buckets)))
    )
    return len(grads), sum(grad.numel() for grad in grads), check_code(described), len(buckets)


class Gradients(Facet):
    """Gradient averaging over a family (a facet object of ``HyperCommGrid``)."""

    def average_gradients(self, module_or_params: object, dims: Dims = "dp", *, bucket_mb: float = 25) -> None:
        """Average the gradients of a module's parameters in place over the caller's group of ``dims``.

        Flattens the gradients into buckets (``gradient_buckets``: one dtype
        and device each, at most ``bucket_mb`` MiB), runs one all-reduce per
        bucket and copies the averages back into each ``.grad``. Uses
        ``ReduceOp.AVG`` where the backend has it (NCCL), else a sum divided by
        the group size (gloo). Parameters without a gradient are skipped: every
        member of the group must have gradients on the same parameters, in the
        same order, as with any data-parallel reduction. Collective over the
        group; the first call on a family also creates it.

        Args:
            module_or_params: a ``torch.nn.Module``, or an iterable of parameters
                (a tensor listed twice is averaged once).
            dims: the family to average over (default ``"dp"``).
            bucket_mb: the largest bucket, in MiB (default 25, as DDP).

        Returns:
            ``None``; the gradients are changed in place.

        Raises:
            DimsError: unknown, repeated or no dims.
            InvalidArgumentError: not a module or tensors, a sparse or integer gradient, or a bad ``bucket_mb``.
            RankError: the caller is outside the grid.
            CollectiveMismatchError: (checked collectives) the members' gradients differ in
                count, shape, dtype or buckets, or their calls can never meet.
            RankFailure: a member is gone (torch's error is its ``__cause__``).

        Examples:
            >>> import torch, torch.distributed as dist
            >>> from hypergrid import HyperCommGrid
            >>> dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
            >>> grid, model = HyperCommGrid([1, 1], ["tp", "dp"]), torch.nn.Linear(2, 1)
            >>> model(torch.ones(1, 2)).sum().backward()
            >>> grid.average_gradients(model, "dp"); model.weight.grad.tolist()
            [[1.0, 1.0]]
            >>> grid.destroy(); dist.destroy_process_group()
        """
        grid, rank = self._core.grid, dist.get_rank()
        members = grid.layout.group_ranks(dims, rank) if grid.layout.contains(rank) else None
        try:
            buckets = gradient_buckets(_parameters(module_or_params), bucket_mb, members)  # every check first
        except HyperGridError as error:
            if not self._core.root.check_collectives:
                raise
            # Compared all the same, so that the other members raise too instead of waiting: then raised here.
            compare_call(grid, "average_gradients", dims, None, aux=(-2, check_code(first_line(error))))
            raise
        if self._core.root.check_collectives:
            compare_call(grid, "average_gradients", dims, None, aux=_layout_of(buckets))
        group = member_pg(grid, dims, "average_gradients")
        size = dist.get_world_size(group)
        op = dist.ReduceOp.AVG if dist.get_backend(group) in _BACKENDS_WITH_AVG else dist.ReduceOp.SUM
        what, alarm = f"average_gradients over {shown(dims)}", self._alarm("average_gradients")
        for grads in buckets:
            flat = torch.cat([grad.detach().reshape(-1) for grad in grads])
            communicate(alarm, what, dist.all_reduce, flat, op=op, group=group)
            if op == dist.ReduceOp.SUM:
                flat.div_(size)
            offset = 0
            with torch.no_grad():
                for grad in grads:
                    grad.copy_(flat[offset : offset + grad.numel()].view_as(grad))
                    offset += grad.numel()
