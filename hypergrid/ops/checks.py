"""Checked collectives: the members of a group compare each call before it runs, by family and call number.

With checking on (``HyperCommGrid(..., check_collectives=True)`` or ``HYPERGRID_CHECK_COLLECTIVES=1``), each
collective of the grid turns its call into a fixed-size row of int64 (`signature`: its family, its call number on
that family, and everything its local checks depend on), gathers the rows of the group with one small
``all_gather`` on the same group (`compare_calls`) and, where they differ, raises `CollectiveMismatchError` on
every member, naming each distinct call and its ranks; docs/reliability.md lists what a row holds. Calls that can
never meet are found by `hypergrid.ops.deadlocks`.
"""

from __future__ import annotations

import os
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from hypergrid.binding.facet import member_pg
from hypergrid.binding.failures import communicate
from hypergrid.binding.registry import guard_key
from hypergrid.errors import CollectiveMismatchError, InvalidArgumentError
from hypergrid.ops.deadlocks import Pending, wait_comparing
from hypergrid.values import as_int, format_ranks, shown

__all__ = [
    "ENV_VARIABLE",
    "all_gather_single",
    "check_collectives_flag",
    "check_reduce_op",
    "CallLedger",
    "check_code",
    "compare_calls",
    "family_code",
    "signature",
    "tensor_code",
]

#: The environment variable read (once, when a grid is built) to turn checking on.
ENV_VARIABLE = "HYPERGRID_CHECK_COLLECTIVES"
_ON, _OFF = ("1", "true", "yes", "on"), ("", "0", "false", "no", "off")

# torch 2.13 renamed the single-tensor all-gather; older releases (>= 2.4) have only the old name.
all_gather_single: Any = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor

#: Sizes of the first dims kept in a row; the rest of a longer shape is folded into one checksum.
#: A row: rank, family, call number, then the signature: call, op, type or dtype, device type, layout, ndim,
#: numel, first sizes, checksum of the rest, extra, and four fields of the call's own (average_gradients, exchange).
_SHOWN_DIMS = 6
_AUX = 4
_EXTRA = {"all_gather": "dim", "reduce_scatter": "dim", "broadcast": "group_src"}
_CALLS: tuple[str, ...] = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "barrier")
_CALLS += ("hierarchical_all_reduce", "average_gradients", "exchange")
_DTYPES = {str(value) for value in vars(torch).values() if isinstance(value, torch.dtype)}
_NAMES = {*_DTYPES, "cpu", "cuda", "xpu", "mps", "hpu", "meta", "torch.strided", "torch.sparse_coo", "torch.sparse_csr"}
_NAMES |= {f"a {kind}" for kind in ("list", "tuple", "NoneType", "int", "float", "str", "dict", "ndarray")}
_NAMES |= set(_CALLS)


def check_code(text: str) -> int:
    """A stable number for a name (the same in every process, unlike ``hash``).

    Examples:
        >>> check_code("all_reduce") == check_code("all_reduce"), check_code("tp") == check_code("dp")
        (True, False)
    """
    return zlib.crc32(text.encode())


_code = check_code


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


def signature(call: str, tensor: object, op: object = None, extra: object = None, aux: Sequence[int] = ()) -> list[int]:
    """The row of int64 that members compare for one call (`compare_calls` adds rank, family and call number).

    Args:
        call: the collective's name.
        tensor: what the caller passed (any object: a non-tensor gets a row of its own).
        op: the reduction, or None for a collective without one.
        extra: ``dim`` or ``group_src``, or None.
        aux: up to four fields of the call's own (``average_gradients``, ``exchange``).

    Examples:
        >>> a = signature("all_reduce", torch.ones(2, 3), dist.ReduceOp.SUM)
        >>> a == signature("all_reduce", torch.zeros(2, 3), dist.ReduceOp.SUM), len(a)
        (True, 19)
        >>> a == signature("all_reduce", torch.ones(3, 2), dist.ReduceOp.SUM)
        False
    """
    head = [_code(call), _op_code(op)]
    number = as_int(extra)
    extra_code = -1 if extra is None else number if number is not None and abs(number) < 2**62 else _code(repr(extra))
    tail = [*aux, *[-1] * (_AUX - len(aux))]
    if not isinstance(tensor, torch.Tensor):
        kind = -1 if tensor is None else _code(f"a {type(tensor).__name__}")
        return [*head, kind, -1, -1, -1, -1, *[-1] * _SHOWN_DIMS, -1, extra_code, *tail]
    shape = list(tensor.shape)
    sizes = shape[:_SHOWN_DIMS] + [-1] * (_SHOWN_DIMS - len(shape[:_SHOWN_DIMS]))
    rest = _code(str(shape[_SHOWN_DIMS:])) if len(shape) > _SHOWN_DIMS else -1
    kind_codes = [_code(str(tensor.dtype)), _code(tensor.device.type), _code(str(tensor.layout))]
    return [*head, *kind_codes, tensor.dim(), tensor.numel(), *sizes, rest, extra_code, *tail]


