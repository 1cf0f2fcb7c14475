"""Checked collectives: the members of a group compare each call before it runs.

torch leaves a collective whose members disagree (another op, shape, dtype or
device on one rank) undefined: gloo returns garbage, hangs or aborts the
process. With checking on (``HyperCommGrid(..., check_collectives=True)`` or
``HYPERGRID_CHECK_COLLECTIVES=1`` when the grid is built), each collective of
the grid first turns its call into a fixed-size row of int64 (`signature`),
gathers the rows of the group with one small ``all_gather`` on the same group
(`compare_calls`) and, where they differ, raises `CollectiveMismatchError` on
every member, naming each distinct call and its ranks. Device indices are not
compared (every rank has its own GPU); device types are.

The row holds everything the collective's local checks depend on (whether it
is a tensor, its shape, dtype, layout, the op, ``dim`` or ``group_src``), so
once the rows agree every member passes or fails those checks alike.
"""

from __future__ import annotations

import os
import zlib
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist

from hypergrid.binding.failures import communicate
from hypergrid.errors import CollectiveMismatchError, InvalidArgumentError
from hypergrid.values import as_int, format_ranks, shown

__all__ = [
    "ENV_VARIABLE",
    "all_gather_single",
    "check_collectives_flag",
    "check_reduce_op",
    "compare_calls",
    "signature",
]

#: The environment variable read (once, when a grid is built) to turn checking on.
ENV_VARIABLE = "HYPERGRID_CHECK_COLLECTIVES"
_ON, _OFF = ("1", "true", "yes", "on"), ("", "0", "false", "no", "off")

# torch 2.13 renamed the single-tensor all-gather; older releases (>= 2.4) have only the old name.
all_gather_single: Any = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor

#: Sizes of the first dims kept in a row; the rest of a longer shape is folded into one checksum.
#: A row: rank, call, op, type or dtype, device type, layout, ndim, numel, first sizes, checksum of the rest, extra.
_SHOWN_DIMS = 6
_EXTRA = {"all_gather": "dim", "reduce_scatter": "dim", "broadcast": "group_src"}
_DTYPES = {str(value) for value in vars(torch).values() if isinstance(value, torch.dtype)}
_NAMES = {*_DTYPES, "cpu", "cuda", "xpu", "mps", "hpu", "meta", "torch.strided", "torch.sparse_coo", "torch.sparse_csr"}
_NAMES |= {f"a {kind}" for kind in ("list", "tuple", "NoneType", "int", "float", "str", "dict", "ndarray")}


def _code(text: str) -> int:
    """A stable number for a name (the same in every process, unlike ``hash``)."""
    return zlib.crc32(text.encode())


_DECODE = {_code(name): name for name in _NAMES}


def check_collectives_flag(value: object) -> bool:
    """Whether collectives are checked: ``value``, or ``HYPERGRID_CHECK_COLLECTIVES`` when it is None.

    Raises:
        InvalidArgumentError: ``value`` is not a bool or None, or the variable is
            set to something other than 1/true/yes/on or 0/false/no/off.

    Examples:
        >>> check_collectives_flag(True), check_collectives_flag(False)
        (True, False)
    """
    if isinstance(value, bool):
        return value
    if value is not None:
        raise InvalidArgumentError(
            f"check_collectives must be True, False or None (read {ENV_VARIABLE}), got {shown(value)}"
        )
    text = os.environ.get(ENV_VARIABLE, "").strip().lower()
    if text not in (*_ON, *_OFF):
        raise InvalidArgumentError(
            f"{ENV_VARIABLE}={shown(os.environ[ENV_VARIABLE])}: expected one of {list(_ON)} (on) or "
            f"{list(_OFF[1:])} (off)"
        )
    return text in _ON


def check_reduce_op(op: object, what: str) -> None:
    """Refuse a reduction that is not a ``torch.distributed.ReduceOp`` (torch would raise a bare TypeError).

    Raises:
        InvalidArgumentError: ``op`` is anything else, such as the string ``"sum"``.

    Examples:
        >>> check_reduce_op(dist.ReduceOp.MAX, "all_reduce")
        >>> check_reduce_op("sum", "all_reduce")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
          ...
        hypergrid.errors.InvalidArgumentError: all_reduce: op='sum' is not a torch.distributed.ReduceOp; expected ...
    """
    if not isinstance(op, (dist.ReduceOp, dist.ReduceOp.RedOpType)):
        raise InvalidArgumentError(
            f"{what}: op={shown(op)} is not a torch.distributed.ReduceOp; expected one such as "
            "torch.distributed.ReduceOp.SUM or ReduceOp.MAX"
        )


def _op_code(op: object) -> int:
    if op is None:
        return -1
    if isinstance(op, dist.ReduceOp.RedOpType):
        code: int = op.value
        return code
    return _code(f"op {shown(op)}" if not isinstance(op, dist.ReduceOp) else "a custom ReduceOp")


