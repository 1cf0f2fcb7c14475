"""The alpha-beta cost of one collective over one family, on a `Topology` (formulas in docs/planner.md)."""

from __future__ import annotations

import math
from collections.abc import Sequence

from hypergrid.cluster.spans import Span
from hypergrid.cluster.tiers import Tier, Topology
from hypergrid.errors import InvalidArgumentError, public
from hypergrid.layout import MAX_WORLD_SIZE
from hypergrid.validation import check_int, check_number, refuse
from hypergrid.values import shown

__all__ = ["OPS", "bus_factor", "collective_seconds", "seconds_of", "steps"]

#: The collectives the model prices, as ``Traffic.op`` names them.
OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all", "send_recv")


def check_op(op: object) -> str:
    """``op`` if it is one of `OPS`, else an error naming it."""
    if not isinstance(op, str) or op not in OPS:
        raise InvalidArgumentError(f"unknown collective op {shown(op)}; expected one of {list(OPS)}")
    return op


@public
def bus_factor(op: str, n: int) -> float:
    """Bytes each rank moves per byte of buffer, for a group of ``n`` (nccl-tests' bus factor).

    Examples:
        >>> bus_factor("all_reduce", 8), bus_factor("all_gather", 8), bus_factor("send_recv", 8)
        (1.75, 0.875, 1.0)
    """
    return _bus(check_op(op), check_int("bus_factor", "n", n, 1, MAX_WORLD_SIZE))


def _bus(op: str, n: int) -> float:
    """`bus_factor` of checked arguments (the planner's inner loop)."""
    if n <= 1:
        return 0.0
    if op == "all_reduce":
        return 2 * (n - 1) / n
    if op in ("all_gather", "reduce_scatter", "all_to_all"):
        return (n - 1) / n
    return 1.0


def steps(op: str, n: int) -> int:
    """Message steps of the ring (or direct) algorithm: the count of latencies paid.

    Examples:
        >>> steps("all_reduce", 8), steps("all_gather", 8), steps("send_recv", 8)
        (14, 7, 1)
    """
    check_op(op)
    if n <= 1:
        return 0
    if op == "all_reduce":
        return 2 * (n - 1)
    return 1 if op == "send_recv" else n - 1


def _flat(
    op: str, nbytes: float, n: int, per_unit: Sequence[int], spanned: Sequence[bool], tiers: Sequence[Tier]
) -> float:
    """One algorithm over the whole group: latency of the slowest step, bandwidth of the most loaded tier."""
    terms, alpha = [0.0], 0.0
    for k, tier in enumerate(tiers):
        if not spanned[k]:
            continue
        below = per_unit[k - 1] if k else 1  # the group's ranks in one unit of tier k-1
        if op == "all_to_all":  # direct: each rank sends its share to the members outside its unit
            seconds = max(per_unit[k] - below, 1) / n * nbytes / tier.bandwidth
        elif op == "send_recv":  # one message over one rank's link
            seconds = nbytes / tier.bandwidth
        else:  # a ring leaves each unit once: its bytes share the links of the group's ranks there
            seconds = _bus(op, n) * nbytes / (below * tier.bandwidth)
        terms.append(seconds)
        alpha = max(alpha, tier.latency)
    return steps(op, n) * alpha + max(terms)


def _seconds(
    op: str, nbytes: float, n: int, per_unit: Sequence[int], spanned: Sequence[bool], tiers: Sequence[Tier]
) -> float:
    """The cheaper of the flat algorithm and, for all_reduce, each hierarchical split."""
    best = _flat(op, nbytes, n, per_unit, spanned, tiers)
    if op != "all_reduce":
        return best
    spanned_tiers = [k for k, flag in enumerate(spanned) if flag]
    for t in spanned_tiers[1:]:  # split at tier t: inside = units of tier t-1
        inner = per_unit[t - 1]
        if inner <= 1:
            continue
        across = math.ceil(n / inner)
        inside = _flat("reduce_scatter", nbytes, inner, per_unit[:t], spanned[:t], tiers[:t])
        cross_per_unit = [1] * t + [math.ceil(count / inner) for count in per_unit[t:]]
        cross_spanned = [False] * t + list(spanned[t:])
        cross = _seconds("all_reduce", nbytes / inner, across, cross_per_unit, cross_spanned, tiers)
        best = min(best, 2 * inside + cross)  # reduce-scatter, all-reduce across, all-gather
    return best


@public
def collective_seconds(op: str, nbytes: float, span: Span, topology: Topology) -> float:
    """Seconds of one call of ``op`` on ``nbytes`` per rank, every group of the family at once.

    Args:
        op: one of `OPS`.
        nbytes: the buffer size per rank (all_gather: the gathered output,
            reduce_scatter: the input, as nccl-tests counts).
        span: where the family's groups sit (`family_spans`).
        topology: the cluster.

    Returns:
        The cheaper of the flat and (all_reduce) hierarchical algorithms, never below the
        ring bus bound ``bus_factor(op, n) * nbytes / topology.fastest_bandwidth``.

    Raises:
        InvalidArgumentError: an unknown op, bytes that are not a finite number >= 0, not a
            `Span` or a `Topology`, or a span with the wrong number of tiers.

    Examples:
        >>> from hypergrid.cluster.spans import family_spans
        >>> topo = Topology.preset("h100_8x")
        >>> span = family_spans([8, 2], ["tp", "dp"], "tp", topo.unit_ranks)
        >>> round(collective_seconds("all_reduce", 370e6, span, topo) * 1e3, 3)  # 14 steps of 3 us + 1.75 ms
        1.792
    """
    check_op(op)
    number = check_number("collective_seconds", "nbytes", nbytes, 0)
    if not isinstance(span, Span):
        raise refuse("collective_seconds", "span", span, "a Span (family_spans)")
    if not isinstance(topology, Topology):
        raise refuse("collective_seconds", "topology", topology, "a Topology")
    if len(span.spanned) != len(topology.tiers):
        raise InvalidArgumentError(
            f"span has {len(span.spanned)} tiers but the topology has {len(topology.tiers)} ({list(topology.names)})"
        )
    return seconds_of(op, number, span, topology)


def seconds_of(op: str, nbytes: float, span: Span, topology: Topology) -> float:
    """`collective_seconds` of checked arguments (the planner's inner loop)."""
    n = span.group_size
    if n <= 1 or nbytes <= 0:
        return 0.0
    seconds = _seconds(op, float(nbytes), n, span.per_unit, span.spanned, topology.tiers)
    return max(seconds, _bus(op, n) * nbytes / topology.fastest_bandwidth)
