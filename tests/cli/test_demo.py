"""The README's main job, end to end: 8 local gloo processes, every family checked."""

from __future__ import annotations

import subprocess
import sys

import pytest

from hypergrid.__main__ import main as cli
from hypergrid.cli.demo import main


@pytest.mark.processes
@pytest.mark.timeout(240)
def test_demo_checks_every_family_and_prints_nothing_else() -> None:
    """As the README runs it (its own process): the table on stdout, and no torch warning (``[W``) on stderr."""
    done = subprocess.run(
        [sys.executable, "-m", "hypergrid", "demo", "--timeout", "200"], capture_output=True, text=True, timeout=230
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    assert "grid [2, 2, 2] over ['tp', 'cp', 'dp'] (8 ranks)" in out
    assert "7 of 7 families correct" in out
    for key in ["tp", "cp", "dp", "cp-tp", "dp-tp", "dp-cp", "dp-cp-tp"]:
        assert any(line.split()[:1] == [key] and " ok " in line for line in out.splitlines()), key
    assert any(line.startswith("dp-tp ") and line.endswith("[0, 1, 4, 5]") for line in out.splitlines())
    assert "[W" not in done.stderr, done.stderr[-3000:]
    assert len(out.strip().splitlines()) == 2 + 7 + 1, out  # the header lines, one row per family, the verdict


@pytest.mark.parametrize(
    ("argv", "text"),
    [
        (["--shape", "2,x"], "--shape must be comma-separated ints, got '2,x'"),
        (["--shape", "2,,2"], "--shape must be a comma-separated list, got '2,,2'"),
        (["--shape", "2,0,2"], "shape[1]=0: expected an int in 1..2147483647"),
        (["--dims", "tp,tp,dp"], "repeats 'tp'"),
        (["--dims", "tp,cp"], "has 2 names but shape has 3 dims"),
    ],
)
def test_bad_arguments_fail_before_any_process(argv: list[str], text: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    assert text in capsys.readouterr().err


def test_cli_lists_commands_and_refuses_unknown_ones(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli(["--help"]) == 0
    listing = capsys.readouterr().out
    assert "demo" in listing and "python -m hypergrid.run --standalone --nproc-per-node 4 train.py" in listing
    assert cli(["run", "train.py"]) == 2
    assert "the launcher is a module of its own: python -m hypergrid.run" in capsys.readouterr().err
    assert cli(["nope"]) == 2
    assert "unknown command 'nope'" in capsys.readouterr().err
