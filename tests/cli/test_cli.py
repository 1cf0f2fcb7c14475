"""``python -m hypergrid show``: readable, summarized at scale, JSON for tools, friendly errors, fuzzed."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hypergrid import GridLayout, HyperGridError
from hypergrid.cli.show import FAMILY_LINE_WIDTH, parse_grid_arguments, show


def test_show_16_ranks_lists_everything(capsys: pytest.CaptureFixture[str]) -> None:
    assert show(["--shape", "2,2,4", "--dims", "tp,pp,dp", "--ranks-per-node", "4"]) == 0
    out = capsys.readouterr().out
    assert "grid [2, 2, 4] over ['tp', 'pp', 'dp']: 16 ranks (0..15), tp innermost" in out
    assert "  13     1     0     3" in out
    assert "dp                     4      4  [0,4,8,12] [1,5,9,13] [2,6,10,14] [3,7,11,15]" in out
    assert (
        "tp                         1  inside one node" in out and "dp                         4  crosses nodes" in out
    )


def test_show_16384_ranks_is_summarized(capsys: pytest.CaptureFixture[str]) -> None:
    assert show(["--shape", "8,8,256", "--dims", "tp,cp,dp", "--limit", "8"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) < 40
    assert any(line.strip() == "..." for line in lines)
    assert any(line.startswith("tp ") and "2048" in line and "… and 2046 more groups" in line for line in lines)


@pytest.mark.parametrize("limit", ["64", "8", "1000"])
def test_show_family_lines_are_capped_and_count_what_they_leave_out(
    limit: str, capsys: pytest.CaptureFixture[str]
) -> None:
    layout = GridLayout([8, 8, 256], ["tp", "cp", "dp"])
    assert show(["--shape", "8,8,256", "--dims", "tp,cp,dp", "--limit", limit]) == 0
    lines = capsys.readouterr().out.splitlines()
    rows = lines[lines.index(next(line for line in lines if line.startswith("family"))) + 1 :]
    rows = rows[: rows.index("")]  # then the node report's hint
    assert len(rows) == len(layout.all_families())
    for row, family in zip(rows, layout.all_families()):
        assert len(row) <= FAMILY_LINE_WIDTH, row
        assert row.startswith(f"{layout.key(family)} ")
        shown = row.count("[")
        more = re.search(r"… and (\d+) more groups?$", row)
        assert shown + (int(more.group(1)) if more else 0) == layout.num_groups(family), row
        assert f"  [{layout.rank_enum(family)[0][0]}," in row  # the first group comes first


def test_show_json_for_tools(capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        show(
            ["--shape", "2,2", "--dims", "tp,dp", "--offset", "4", "--family", "dp", "--ranks-per-node", "2", "--json"]
        )
        == 0
    )
    data = json.loads(capsys.readouterr().out)
    layout = GridLayout([2, 2], ["tp", "dp"], 4)
    assert data["size"] == 4 and data["rank_offset"] == 4
    assert data["ranks"][3] == {"rank": 7, "tp": 1, "dp": 1}
    assert data["families"] == [{"key": "dp", "group_size": 2, "num_groups": 2, "groups": layout.rank_enum("dp")}]
    assert data["nodes"] == [row for row in layout.node_report(2) if row["key"] == "dp"]


def test_show_runs_as_a_module() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "hypergrid", "show", "--shape", "2,2", "--dims", "tp,dp", "--family", "tp,dp"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "dp-tp" in out and "[0,1,2,3]" in out


@pytest.mark.parametrize(
    ("argv", "text"),
    [
        (["--shape", "2,x", "--dims", "tp,dp"], "'2,x'"),
        (["--shape", "2,2", "--dims", "tp"], "['tp']"),
        (["--shape", "2,2", "--dims", "tp,dp", "--family", "xp"], "'xp'"),
        (["--shape", "2,2", "--dims", "tp,dp", "--ranks-per-node", "0"], "'0'"),
        (["--shape", "2,2", "--dims", "tp,dp", "--offset", "-1"], "'-1'"),
        (["--shape", "2,2", "--dims", "tp,dp", "--limit", "many"], "'many'"),
        (["--dims", "tp"], "--shape"),
    ],
)
def test_show_bad_arguments_are_friendly(argv: list[str], text: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        show(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "error:" in err and text in err and "Traceback" not in err


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (["--family", "dpp"], "--family 'dpp': unknown dim 'dpp'"),
        (["--family", "dp,dp"], "--family 'dp,dp': "),
        (["--family", "tp--dp"], "--family 'tp--dp': "),
        (["--family", ""], "--family '': "),
        (["--family", "dp,"], "--family must be"),
        (["--dims", "tp,cp"], "--shape '2,2,2' --dims 'tp,cp': "),
        (["--dims", "tp,tp,dp"], "--shape '2,2,2' --dims 'tp,tp,dp': "),
        (["--dims", "tp,cp,dp-x"], "--shape '2,2,2' --dims 'tp,cp,dp-x': "),
        (["--shape", "0,2,2"], "--shape '0,2,2' --dims 'tp,cp,dp': "),
        (["--offset", "x"], "--offset must be"),
        (["--limit", "1"], "--limit must be"),
        (["--ranks-per-node", "0"], "--ranks-per-node must be"),
    ],
)
def test_show_errors_name_the_flag_not_an_internal_call(
    argv: list[str], flag: str, capsys: pytest.CaptureFixture[str]
) -> None:
    args = {"--shape": "2,2,2", "--dims": "tp,cp,dp"}
    args.update(zip(argv[::2], argv[1::2]))
    with pytest.raises(SystemExit):
        show([item for pair in args.items() for item in pair])
    message = capsys.readouterr().err.split("error: ", 1)[1]
    assert message.startswith(flag), message
    for internal in ("canonical_dims", "dim_indices", "GridLayout", "parse_"):
        assert internal not in message, message


cli_text = st.text(alphabet="0123456789,-tpdcx _", max_size=10)


@given(cli_text, cli_text, cli_text)
def test_parse_grid_arguments_fuzzed(shape: str, dims: str, family: str) -> None:
    try:
        layout = parse_grid_arguments(shape, dims)
    except HyperGridError as error:
        assert (
            repr(shape) in str(error)
            or repr(dims) in str(error)
            or any(part.strip() in str(error) for part in (shape + "," + dims).split(",") if part.strip())
        ), str(error)
        return
    assert isinstance(layout, GridLayout)


@given(
    st.lists(
        st.sampled_from(["--shape", "--dims", "--family", "--offset", "--limit", "2,2", "tp,dp", "x", "-1", "--json"]),
        max_size=8,
    )
)
def test_show_never_crashes(argv: list[str]) -> None:
    try:
        code = show(argv)
    except SystemExit as exit_info:
        assert exit_info.code in (0, 2)
        return
    assert code == 0
