"""The tensor arguments of the ops: checked before any communication, each error naming the call and the value."""

from __future__ import annotations

import torch

from hypergrid.errors import InvalidArgumentError
from hypergrid.validation import refuse
from hypergrid.values import as_int

__all__ = ["check_tensor", "tensor_dim"]


def tensor_dim(tensor: object, dim: object, what: str) -> int:
    """``dim`` of ``tensor`` as a non-negative index, checked.

    Raises:
        InvalidArgumentError: ``tensor`` is not a tensor with at least one dim,
            or ``dim`` is not an int in ``-ndim .. ndim-1``.

    Examples:
        >>> tensor_dim(torch.zeros(2, 3), -1, "all_gather")
        1
    """
    if not isinstance(tensor, torch.Tensor) or tensor.dim() == 0:
        raise refuse(what, "tensor", tensor, "a torch.Tensor with at least one dim")
    ndim = tensor.dim()
    index = as_int(dim)
    if index is None or not -ndim <= index < ndim:
        raise refuse(
            what, "dim", dim, f"an int in {-ndim}..{ndim - 1} (a dim of a tensor of shape {list(tensor.shape)})"
        )
    return index % ndim


def check_tensor(tensor: object, what: str, dense: bool = False, written: bool = False) -> torch.Tensor:
    """``tensor`` if it is a tensor; with ``dense`` a strided one; with ``written`` one whose elements own memory."""
    if not isinstance(tensor, torch.Tensor):
        raise refuse(what, "tensor", tensor, "a torch.Tensor")
    if dense and tensor.layout != torch.strided:
        raise InvalidArgumentError(
            f"{what} needs a dense (strided) tensor, got a {tensor.layout} tensor of shape {list(tensor.shape)}; "
            "pass tensor.to_dense()"
        )
    if written and any(stride == 0 and size > 1 for stride, size in zip(tensor.stride(), tensor.shape)):
        raise InvalidArgumentError(
            f"{what} writes its result into the tensor, but this one (shape {list(tensor.shape)}, strides "
            f"{list(tensor.stride())}) is expanded: several elements share one memory location; pass tensor.clone()"
        )
    return tensor
