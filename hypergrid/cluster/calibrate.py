"""Fit tier bandwidths and latencies from measured collectives (``benchmarks/allreduce.py --json``)."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any, Protocol

import numpy as np

from hypergrid.cluster.spans import family_spans
from hypergrid.errors import InvalidArgumentError
from hypergrid.values import shown

__all__ = ["MIN_LATENCY", "calibrate"]

#: A fitted latency at or below zero (noise on a flat curve) is recorded as this floor, in seconds.
MIN_LATENCY = 1e-9


class _Tiered(Protocol):
    """What ``calibrate`` reads of a ``Topology`` (tiers.py imports this module, not the other way)."""

    @property
    def unit_ranks(self) -> tuple[int, ...]: ...
    @property
    def tiers(self) -> Any: ...
    def replace(self, **updates: Mapping[str, float]) -> Any: ...


_FIELDS = ("family", "size_bytes", "group_size", "time_us", "algbw_gbps", "busbw_gbps")


def _load(results: Any) -> list[dict[str, Any]]:
    if isinstance(results, (str, os.PathLike)):
        with open(results) as handle:
            results = json.load(handle)
    if not isinstance(results, list):
        raise InvalidArgumentError(
            f"results must be the list of rows benchmarks/allreduce.py writes, got {shown(results)}"
        )
    rows = []
    for row in results:
        missing = [f for f in _FIELDS if not isinstance(row, Mapping) or f not in row]
        if missing:
            raise InvalidArgumentError(f"benchmark row {shown(row)} lacks field(s) {missing}")
        if row.get("impl", "hypergrid") == "hypergrid" and row["algbw_gbps"] > 0 and row["group_size"] > 1:
            rows.append(dict(row))
    return rows


def calibrate(base: _Tiered, results: Any, sizes: Mapping[str, int]) -> Any:
    """A copy of ``base`` whose tiers' bandwidth and latency are fitted to measured collectives.

    Each row's family is placed on the grid ``sizes`` (the benchmark's ``--shape``/``--dims``,
    innermost first) with ``base``'s tier sizes. Families that span exactly one tier
    measure that tier: the model of docs/planner.md says a row takes
    ``steps * latency + factor * size / bandwidth`` seconds, with the
    bus factor read from the row (busbw / algbw) and ``steps`` 2(n-1) for all_reduce,
    n-1 otherwise. A least-squares fit over every such row of a tier gives both
    figures; tiers without rows (or with one size only) keep ``base``'s figures.

    Args:
        base: the topology to start from (tier sizes are kept).
        results: the rows (a list of dicts) or the path of the JSON file.
        sizes: the benchmark grid's dims and sizes, innermost first.

    Returns:
        The calibrated `Topology`.

    Raises:
        InvalidArgumentError: rows that are not benchmark rows, or a fit with a
            non-positive bandwidth (the rows do not follow the model).

    Examples:
        >>> from hypergrid.cluster.tiers import Topology
        >>> base = Topology.preset("h100_8x")
        >>> rows = [{"family": "tp", "size_bytes": s, "group_size": 8, "time_us": (14 * 2e-6 + 1.75 * s / 300e9) * 1e6,
        ...          "algbw_gbps": 1.0, "busbw_gbps": 1.75} for s in (2**20, 2**26)]
        >>> tier = calibrate(base, rows, {"tp": 8, "dp": 2}).tiers[0]
        >>> round(tier.bandwidth / 1e9, 3), round(tier.latency * 1e6, 3)
        (300.0, 2.0)
    """
    rows = _load(results)
    shape, names = [int(s) for s in sizes.values()], list(sizes)
    samples: dict[int, list[tuple[float, float, float]]] = {}
    for row in rows:
        span = family_spans(shape, names, row["family"], base.unit_ranks)
        tiers = [k for k, flag in enumerate(span.spanned) if flag]
        if len(tiers) != 1:
            continue  # mixed tiers: the row does not isolate one tier
        k, n = tiers[0], span.group_size
        factor = row["busbw_gbps"] / row["algbw_gbps"]
        steps = 2 * (n - 1) if abs(factor - 2 * (n - 1) / n) < 1e-6 else n - 1
        # one tier spanned: the group has one member per unit of the tier below, no links shared
        samples.setdefault(k, []).append((steps, factor * row["size_bytes"], row["time_us"] * 1e-6))
    updates: dict[str, Mapping[str, float]] = {}
    for k, points in samples.items():
        design = np.array([[s, x] for s, x, _ in points], dtype=float)
        if len({x for _, x, _ in points}) < 2:
            continue
        times = np.array([t for _, _, t in points], dtype=float)
        (latency, inverse), *_ = np.linalg.lstsq(design, times, rcond=None)
        name = base.tiers[k].name
        if inverse <= 0:
            raise InvalidArgumentError(
                f"tier {shown(name)}: the rows give a non-positive bandwidth (1/B = {shown(inverse)})"
            )
        updates[name] = {"bandwidth": float(1 / inverse), "latency": float(max(latency, MIN_LATENCY))}
    return base.replace(**updates)
