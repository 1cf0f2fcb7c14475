"""Enumeration speed at 2**20 ranks, side by side in one run.

For every family (all 15 combinations of dims) of a ``[8, 8, 16, 1024]`` grid
(``tp, cp, ep, dp``: 1,048,576 ranks) it times

  (a) hypergrid: ``HyperCommGrid.get_rank_enum`` (validation, canonical order, einops),
  (b) the bare numpy bound: ``arange -> moveaxis -> reshape -> tolist``, nothing else,
  (c) a plain-Python mixed-radix reference (Megatron ``RankGenerator`` style),

checks that all three agree, then times own-group lookups (``group_ranks``) on a
2**10-rank and a 2**20-rank grid for the same families. Medians over repeats.

    python benchmarks/enumeration.py [--repeats 7] [--slow-repeats 3] [--json PATH]

Targets: (a) within 1.1x of (b), (a) at least 10x faster than (c), own-group
lookup at 2**20 within 2x of 2**10.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import pathlib
import random
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

from benchmarks.common import progress
from hypergrid import GridLayout, HyperCommGrid
from tests.references import megatron_rank_groups

SHAPE = [8, 8, 16, 1024]
NAMES = ["tp", "cp", "ep", "dp"]
SMALL_SHAPE = [8, 8, 16]


def bare_numpy(shape: list[int], names: list[str], dims: tuple[str, ...]) -> list[list[int]]:
    """The least work that yields Megatron's enumeration: no validation, no caching."""
    ndim = len(shape)
    array = np.arange(math.prod(shape)).reshape(shape[::-1])
    chosen = sorted(ndim - 1 - names.index(d) for d in dims)  # array axes, outermost first
    group_size = math.prod(shape[names.index(d)] for d in dims)
    moved = np.moveaxis(array, chosen, list(range(ndim - len(chosen), ndim)))
    result: list[list[int]] = moved.reshape(-1, group_size).tolist()
    return result


def timed(function: Callable[[], Any]) -> tuple[float, Any]:
    gc.collect()
    gc.disable()
    try:
        start = time.perf_counter()
        value = function()
        return time.perf_counter() - start, value
    finally:
        gc.enable()


def enumerate_families(repeats: int, slow_repeats: int) -> list[dict[str, Any]]:
    grid = HyperCommGrid(SHAPE, NAMES)
    order = "-".join(NAMES)
    sizes = dict(zip(NAMES, SHAPE))
    rows = []
    families = grid.layout.all_families()
    for index, family in enumerate(families, 1):
        times: dict[str, list[float]] = {"hypergrid": [], "numpy": [], "python": []}
        results = {}
        for _ in range(repeats):
            seconds, results["hypergrid"] = timed(lambda f=family: grid.get_rank_enum(f))
            times["hypergrid"].append(seconds)
            seconds, results["numpy"] = timed(lambda f=family: bare_numpy(SHAPE, NAMES, f))
            times["numpy"].append(seconds)
        for _ in range(slow_repeats):
            seconds, results["python"] = timed(lambda f=family: megatron_rank_groups(order, sizes, "-".join(f)))
            times["python"].append(seconds)
        if not results["hypergrid"] == results["numpy"] == results["python"]:
            raise AssertionError(f"family {family}: the three enumerations disagree")
        medians = {name: statistics.median(values) for name, values in times.items()}
        rows.append({"family": grid.layout.key(family), **{f"{k}_s": v for k, v in medians.items()}})
        progress(
            f"enumeration {index:>2}/{len(families)} {rows[-1]['family']:<12} "
            f"hypergrid {medians['hypergrid'] * 1e3:8.1f} ms  numpy {medians['numpy'] * 1e3:8.1f} ms  "
            f"python {medians['python'] * 1e3:9.1f} ms"
        )
    return rows


