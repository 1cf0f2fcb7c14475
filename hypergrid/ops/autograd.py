"""Tensor-parallel mappings as autograd functions over any family of a grid (Megatron's, on any dims).

Each function is differentiable: its backward is the communication that makes
gradients right when the forward's result is used the way tensor parallelism
uses it.

| function | forward | backward |
|---|---|---|
| `copy_to(x, grid, dims)` | identity | all-reduce |
| `reduce_from(x, grid, dims)` | all-reduce | identity |
| `scatter_to(x, grid, dims, dim=-1)` | keep own chunk | all-gather |
| `gather_from(x, grid, dims, dim=-1)` | all-gather | keep own chunk |
| `reduce_scatter_to(x, grid, dims, dim=0)` | reduce-scatter | all-gather |
| `gather_from_sequence(x, grid, dims, dim=0)` | all-gather | reduce-scatter |

Chunks follow the family's group order (``grid.group_ranks(dims)``). The
collectives run through the grid's ``pg(dims)``: create the family on every
rank that takes part in creation before the first backward, since a backward
may run the first collective on a family.

Examples:
    A column-parallel then row-parallel MLP on a one-rank world:

    >>> import torch, torch.distributed as dist
    >>> from hypergrid import HyperCommGrid
    >>> dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    >>> grid = HyperCommGrid([1], ["tp"])
    >>> x = torch.ones(2, 4, requires_grad=True)
    >>> hidden = copy_to(x, grid, "tp") @ torch.ones(4, 8)
    >>> y = reduce_from(hidden @ torch.ones(8, 4), grid, "tp")
    >>> y.sum().backward(); x.grad[0].tolist()
    [32.0, 32.0, 32.0, 32.0]
    >>> grid.destroy(); dist.destroy_process_group()
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import torch

from hypergrid.errors import public
from hypergrid.ops.tensors import tensor_dim
from hypergrid.validation import refuse

if TYPE_CHECKING:
    from hypergrid.layout import Dims, GridLayout

__all__ = ["copy_to", "gather_from", "gather_from_sequence", "reduce_from", "reduce_scatter_to", "scatter_to"]


@runtime_checkable
class CollectiveGrid(Protocol):
    """What the mappings use of a grid: a ``HyperCommGrid`` (its collectives: ``hypergrid.ops.collectives``)."""

    layout: GridLayout
    all_reduce: Callable[..., Any]
    all_gather: Callable[..., torch.Tensor]
    reduce_scatter: Callable[..., torch.Tensor]
    own_chunk: Callable[..., torch.Tensor]


def _all_reduce(x: torch.Tensor, grid: CollectiveGrid, dims: Dims) -> torch.Tensor:
    out = x.contiguous().clone()  # never reduce autograd's own buffers in place
    grid.all_reduce(out, dims)
    return out


class _CopyTo(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, grid: CollectiveGrid, dims: Dims) -> torch.Tensor:
        ctx.grid, ctx.dims = grid, dims
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        return _all_reduce(grad, ctx.grid, ctx.dims), None, None


class _ReduceFrom(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, grid: CollectiveGrid, dims: Dims) -> torch.Tensor:
        return _all_reduce(x, grid, dims)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        return grad, None, None


class _Split(torch.autograd.Function):
    """Keep own chunk forward; all-gather backward (``scatter_to``)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, grid: CollectiveGrid, dims: Dims, dim: int) -> torch.Tensor:
        ctx.grid, ctx.dims, ctx.dim = grid, dims, dim
        return grid.own_chunk(x, dims, dim).contiguous()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None, None]:
        return ctx.grid.all_gather(grad, ctx.dims, ctx.dim), None, None, None


