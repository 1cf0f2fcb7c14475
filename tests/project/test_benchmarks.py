"""The benchmarks' arithmetic, their JSON schema and tiny end-to-end runs (never timing thresholds)."""

from __future__ import annotations

import json
import pathlib
import re
from typing import Any

import pytest

from benchmarks import allreduce, bridge, checked_collectives, creation
from benchmarks.common import BUS_FACTORS, bandwidths, parse_bytes, size_sweep
from hypergrid import GridLayout


@pytest.mark.parametrize(
    ("op", "n", "factor"),
    [
        ("all_reduce", 8, 1.75),
        ("all_reduce", 2, 1.0),
        ("all_reduce", 1, 0.0),
        ("reduce_scatter", 4, 0.75),
        ("all_gather", 2, 0.5),
    ],
)
def test_bus_bandwidth_factors_follow_nccl_tests(op: str, n: int, factor: float) -> None:
    algbw, busbw = bandwidths(op, 64 * 2**20, 0.01, n)
    assert algbw == pytest.approx(64 * 2**20 / 0.01 / 1e9)
    assert busbw == pytest.approx(algbw * factor)
    assert BUS_FACTORS[op](n) == pytest.approx(factor)


@pytest.mark.parametrize(
    ("text", "value"), [("1K", 1024), ("64M", 64 * 2**20), ("2G", 2 * 2**30), ("4096", 4096), ("8b", 8)]
)
def test_sizes_parse_in_binary_units(text: str, value: int) -> None:
    assert parse_bytes(text) == value


@pytest.mark.parametrize("text", ["", "0", "1T", "-1K", "1.5M", "K"])
def test_bad_sizes_are_refused(text: str) -> None:
    with pytest.raises(ValueError, match=repr(text).replace("'", ".")):
        parse_bytes(text)


def test_size_sweep() -> None:
    assert size_sweep(1024, 64 * 2**20, 2)[-1] == 64 * 2**20
    assert len(size_sweep(1024, 64 * 2**20, 2)) == 17
    assert size_sweep(1000, 9000, 3) == [1000, 3000, 9000]
    with pytest.raises(ValueError, match="larger"):
        size_sweep(4096, 1024, 2)
    with pytest.raises(ValueError, match="stepfactor"):
        size_sweep(1024, 4096, 1)


def test_summary_ratio() -> None:
    rows = [
        {"family": "tp", "size_bytes": s, "impl": impl, "busbw_gbps": bw, "time_us": mean, "time_us_median": t}
        for s, impl, bw, mean, t in [
            (1024, "hypergrid", 1.0, 20.0, 10.0),  # busbw halved: the mean time doubled
            (1024, "raw", 2.0, 10.0, 20.0),
            (2048, "hypergrid", 3.0, 8.0, 8.0),
            (2048, "raw", 3.0, 8.0, 8.0),
        ]
    ]
    assert allreduce.summary(rows, 1024) == [("tp", 1024, 1.0, 2.0, 0.5, 2.0)]
    assert allreduce.summary(rows, 10**6) == [("tp", 2048, 3.0, 3.0, 1.0, 1.0)]
    one_rank = [{**row, "busbw_gbps": 0.0} for row in rows]  # nccl-tests' factor 2(n-1)/n is 0 (the device check's)
    assert allreduce.summary(one_rank, 1024) == [("tp", 1024, 0.0, 0.0, 0.5, 2.0)]


def test_families_argument() -> None:
    layout = GridLayout([2, 2], ["tp", "dp"])
    assert allreduce.parse_families("all", layout) is None
    assert allreduce.parse_families("tp;tp,dp;dp-tp", layout) == [("tp",), ("dp", "tp"), ("dp", "tp")]
    with pytest.raises(ValueError, match="'xp'"):
        allreduce.parse_families("tp;xp", layout)
    with pytest.raises(ValueError, match="repeat"):
        allreduce.parse_families("tp,tp", layout)