def tensor_code(tensor: object) -> int:
    """One number for what a tensor is (dtype and shape; -1 for None): what two stages of ``exchange`` must agree on.

    Examples:
        >>> tensor_code(torch.ones(2, 3)) == tensor_code(torch.zeros(2, 3)), tensor_code(None)
        (True, -1)
    """
    if tensor is None:
        return -1
    if isinstance(tensor, torch.Tensor):
        return _code(f"{tensor.dtype} {list(tensor.shape)}")
    return _code(f"a {type(tensor).__name__}")


def family_code(family: str) -> int:
    """The number standing for a family's registry key (as the guard writes it) in a row."""
    return _code(f"family {family}")


@dataclass
class CallLedger:
    """How many checked calls this rank started on each family of one grid, in the grid's current epoch.

    ``broken``: the verdict of calls that could never meet (`hypergrid.ops.deadlocks`): every later
    checked call of the grid raises it, until ``destroy()`` starts the next epoch.
    """

    epoch: int = 0
    counts: dict[str, int] = field(default_factory=dict)
    broken: CollectiveMismatchError | None = None

    def start(self, family: str, epoch: int) -> int:
        """The call number of a new call on ``family`` (0 for the first of the epoch); count it."""
        if epoch != self.epoch:
            self.epoch, self.counts, self.broken = epoch, {}, None
        number = self.counts.get(family, 0)
        self.counts[family] = number + 1
        return number


def compare_call(
    grid: Any,
    call: str,
    dims: Any,
    tensor: object,
    op: object = None,
    extra: object = None,
    aux: Sequence[int] = (),
    pairing: Pairing | None = None,
) -> None:
    """With checked collectives on: create the family if needed and compare this call across the group."""
    if grid._core.root.check_collectives:
        group = member_pg(grid, dims, call)
        family = guard_key(grid._core.key(dims, None, None, None, None))
        fields = signature(call, tensor, op, extra, aux)
        compare_calls(grid, family, [(group, family)], fields, tensor, call, dims, pairing)


def ledger_of(root: Any) -> CallLedger:
    """The `CallLedger` of a root grid (it holds one from its construction)."""
    found: CallLedger = root._core.call_ledger
    return found


def _describe(row: Sequence[int], names: dict[int, str]) -> str:
    """One gathered row (rank dropped) as the call it stands for."""
    family, number, call, op, kind, device, layout, ndim, numel, *sizes = row
    shown_sizes, rest, extra, aux = sizes[:_SHOWN_DIMS], sizes[_SHOWN_DIMS], sizes[_SHOWN_DIMS + 1], sizes[-_AUX:]
    name = _DECODE.get(call, f"call #{call}")
    parts = [f"over {names.get(family, f'family #{family}')!r}", f"call #{number} there"]
    if op != -1:
        names_of_ops = {value.value: name for name, value in dist.ReduceOp.RedOpType.__members__.items()}
        parts.append(f"op={names_of_ops.get(op, f'not a ReduceOp (#{op})')}")
    if name == "average_gradients":
        parts.append(f"{aux[0]} gradients of {aux[1]} elements in {aux[3]} buckets (layout #{aux[2]})")
    elif name == "exchange":
        parts.append("sends and receives " + ", ".join("none" if code == -1 else f"#{code}" for code in aux))
    elif ndim == -1 and kind != -1:
        parts.append(f"tensor={_DECODE.get(kind, f'not a tensor (#{kind})')}")
    elif ndim != -1:
        shape = [size for size in shown_sizes[:ndim]] + (["..."] if rest != -1 else [])
        parts += [f"shape={shape}", f"dtype={_DECODE.get(kind, kind)}", f"device={_DECODE.get(device, device)}"]
        if _DECODE.get(layout) != "torch.strided":
            parts.append(f"layout={_DECODE.get(layout, layout)}")
    if name in _EXTRA:
        parts.append(f"{_EXTRA[name]}={extra}")
    del numel  # implied by the shape
    return f"{name}({', '.join(parts)})"


