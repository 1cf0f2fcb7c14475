"""``python -m hypergrid plan``: the table, JSON equal to the API, the chart, friendly errors."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import pytest

from hypergrid.cli.plan import main
from hypergrid.topology import Tier, Topology, Traffic, llm_step_traffic, plan


def test_plan_table_and_json_equal_the_api(tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "plans.json"
    argv = ["--sizes", "tp=8,dp=16", "--topology", "h100_8x", "--traffic", "tp:all_reduce:64M:200,dp:all_reduce:1G:1"]
    assert main([*argv, "--json", str(out)]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].endswith("seconds of communication per step")
    assert table[1].split() == ["#", "order", "(innermost", "first)", "seconds", "tp", "(s)", "dp", "(s)"]
    assert table[2].split()[:2] == ["1", "tp,dp"] and table[3].split()[:2] == ["2", "dp,tp"]
    assert len(table) == 4  # no ties between the two orders

    traffic = [Traffic("tp", "all_reduce", 64 * 2**20, 200), Traffic("dp", "all_reduce", 2**30, 1)]
    expected = [p.to_dict() for p in plan({"tp": 8, "dp": 16}, traffic, Topology.preset("h100_8x"))]
    data = json.loads(out.read_text())
    assert data["plans"] == expected
    assert data["sizes"] == {"tp": 8, "dp": 16}
    assert list(data["plans"][0]) == ["order", "shape", "seconds", "families", "split"]


def test_plan_names_the_plans_that_tie_and_why(capsys: pytest.CaptureFixture[str]) -> None:
    # pp carries no traffic: tp,pp,dp and tp,dp,pp place tp and dp alike and cost the same.
    argv = ["--sizes", "tp=8,pp=4,dp=16", "--traffic", "tp:all_reduce:64M:200,dp:all_reduce:1G:1", "--top", "2"]
    assert main(argv) == 0
    table = capsys.readouterr().out.splitlines()
    assert {table[2].split()[1], table[3].split()[1]} == {"tp,pp,dp", "tp,dp,pp"}
    assert table[2].split()[2] == table[3].split()[2]
    assert table[4].startswith("plans 1, 2 tie at ") and "pp carries no traffic" in table[4], table[4]


def test_plan_model_top_split_and_stdout_json(capsys: pytest.CaptureFixture[str]) -> None:
    figures = "hidden=4096,layers=32,seq_len=4096,micro_batch=1,params=7e9,microbatches=8"
    assert main(["--sizes", "tp=2,pp=2,dp=4", "--model", figures, "--split", "--top", "3", "--json", "-"]) == 0
    data = json.loads(capsys.readouterr().out)
    sizes = {"tp": 2, "pp": 2, "dp": 4}
    traffic = llm_step_traffic(sizes, hidden=4096, layers=32, seq_len=4096, micro_batch=1, params=7e9, microbatches=8)
    assert data["plans"] == [p.to_dict() for p in plan(sizes, traffic, "h100_8x", split=True)[:3]]


def test_plan_topology_from_json_file(tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    topo = Topology([Tier("node", 4, 1e11, 1e-6), Tier("net", None, 1e9, 1e-5)])
    path = tmp_path / "cluster.json"
    path.write_text(json.dumps(topo.to_dict()))
    assert main(["--sizes", "tp=4,dp=2", "--topology", str(path), "--traffic", "dp:all_reduce:1e9", "--json", "-"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["plans"] == [p.to_dict() for p in plan({"tp": 4, "dp": 2}, [Traffic("dp", "all_reduce", 1e9)], topo)]
    assert data["topology"] == topo.to_dict()


def test_plan_png(tmp_path: pathlib.Path) -> None:
    pytest.importorskip("matplotlib")
    png = tmp_path / "plans.png"
    assert (
        main(["--sizes", "tp=4,cp=2,dp=4", "--traffic", "tp:all_reduce:16M:100,dp:all_reduce:1G", "--png", str(png)])
        == 0
    )
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plan_runs_as_a_module() -> None:
    command = [sys.executable, "-m", "hypergrid", "plan", "--sizes", "tp=2,dp=2", "--traffic", "dp:all_reduce:1M"]
    out = subprocess.run(command, capture_output=True, text=True, check=True).stdout
    assert "2 plans, best first" in out


@pytest.mark.parametrize(
    ("argv", "text"),
    [
        (["--sizes", "tp=8,dp=x", "--traffic", "tp:all_reduce:1M"], "'x'"),
        (["--sizes", "tp=8,tp=2", "--traffic", "tp:all_reduce:1M"], "'tp' twice"),
        (["--sizes", "tp=8", "--traffic", "dp:all_reduce:1M"], "'dp'"),
        (["--sizes", "tp=8", "--traffic", "tp:allreduce:1M"], "'allreduce'"),
        (["--sizes", "tp=8", "--traffic", "tp:all_reduce:lots"], "'lots'"),
        (["--sizes", "tp=8", "--traffic", "tp:all_reduce"], "'tp:all_reduce'"),
        (["--sizes", "tp=8", "--traffic", "tp:all_reduce:1M:2.5"], "'2.5'"),
        (["--sizes", "tp=8", "--traffic", "tp:all_reduce:1M", "--topology", "dgx"], "'dgx'"),
        (["--sizes", "tp=8", "--traffic", "tp:all_reduce:1M", "--topology", "none.json"], "none.json"),
        (["--sizes", "tp=8", "--traffic", "tp:all_reduce:1M", "--top", "0"], "'0'"),
        (["--sizes", "tp=8", "--model", "hidden=8"], "layers"),
        (["--sizes", "tp=8", "--model", "hidden=8,width=2"], "'width'"),
        (["--sizes", "tp=8"], "--traffic"),
    ],
)
def test_plan_bad_arguments_are_friendly(argv: list[str], text: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "error:" in err and text in err and "Traceback" not in err
