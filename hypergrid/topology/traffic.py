"""What a job sends: `Traffic` entries, and `llm_step_traffic` for one transformer training step."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from hypergrid.errors import DimsError, InvalidArgumentError, public, public_methods
from hypergrid.layout import KEY_SEPARATOR
from hypergrid.topology.cost import check_op
from hypergrid.values import as_number, is_int, shown

__all__ = ["Traffic", "llm_step_traffic"]


@public_methods
@dataclass(frozen=True, init=False)
class Traffic:
    """One kind of collective a job runs on one family, with its size and count.

    Args:
        dims: the family: a dim name, a dash-joined string (``"dp-cp"``) or a list of names.
        op: ``all_reduce``, ``all_gather``, ``reduce_scatter``, ``broadcast``,
            ``all_to_all`` or ``send_recv``.
        bytes: bytes per call per rank (the buffer; all_gather: the gathered output).
        calls: calls per step (or per whatever the plan's seconds should cover).

    Raises:
        DimsError: empty or repeated dims.
        InvalidArgumentError: an unknown op, a negative or non-finite size, a count
            that is not a non-negative int.

    Examples:
        >>> Traffic(["dp", "cp"], "all_reduce", 1e9).key
        'dp-cp'
    """

    dims: tuple[str, ...]
    op: str
    bytes: float
    calls: int
    key: str

    def __init__(self, dims: str | Sequence[str], op: str, bytes: float, calls: int = 1) -> None:
        names = (
            dims.split(KEY_SEPARATOR)
            if isinstance(dims, str)
            else list(dims)
            if isinstance(dims, (list, tuple))
            else None
        )
        if not names or not all(isinstance(name, str) and name.isidentifier() for name in names):
            raise DimsError(
                f"dims={shown(dims)}: expected a dim name, a key like 'dp-cp' or a list of names (identifiers)"
            )
        if len(set(names)) != len(names):
            raise DimsError(f"traffic dims {shown(dims)} repeat a name; name each dim once")
        check_op(op)
        size = as_number(bytes)
        if size is None or size < 0:
            raise InvalidArgumentError(f"traffic bytes must be a finite number >= 0 (a float), got {shown(bytes)}")
        if not is_int(calls) or calls < 0 or as_number(calls) is None:
            raise InvalidArgumentError(f"traffic calls must be an int >= 0 that a float can hold, got {shown(calls)}")
        set_attr = object.__setattr__
        set_attr(self, "dims", tuple(names))
        set_attr(self, "op", op)
        set_attr(self, "bytes", size)
        set_attr(self, "calls", int(calls))
        set_attr(self, "key", KEY_SEPARATOR.join(names))


def _positive(value: object, what: str, allow_zero: bool = False) -> float:
    number = as_number(value)
    if number is None or number < 0 or (number == 0 and not allow_zero):
        raise InvalidArgumentError(
            f"{what} must be a {'non-negative' if allow_zero else 'positive'} number, got {shown(value)}"
        )
    return number


@public
def llm_step_traffic(
    sizes: Mapping[str, int],
    *,
    hidden: int,
    layers: int,
    seq_len: int,
    micro_batch: int,
    params: float,
    dtype_bytes: int = 2,
    microbatches: int = 1,
    experts: int = 0,
    topk: int = 2,
) -> list[Traffic]:
    """The collectives of one training step of a transformer, per family (Megatron-LM accounting).

    Dims read from ``sizes`` (absent or 1: no traffic): ``tp``, ``cp``, ``pp``, ``dp``, ``ep``.
    With ``a = micro_batch * seq_len / cp * hidden * dtype_bytes`` (one micro-batch's
    activations on one rank) and ``L = layers / pp`` layers per stage:

    - ``tp``: all_reduce of ``a`` bytes, 4 per layer per micro-batch (2 forward, 2 backward);
    - ``cp``: all_gather of the keys and values, ``2 a / tp * cp`` bytes gathered, and a
      reduce_scatter of their gradients of the same size, each once per layer per micro-batch;
    - ``pp``: send_recv of ``a / tp`` bytes, 2 per micro-batch (activation forward, gradient back);
    - ``dp`` (``dp-cp`` when cp > 1): all_reduce of the gradients,
      ``params / (tp * pp) * dtype_bytes`` bytes, once per step;
    - ``ep`` (when ``experts`` > 0): all_to_all of ``topk * a / tp`` bytes, 4 per layer per
      micro-batch (dispatch and combine, forward and backward).

    Args:
        sizes: the dims' sizes (e.g. ``{"tp": 8, "pp": 4, "dp": 16}``).
        hidden: model width.
        layers: transformer layers.
        seq_len: tokens per sequence.
        micro_batch: sequences per micro-batch.
        params: parameter count.
        dtype_bytes: bytes per element of activations and gradients (2 for bf16).
        microbatches: micro-batches per step (gradient accumulation / pipeline).
        experts: MoE experts per layer (0: dense).
        topk: experts per token.

    Returns:
        The `Traffic` entries, one per family with traffic.

    Raises:
        InvalidArgumentError: a non-positive size or model figure.

    Examples:
        >>> [(t.key, t.op, t.calls) for t in llm_step_traffic(
        ...     {"tp": 8, "dp": 4}, hidden=4096, layers=32, seq_len=4096, micro_batch=1, params=7e9)]
        [('tp', 'all_reduce', 128), ('dp', 'all_reduce', 1)]
    """
    if not isinstance(sizes, Mapping):
        raise InvalidArgumentError(f"sizes={shown(sizes)}: expected a dict of dim name -> size, such as {{'tp': 8}}")
    for name, size in sizes.items():
        if not is_int(size) or size < 1:
            raise InvalidArgumentError(f"size of dim {shown(name)} must be a positive int, got {shown(size)}")
    figures = {
        "hidden": hidden,
        "layers": layers,
        "seq_len": seq_len,
        "micro_batch": micro_batch,
        "params": params,
        "dtype_bytes": dtype_bytes,
        "microbatches": microbatches,
        "topk": topk,
    }
    for name, value in figures.items():
        _positive(value, name)
    _positive(experts, "experts", allow_zero=True)
    tp, cp, pp, dp, ep = (int(sizes.get(d, 1)) for d in ("tp", "cp", "pp", "dp", "ep"))
    activations = micro_batch * seq_len / cp * hidden * dtype_bytes
    per_stage = math.ceil(layers / pp)
    out = []
    if tp > 1:
        out.append(Traffic("tp", "all_reduce", activations, 4 * per_stage * microbatches))
    if cp > 1:
        kv = 2 * activations / tp * cp
        out.append(Traffic("cp", "all_gather", kv, per_stage * microbatches))
        out.append(Traffic("cp", "reduce_scatter", kv, per_stage * microbatches))
    if pp > 1:
        out.append(Traffic("pp", "send_recv", activations / tp, 2 * microbatches))
    if dp > 1 or cp > 1:
        dims = ["dp", "cp"] if cp > 1 and "dp" in sizes else ["cp"] if cp > 1 else ["dp"]
        out.append(Traffic(dims, "all_reduce", params / (tp * pp) * dtype_bytes, 1))
    if ep > 1 and experts > 0:
        out.append(Traffic("ep", "all_to_all", topk * activations / tp, 4 * per_stage * microbatches))
    return out