def _device(group: dist.ProcessGroup, tensor: object) -> torch.device:
    """Where the row must live for the group's backend: the CPU unless only an accelerator backend serves it."""
    backend = str(dist.get_backend(group))
    if backend in ("gloo", "mpi", "ucc", "fake") or "cpu:" in backend:
        return torch.device("cpu")
    if isinstance(tensor, torch.Tensor) and tensor.device.type != "cpu":
        return tensor.device
    return torch.device("cuda", torch.cuda.current_device())


#: Checks the gathered rows of a call beyond equality (``exchange``: each neighbour pair); returns a problem or None.
Pairing = Callable[[list[list[int]]], "str | None"]


def compare_calls(
    grid: Any,
    family: str,
    halves: Sequence[tuple[dist.ProcessGroup, str]],
    fields: list[int],
    tensor: object,
    call: str,
    dims: object,
    pairing: Pairing | None = None,
) -> None:
    """Gather every member's row over the groups of ``halves`` in turn; raise on every member where they differ.

    Args:
        grid: the grid whose call it is (its root counts the calls per family).
        family: the call's family, as the guard writes its key (``"dp-tp"``, ``"expert:ep"``, ``"dp@ag"``).
        halves: the groups to gather over, each with the family it belongs to (a hierarchy's halves: two).
        fields: the call's `signature`.
        tensor: the tensor (where the row must live).
        call, dims: for messages.
        pairing: rows that need not be equal (``exchange``) are checked by it instead.

    One group: one ``all_gather`` of a few int64. Several (a hierarchy's halves,
    inside nodes then across): each gather carries the rows gathered so far, so
    every member of the family ends with every row. A comparison still waiting
    after `hypergrid.ops.deadlocks.TICK_S` looks for calls that can never meet.

    Raises:
        CollectiveMismatchError: the rows differ (the message names each
            distinct call and the ranks that made it), or the calls can never meet.
        RankFailure: a member is gone (the gather failed because of it).
    """
    root = grid._core.root
    ledger = ledger_of(root)
    number = ledger.start(family, root._core.epoch)
    if ledger.broken is not None:
        raise ledger.broken
    row = [dist.get_rank(), family_code(family), number, *fields]
    rows = torch.tensor([row], dtype=torch.int64, device=_device(halves[0][0], tensor))
    what = f"{call} over {shown(dims)} (comparing the call)"
    alarm = grid._core.world_for(what).alarm

    def description() -> str:
        return _describe(row[1:], {family_code(family): family})

    for group, waits_in in halves:
        gathered = rows.new_empty((dist.get_world_size(group) * rows.shape[0], rows.shape[1]))
        work = communicate(alarm, what, all_gather_single, gathered, rows, group=group, async_op=True)
        pending = Pending(root, family, number, waits_in, description, dict(ledger.counts))
        try:
            wait_comparing(work, what, pending, rows.device.type == "cpu")
        except CollectiveMismatchError as error:
            ledger.broken = error
            raise
        rows = gathered
    table = rows.tolist()
    if pairing is None or not same_head(table):
        problem = None if all(values[1:] == table[0][1:] for values in table) else "called differently"
    else:
        problem = pairing(table)
    if problem is None:
        return  # the usual case: nothing to describe
    names = {family_code(text): text for text in (family, *(text for _, text in halves))}
    names.update({family_code(text): text for text in _families_of(root)})
    calls: dict[str, list[int]] = {}
    for rank, *values in table:
        calls.setdefault(_describe(values, names), []).append(rank)
    listed = "; ".join(f"{text} on rank(s) {format_ranks(ranks)}" for text, ranks in calls.items())
    raise CollectiveMismatchError(
        f"{call} over dims {shown(dims)}: the members of the group {problem}: {listed}. Every member must make "
        "the same calls over the same families in the same order, with the same op, shape, dtype and device "
        "type (checked collectives); nothing else was sent",
        {text: sorted(ranks) for text, ranks in calls.items()},
    )


def same_head(table: list[list[int]]) -> bool:
    """Whether the gathered rows agree on everything but the call's own fields."""
    return all(row[1:-_AUX] == table[0][1:-_AUX] for row in table)


def _families_of(root: Any) -> list[str]:
    return [guard_key(key) for key in root._core.registry.families]