def signature(call: str, tensor: object, op: object = None, extra: object = None) -> list[int]:
    """The row of int64 that members compare for one call (without the rank, which the gather adds).

    Args:
        call: the collective's name.
        tensor: what the caller passed (any object: a non-tensor gets a row of its own).
        op: the reduction, or None for a collective without one.
        extra: ``dim`` or ``group_src``, or None.

    Examples:
        >>> a = signature("all_reduce", torch.ones(2, 3), dist.ReduceOp.SUM)
        >>> a == signature("all_reduce", torch.zeros(2, 3), dist.ReduceOp.SUM), len(a)
        (True, 15)
        >>> a == signature("all_reduce", torch.ones(3, 2), dist.ReduceOp.SUM)
        False
    """
    head = [_code(call), _op_code(op)]
    number = as_int(extra)
    extra_code = -1 if extra is None else number if number is not None and abs(number) < 2**62 else _code(repr(extra))
    if not isinstance(tensor, torch.Tensor):
        return [*head, _code(f"a {type(tensor).__name__}"), -1, -1, -1, -1, *[-1] * _SHOWN_DIMS, -1, extra_code]
    shape = list(tensor.shape)
    shown = shape[:_SHOWN_DIMS] + [-1] * (_SHOWN_DIMS - len(shape[:_SHOWN_DIMS]))
    rest = _code(str(shape[_SHOWN_DIMS:])) if len(shape) > _SHOWN_DIMS else -1
    kind = [_code(str(tensor.dtype)), _code(tensor.device.type), _code(str(tensor.layout))]
    return [*head, *kind, tensor.dim(), tensor.numel(), *shown, rest, extra_code]


def _describe(row: Sequence[int], call: str) -> str:
    """One gathered row (rank dropped) as the call it stands for."""
    _, op, kind, device, layout, ndim, numel, *sizes = row
    shown, rest, extra = sizes[:_SHOWN_DIMS], sizes[_SHOWN_DIMS], sizes[_SHOWN_DIMS + 1]
    parts = []
    if op != -1:
        names = {value.value: name for name, value in dist.ReduceOp.RedOpType.__members__.items()}
        parts.append(f"op={names.get(op, f'not a ReduceOp (#{op})')}")
    if ndim == -1:
        parts.append(f"tensor={_DECODE.get(kind, f'not a tensor (#{kind})')}")
    else:
        shape = [size for size in shown[:ndim]] + (["..."] if rest != -1 else [])
        parts += [f"shape={shape}", f"dtype={_DECODE.get(kind, kind)}", f"device={_DECODE.get(device, device)}"]
        if _DECODE.get(layout) != "torch.strided":
            parts.append(f"layout={_DECODE.get(layout, layout)}")
    if call in _EXTRA:
        parts.append(f"{_EXTRA[call]}={extra}")
    del numel  # implied by the shape
    return f"{call}({', '.join(parts)})"


def _device(group: dist.ProcessGroup, tensor: object) -> torch.device:
    """Where the row must live for the group's backend: the CPU unless only an accelerator backend serves it."""
    backend = str(dist.get_backend(group))
    if backend in ("gloo", "mpi", "ucc", "fake") or "cpu:" in backend:
        return torch.device("cpu")
    if isinstance(tensor, torch.Tensor) and tensor.device.type != "cpu":
        return tensor.device
    return torch.device("cuda", torch.cuda.current_device())


def compare_calls(groups: Sequence[dist.ProcessGroup], row: list[int], tensor: object, call: str, dims: object) -> None:
    """Gather every member's row over ``groups`` in turn; raise on every member where they differ.

    One group: one ``all_gather`` of a few int64. Several (a hierarchy's halves,
    inside nodes then across): each gather carries the rows gathered so far, so
    every member of the family ends with every row.

    Raises:
        CollectiveMismatchError: the rows differ; the message names each
            distinct call and the ranks that made it.
        RankFailure: a member is gone (the gather failed because of it).
    """
    device = _device(groups[0], tensor)
    rows = torch.tensor([[dist.get_rank(), *row]], dtype=torch.int64, device=device)
    for group in groups:
        gathered = rows.new_empty((dist.get_world_size(group) * rows.shape[0], rows.shape[1]))
        communicate(f"{call} over {shown(dims)} (comparing the call)", all_gather_single, gathered, rows, group=group)
        rows = gathered
    table = rows.tolist()
    if all(fields[1:] == table[0][1:] for fields in table):
        return  # the usual case: nothing to describe
    calls: dict[str, list[int]] = {}
    for rank, *fields in table:
        calls.setdefault(_describe(fields, call), []).append(rank)
    if len(calls) > 1:
        listed = "; ".join(f"{text} on rank(s) {format_ranks(ranks)}" for text, ranks in calls.items())
        raise CollectiveMismatchError(
            f"{call} over dims {shown(dims)}: the members of the group called it differently: {listed}. Every member "
            "must pass the same op, shape, dtype and device type (checked collectives); nothing else was sent",
            {text: sorted(ranks) for text, ranks in calls.items()},
        )
