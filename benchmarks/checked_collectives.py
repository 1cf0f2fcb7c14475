"""The cost of checked collectives: the same grid call with ``check_collectives`` on and off, in one run.

``benchmarks/allreduce.py --checked`` adds an "unchecked" and a "checked" row
per family and size (both through the grid's own method, interleaved with the
other rows); this module summarizes them.
"""

from __future__ import annotations

from typing import Any

from benchmarks.common import human_bytes

#: The extra rows of ``--checked``: implementation name -> the grid's ``check_collectives``.
IMPLS = {"unchecked": False, "checked": True}


def checked_summary(rows: list[dict[str, Any]]) -> list[tuple[str, int, float, float, float]]:
    """Per family and size: the median time of a checked and an unchecked call, and their ratio."""
    out = []
    for family, size in dict.fromkeys((row["family"], row["size_bytes"]) for row in rows):
        at = {r["impl"]: r for r in rows if r["family"] == family and r["size_bytes"] == size}
        if "checked" in at and "unchecked" in at:
            on, off = at["checked"]["time_us_median"], at["unchecked"]["time_us_median"]
            out.append((family, size, on, off, on / off))
    return out


def format_checked(rows: list[dict[str, Any]]) -> str:
    """The summary lines ("" without ``--checked`` rows)."""
    lines = [
        f"{family:<10} {human_bytes(size):>6}  checked {on:9.1f} us  unchecked {off:9.1f} us  ratio {ratio:5.2f}"
        for family, size, on, off, ratio in checked_summary(rows)
    ]
    if not lines:
        return ""
    return "\n".join(
        ["# checked collectives: median time per call, checked / unchecked (both through the grid)", *lines]
    )