class _Gather(torch.autograd.Function):
    """All-gather forward; keep own chunk (``gather_from``) or reduce-scatter (sequence) backward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, grid: CollectiveGrid, dims: Dims, dim: int, reduce: bool) -> torch.Tensor:
        ctx.grid, ctx.dims, ctx.dim, ctx.reduce = grid, dims, dim, reduce
        return grid.all_gather(x, dims, dim)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None, None, None]:
        grid, dims, dim = ctx.grid, ctx.dims, ctx.dim
        out = grid.reduce_scatter(grad, dims, dim=dim) if ctx.reduce else grid.own_chunk(grad, dims, dim).contiguous()
        return out, None, None, None, None


class _ReduceScatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, grid: CollectiveGrid, dims: Dims, dim: int) -> torch.Tensor:
        ctx.grid, ctx.dims, ctx.dim = grid, dims, dim
        return grid.reduce_scatter(x, dims, dim=dim)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None, None]:
        return ctx.grid.all_gather(grad, ctx.dims, ctx.dim), None, None, None


def _apply(function: type[torch.autograd.Function], *args: Any) -> torch.Tensor:
    out: torch.Tensor = function.apply(*args)  # type: ignore[no-untyped-call]
    return out


def _checked(x: torch.Tensor, grid: CollectiveGrid, dims: Dims, dim: int | None, what: str) -> int:
    if not isinstance(x, torch.Tensor):
        raise refuse(what, "x", x, "a torch.Tensor")
    if not isinstance(grid, CollectiveGrid):
        raise refuse(what, "grid", grid, "a HyperCommGrid")
    grid.layout.key(dims)  # DimsError before any communication
    return 0 if dim is None else tensor_dim(x, dim, what)


@public
def copy_to(x: torch.Tensor, grid: CollectiveGrid, dims: Dims) -> torch.Tensor:
    """Identity forward, all-reduce of the gradient over the family backward (enter a tensor-parallel region).

    Raises:
        DimsError: unknown, repeated or no dims.
        RankError: (backward) the caller is outside the grid.
    """
    _checked(x, grid, dims, None, "copy_to")
    return _apply(_CopyTo, x, grid, dims)


@public
def reduce_from(x: torch.Tensor, grid: CollectiveGrid, dims: Dims) -> torch.Tensor:
    """All-reduce (sum) over the family forward, identity backward (leave a row-parallel layer).

    Raises:
        DimsError: unknown, repeated or no dims.
        RankError: the caller is outside the grid.
    """
    _checked(x, grid, dims, None, "reduce_from")
    return _apply(_ReduceFrom, x, grid, dims)


@public
def scatter_to(x: torch.Tensor, grid: CollectiveGrid, dims: Dims, dim: int = -1) -> torch.Tensor:
    """Keep this rank's chunk along ``dim`` forward, all-gather the gradient backward.

    Raises:
        DimsError: unknown, repeated or no dims.
        InvalidArgumentError: a bad ``dim`` or a size along it the group size does not divide.
        RankError: the caller is outside the grid.
    """
    index = _checked(x, grid, dims, dim, "scatter_to")
    return _apply(_Split, x, grid, dims, index)


@public
def gather_from(x: torch.Tensor, grid: CollectiveGrid, dims: Dims, dim: int = -1) -> torch.Tensor:
    """All-gather along ``dim`` forward, keep this rank's chunk of the gradient backward.

    For a result every member then uses identically (the output of a
    column-parallel layer); after an all-gather whose result feeds
    rank-specific work, use ``gather_from_sequence``.

    Raises:
        DimsError: unknown, repeated or no dims.
        InvalidArgumentError: a bad ``dim``.
        RankError: the caller is outside the grid.
    """
    index = _checked(x, grid, dims, dim, "gather_from")
    return _apply(_Gather, x, grid, dims, index, False)


@public
def reduce_scatter_to(x: torch.Tensor, grid: CollectiveGrid, dims: Dims, dim: int = 0) -> torch.Tensor:
    """Reduce-scatter (sum) along ``dim`` forward, all-gather the gradient backward (sequence parallel).

    Raises:
        DimsError: unknown, repeated or no dims.
        InvalidArgumentError: a bad ``dim`` or a size along it the group size does not divide.
        RankError: the caller is outside the grid.
    """
    index = _checked(x, grid, dims, dim, "reduce_scatter_to")
    return _apply(_ReduceScatter, x, grid, dims, index)


@public
def gather_from_sequence(x: torch.Tensor, grid: CollectiveGrid, dims: Dims, dim: int = 0) -> torch.Tensor:
    """All-gather along ``dim`` forward, reduce-scatter the gradient backward (enter a sequence-parallel block).

    The counterpart of ``reduce_scatter_to``: the gathered sequence feeds
    rank-specific (column-parallel) work, so each chunk's gradient is the sum
    of every member's.

    Raises:
        DimsError: unknown, repeated or no dims.
        InvalidArgumentError: a bad ``dim``.
        RankError: the caller is outside the grid.
    """
    index = _checked(x, grid, dims, dim, "gather_from_sequence")
    return _apply(_Gather, x, grid, dims, index, True)
