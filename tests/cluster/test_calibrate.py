"""Topology.calibrate recovers known tier figures from synthetic benchmarks/allreduce.py rows."""

from __future__ import annotations

import json
import pathlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hypergrid import InvalidArgumentError
from hypergrid.topology import Tier, Topology


def rows_for(family: str, n: int, per_link: int, bandwidth: float, latency: float, op: str) -> list[dict]:
    """Rows as benchmarks/allreduce.py writes them, timed by the documented model for one tier."""
    factor = 2 * (n - 1) / n if op == "all_reduce" else (n - 1) / n
    steps = 2 * (n - 1) if op == "all_reduce" else n - 1
    rows = []
    for size in (2**12, 2**16, 2**20, 2**24, 2**26):
        seconds = steps * latency + factor * size / (per_link * bandwidth)
        algbw = size / seconds / 1e9
        rows.append(
            {
                "family": family,
                "size_bytes": size,
                "count": size // 4,
                "group_size": n,
                "time_us": seconds * 1e6,
                "time_us_median": seconds * 1e6,
                "algbw_gbps": algbw,
                "busbw_gbps": algbw * factor,
                "wrong": 0,
                "impl": "hypergrid",
            }
        )
    return rows


@settings(max_examples=30, deadline=None)
@given(
    st.floats(1e9, 1e12),
    st.floats(1e-7, 1e-4),
    st.floats(1e8, 1e11),
    st.floats(1e-6, 1e-3),
    st.sampled_from(["all_reduce", "all_gather"]),
)
def test_calibrate_recovers_both_tiers(nv_bw: float, nv_lat: float, ib_bw: float, ib_lat: float, op: str) -> None:
    base = Topology.preset("h100_8x")
    sizes = {"tp": 8, "dp": 4}  # tp: one node (nvlink only); dp: one rank per node (ib only)
    rows = rows_for("tp", 8, 1, nv_bw, nv_lat, op) + rows_for("dp", 4, 1, ib_bw, ib_lat, op)
    rows += [dict(row, family="dp-tp", time_us=1.0) for row in rows[:3]]  # spans both tiers: ignored
    rows += [dict(row, impl="raw", time_us=1e9) for row in rows[:3]]  # the raw new_group rows: ignored
    fitted = base.calibrate(rows, sizes)
    assert [t.size for t in fitted.tiers] == [8, None]
    assert fitted.tiers[0].bandwidth == pytest.approx(nv_bw, rel=1e-6)
    assert fitted.tiers[0].latency == pytest.approx(nv_lat, rel=1e-4)
    assert fitted.tiers[1].bandwidth == pytest.approx(ib_bw, rel=1e-6)
    assert fitted.tiers[1].latency == pytest.approx(ib_lat, rel=1e-4)


def test_calibrate_reads_the_json_file_and_skips_mixed_families(tmp_path: pathlib.Path) -> None:
    small = Topology([Tier("node", 4, 1e11, 1e-6), Tier("net", None, 1e10, 1e-5)])
    sizes = {"dp": 2, "tp": 4}  # nodes of 4: dp inside one node; tp 2 ranks in each of 2 nodes (both tiers)
    rows = rows_for("dp", 2, 1, 60e9, 2e-6, "all_reduce") + rows_for("tp", 4, 2, 25e9, 5e-6, "all_reduce")
    path = tmp_path / "allreduce.json"
    path.write_text(json.dumps(rows))
    fitted = small.calibrate(str(path), sizes)
    assert fitted.tiers[0].bandwidth == pytest.approx(60e9, rel=1e-6)
    assert fitted.tiers[0].latency == pytest.approx(2e-6, rel=1e-4)
    assert fitted.tiers[1] == small.tiers[1]  # no row isolates the network: kept


def test_calibrate_rejects_what_is_not_a_benchmark() -> None:
    base = Topology.preset("h100_8x")
    with pytest.raises(InvalidArgumentError, match="lacks"):
        base.calibrate([{"family": "tp"}], {"tp": 8})
    with pytest.raises(InvalidArgumentError, match="list of rows"):
        base.calibrate(42, {"tp": 8})
    rising = rows_for("tp", 8, 1, 1e11, 1e-6, "all_reduce")
    for row in rising:
        row["time_us"] = 1e6 / row["size_bytes"]  # slower for smaller messages: no bandwidth fits
    with pytest.raises(InvalidArgumentError, match="non-positive bandwidth"):
        base.calibrate(rising, {"tp": 8})