def _check_records(records: list[dict[str, Any]], op: str) -> None:
    layout = GridLayout([2, 2], ["tp", "dp"])
    for record in records:
        assert tuple(record) == allreduce.FIELDS
        assert record["impl"] in ("hypergrid", "raw")
        assert record["wrong"] == 0, record
        assert record["group_size"] == layout.group_size(record["family"])
        assert record["time_us"] > 0 and record["time_us_median"] > 0
        assert record["algbw_gbps"] == pytest.approx(record["size_bytes"] / (record["time_us"] * 1e-6) / 1e9)
        assert record["busbw_gbps"] == pytest.approx(record["algbw_gbps"] * BUS_FACTORS[op](record["group_size"]))
        assert isinstance(record["count"], int) and isinstance(record["size_bytes"], int)


@pytest.mark.processes
@pytest.mark.timeout(240)
def test_allreduce_end_to_end_writes_json_and_a_plot(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    json_path, png_path = tmp_path / "rows.json", tmp_path / "busbw.png"
    argv = ["--shape", "2,2", "--dims", "tp,dp", "--minbytes", "1K", "--maxbytes", "4K", "--iters", "2"]
    code = allreduce.main([*argv, "--warmup", "1", "--json", str(json_path), "--plot", str(png_path), "--quiet"])
    assert code == 0
    records = json.loads(json_path.read_text())
    assert len(records) == 3 * 3 * 2  # families x sizes x {hypergrid, raw}
    assert {r["family"] for r in records} == {"tp", "dp", "dp-tp"}
    assert {r["size_bytes"] for r in records} == {1024, 2048, 4096}
    _check_records(records, "all_reduce")
    assert png_path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    out = capsys.readouterr().out
    assert "# total #wrong: 0" in out and "ratio" in out
    assert "# average_gradients over dp (2 ranks), 100 parameters" in out  # the bucketed vs per-parameter row
    assert re.search(r"# per-parameter / bucketed: \d+\.\d\d, #wrong 0", out), out


@pytest.mark.processes
@pytest.mark.timeout(240)
@pytest.mark.parametrize("op", ["reduce_scatter", "all_gather"])
def test_other_collectives_check_their_data(op: str, tmp_path: pathlib.Path) -> None:
    json_path = tmp_path / "rows.json"
    argv = ["--shape", "2,2", "--dims", "tp,dp", "--families", "dp-tp;tp", "--minbytes", "4K", "--maxbytes", "4K"]
    assert (
        allreduce.main([*argv, "--iters", "2", "--warmup", "1", "--op", op, "--json", str(json_path), "--quiet"]) == 0
    )
    records = json.loads(json_path.read_text())
    assert [r["family"] for r in records] == ["dp-tp", "dp-tp", "tp", "tp"]
    _check_records(records, op)


@pytest.mark.parametrize(
    "argv",
    [["--shape", "2,x"], ["--dims", "tp,tp,dp"], ["--minbytes", "1T"], ["--families", "xp"], ["--iters", "0"]],
)
def test_allreduce_bad_arguments(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        allreduce.main(argv)
    assert exit_info.value.code == 2
    assert "error:" in capsys.readouterr().err


@pytest.mark.timeout(240)
def test_creation_fake_mode_counts_new_group_calls(tmp_path: pathlib.Path) -> None:
    json_path = tmp_path / "creation.json"
    assert creation.main(["--fake", "--world", "1024,2048", "--samples", "2", "--json", str(json_path)]) == 0
    rows = json.loads(json_path.read_text())
    assert [(r["world"], r["strategy"]) for r in rows] == [
        (1024, "enumerate"),
        (1024, "local"),
        (2048, "enumerate"),
        (2048, "local"),
    ]
    for row in rows:
        layout = GridLayout(row["shape"], creation.NAMES)
        if row["strategy"] == "local":
            assert row["new_group_calls_per_family"] == 1
        else:
            assert row["new_group_calls_per_rank"] == sum(layout.num_groups(f) for f in layout.all_families())
        assert row["families"] == 15 and row["time_s_max"] >= row["time_s_median"] > 0


@pytest.mark.processes
@pytest.mark.timeout(240)
@pytest.mark.parametrize(
    ("strategies", "guards", "apis"),
    [
        # Every value once, in two fresh jobs; the whole product (eight jobs) is a stress run.
        ("enumerate", "on", "create_pg"),
        ("local", "off", "create_pgs"),
        pytest.param("enumerate,local", "on,off", "create_pg,create_pgs", marks=pytest.mark.stress),
    ],
    ids=["enumerate-on-create_pg", "local-off-create_pgs", "all"],
)
def test_creation_gloo_mode_schema(tmp_path: pathlib.Path, strategies: str, guards: str, apis: str) -> None:
    json_path = tmp_path / "creation.json"
    argv = ["--world", "4", "--strategies", strategies, "--guard", guards, "--api", apis, "--repeats", "1"]
    assert creation.main([*argv, "--json", str(json_path)]) == 0
    rows = json.loads(json_path.read_text())
    on_off = {"on": True, "off": False}
    assert sorted((r["strategy"], r["guard"], r["api"]) for r in rows) == sorted(
        (s, on_off[g], a) for s in strategies.split(",") for g in guards.split(",") for a in apis.split(",")
    )
    layout = GridLayout([2, 2], creation.NAMES[:2])
    # The family over both dims is one group of the whole world: the default group, no new_group call.
    families = [f for f in layout.all_families() if layout.num_groups(f) > 1]
    for row in rows:
        assert row["shape"] == [2, 2] and row["groups_per_rank"] == 3
        calls = len(families) if row["strategy"] == "local" else sum(layout.num_groups(f) for f in families)
        assert row["new_group_calls_per_rank"] == calls


@pytest.mark.parametrize(
    "argv",
    [
        ["--world", "6"],
        ["--fake", "--world", "1000"],
        ["--strategies", "split"],
        ["--guard", "maybe"],
        ["--api", "pgs"],
    ],
)
def test_creation_bad_arguments(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        creation.main(argv)
    assert exit_info.value.code == 2


@pytest.mark.processes
@pytest.mark.timeout(240)
def test_checked_rows_time_both_grid_calls_in_the_same_run(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    json_path = tmp_path / "rows.json"
    argv = ["--shape", "2,2", "--dims", "tp,dp", "--families", "dp-tp", "--minbytes", "1K", "--maxbytes", "1K"]
    argv += ["--iters", "2", "--warmup", "1", "--checked", "--json", str(json_path), "--quiet"]
    assert allreduce.main(argv) == 0
    records = json.loads(json_path.read_text())
    assert sorted(r["impl"] for r in records) == ["checked", "hypergrid", "raw", "unchecked"]
    assert all(r["wrong"] == 0 for r in records)
    [(family, size, on, off, ratio)] = checked_collectives.checked_summary(records)
    assert (family, size) == ("dp-tp", 1024) and ratio == pytest.approx(on / off)
    assert "checked / unchecked" in capsys.readouterr().out


@pytest.mark.processes
@pytest.mark.timeout(240)
def test_bridge_tiny_run_counts_bytes_from_both_schedules(tmp_path: pathlib.Path) -> None:
    json_path = tmp_path / "bridge.json"
    assert bridge.main(["--bytes", "16K", "--iters", "1", "--warmup", "0", "--json", str(json_path)]) == 0
    rows = json.loads(json_path.read_text())
    assert {(r["pair"], r["schedule"]) for r in rows} == {(p, s) for p in bridge.PAIRS for s in ("direct", "leader")}
    by = {(r["pair"], r["schedule"]): r for r in rows}
    # tp1 dp4 -> tp2 dp2: 16 rows of 1 KiB; direct: each source rank sends its 4 rows to both tp copies (8 KiB);
    # leader: each source rank sends its 4 rows once, each destination leader rebroadcasts its 8 rows (8 KiB).
    assert by[("tp1 dp4 -> tp2 dp2", "direct")]["max_sent_per_rank"] == 8 * 1024
    assert by[("tp1 dp4 -> tp2 dp2", "direct")]["total_bytes_moved"] == 32 * 1024
    assert by[("tp1 dp4 -> tp2 dp2", "leader")]["total_bytes_moved"] == 32 * 1024
    assert by[("tp2 dp2 -> tp1 dp4", "leader")]["max_sent_per_rank"] == 8 * 1024  # a leader sends its whole slice
    assert by[("tp2 dp2 -> tp1 dp4", "direct")]["max_sent_per_rank"] == 4 * 1024  # each tp copy sends half of it
    assert all(r["time_ms_median"] > 0 for r in rows)