def own_group_lookups(lookups: int, repeats: int) -> list[dict[str, Any]]:
    small = GridLayout(SMALL_SHAPE, NAMES[:3])
    large = GridLayout(SHAPE, NAMES)
    rng = random.Random(0)
    rows = []
    families = small.all_families()
    for index, family in enumerate(families, 1):
        progress(f"own-group lookups {index:>2}/{len(families)} {small.key(family)}")
        per_lookup = {}
        for label, layout in (("2^10", small), ("2^20", large)):
            ranks = [rng.randrange(layout.size) for _ in range(lookups)]
            samples = []
            for _ in range(repeats):
                seconds, _ = timed(lambda lay=layout, f=family, rs=ranks: [lay.group_ranks(f, r) for r in rs])
                samples.append(seconds / lookups)
            per_lookup[label] = statistics.median(samples)
        rows.append(
            {
                "family": small.key(family),
                "group_size": small.group_size(family),
                "small_us": per_lookup["2^10"] * 1e6,
                "large_us": per_lookup["2^20"] * 1e6,
            }
        )
    return rows


def report(enum_rows: list[dict[str, Any]], lookup_rows: list[dict[str, Any]]) -> dict[str, float]:
    print(f"\nEnumeration of all 15 families, grid {SHAPE} ({math.prod(SHAPE):,} ranks), medians:")
    print(f"{'family':<12} {'(a) ms':>9} {'(b) ms':>9} {'(c) ms':>10} {'a/b':>6} {'c/a':>7}")
    for row in enum_rows:
        a, b, c = row["hypergrid_s"], row["numpy_s"], row["python_s"]
        print(f"{row['family']:<12} {a * 1e3:9.1f} {b * 1e3:9.1f} {c * 1e3:10.1f} {a / b:6.2f} {c / a:7.1f}")
    total = {name: sum(row[f"{name}_s"] for row in enum_rows) for name in ("hypergrid", "numpy", "python")}
    summary = {
        "hypergrid_total_s": total["hypergrid"],
        "numpy_total_s": total["numpy"],
        "python_total_s": total["python"],
        "hypergrid_over_numpy": total["hypergrid"] / total["numpy"],
        "python_over_hypergrid": total["python"] / total["hypergrid"],
    }
    print(
        f"{'all 15':<12} {total['hypergrid'] * 1e3:9.1f} {total['numpy'] * 1e3:9.1f} "
        f"{total['python'] * 1e3:10.1f} {summary['hypergrid_over_numpy']:6.2f} "
        f"{summary['python_over_hypergrid']:7.1f}"
    )
    print("\nOwn-group lookup (group_ranks), median microseconds per lookup:")
    print(f"{'family':<12} {'size':>5} {'2^10 us':>9} {'2^20 us':>9} {'ratio':>6}")
    for row in lookup_rows:
        ratio = row["large_us"] / row["small_us"]
        print(f"{row['family']:<12} {row['group_size']:>5} {row['small_us']:9.2f} {row['large_us']:9.2f} {ratio:6.2f}")
    summary["lookup_worst_ratio"] = max(row["large_us"] / row["small_us"] for row in lookup_rows)
    print(
        f"\nTargets: (a)/(b) <= 1.10: {summary['hypergrid_over_numpy']:.3f}; "
        f"(c)/(a) >= 10: {summary['python_over_hypergrid']:.1f}; "
        f"lookup 2^20/2^10 <= 2 (worst family): {summary['lookup_worst_ratio']:.2f}"
    )
    return summary


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7, help="repeats of (a) and (b) (default 7)")
    parser.add_argument("--slow-repeats", type=int, default=3, help="repeats of (c) (default 3)")
    parser.add_argument("--lookups", type=int, default=2000, help="own-group lookups per sample (default 2000)")
    parser.add_argument("--json", type=pathlib.Path, help="write the rows and summary here")
    args = parser.parse_args()
    if min(args.repeats, args.slow_repeats, args.lookups) < 1:
        parser.error("--repeats, --slow-repeats and --lookups must be positive")
    progress(f"enumerating the 15 families of {SHAPE} ({args.repeats}/{args.slow_repeats} repeats)")
    enum_rows = enumerate_families(args.repeats, args.slow_repeats)
    lookup_rows = own_group_lookups(args.lookups, args.repeats)
    summary = report(enum_rows, lookup_rows)
    if args.json:
        args.json.write_text(
            json.dumps({"enumeration": enum_rows, "lookup": lookup_rows, "summary": summary}, indent=2)
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
