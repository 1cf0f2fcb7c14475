"""``python -m hypergrid.run --replace-dead`` for real (issue 47): a worker SIGKILLed, a replacement joins, the grid
grows back to its shape, the launcher exits 0 and its summary names the replacement.

examples/elastic_tp_dp.py ``--regrow`` (tp x dp MLP blocks, Adam, float64) under the launcher, each run under a
hard wall-clock limit that kills its whole process group (``tests/launch/test_run_launcher.py``'s helpers). EVERY
process's report line is read: the final shape, the world, each dp replica's weights bitwise equal, each shard
against the same training in one process.
"""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import pytest

from tests.launch.test_run_launcher import ROOT, _finish, _start

pytestmark = [pytest.mark.processes, pytest.mark.timeout(240)]

EXAMPLE = ROOT / "examples" / "elastic_tp_dp.py"


def _run(tmp_path: pathlib.Path, flags: list[str], script: list[str]) -> tuple[int, str, list[dict]]:
    report = tmp_path / "report.jsonl"
    launcher = _start("hypergrid.run", ["--standalone", *flags], [*script, "--report", str(report), "--quiet"],
                      EXAMPLE)  # fmt: skip
    ((code, _, err),) = _finish(launcher, timeout_s=200)
    lines = [json.loads(line) for line in report.read_text().splitlines()] if report.exists() else []
    return code, err, lines


def test_a_killed_worker_is_replaced_and_the_grid_ends_at_its_original_shape(tmp_path: pathlib.Path) -> None:
    """tp2 x dp2 (4 workers): rank 3 SIGKILLs itself before the dp gradient average of step 3. "drop" removes its
    slice (rank 2 retired, waiting to come back); the agent starts a replacement of rank 3; both join: tp2 x dp2."""
    code, err, reports = _run(
        tmp_path,
        ["--nproc-per-node", "4", "--replace-dead"],
        ["--regrow", "--steps", "50", "--pause", "0.15", "--kill", "3:3:average"],
    )
    assert code == 0, err[-3000:]
    ranks = [report for report in reports if "rank" in report]
    assert sorted(report["rank"] for report in ranks) == [0, 1, 2, 3], reports
    for report in ranks:
        assert report["shape"] == {"tp": 2, "dp": 2} and report["world"] == 4 and report["step"] == 50, report
        assert report["grew"] == 1 and report["max_abs_vs_one_process"] < 1e-9, report
    for tp in (0, 1):
        assert len({report["weights_sha256"] for report in ranks if report["tp"] == tp}) == 1, ranks
    assert sorted(report["first_rank"] for report in ranks) == [0, 1, 2, 3]  # rank 3: its replacement
    assert "a replacement started in its place" in err, err[-3000:]
    assert "rank 3 (replacement 1): exited 0" in err and "replacements started: 1" in err, err[-3000:]
    assert "succeeded: 4 of 5 workers finished; rank 3 died by signal SIGKILL and was shrunk away" in err


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--max-replacements", "2"], "--max-replacements 2; expected to come with --replace-dead"),
        (["--replace-dead", "--max-replacements", "0"], "--max-replacements 0; expected an int >= 1"),
    ],
)
def test_replacement_flags_are_checked_before_anything_starts(flags: list[str], message: str) -> None:
    command = [sys.executable, "-m", "hypergrid.run", "--standalone", "--nproc-per-node", "2", *flags, str(EXAMPLE)]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and done.stderr.strip() == f"error: hypergrid.run: {message}", done.stderr


@pytest.mark.parametrize(
    ("second", "who"),
    [
        ("0:g3:average", "rank 0"),
        pytest.param("1:g3:optimizer", "rank 1", marks=pytest.mark.stress),
        pytest.param("3.1:g3:average", "rank 3 (replacement 1)", marks=pytest.mark.stress),
    ],
    ids=["an-original-rank-0", "an-original-rank-1", "the-replacement"],
)
def test_growth_then_a_death_is_accounted_for_and_the_job_succeeds(
    tmp_path: pathlib.Path, second: str, who: str
) -> None:
    """Issue 53: after the grid grew back once, the next death (an original, or the replacement: the same launcher
    rank twice) made a fully recovered job exit 1 in 0.4.0 ("no shrink excluded it"): the world's table was lost at
    the growth, and a replacement was accounted for by its launcher rank. Now each world is recorded by member in the
    round's log: the second death is shrunk away and grown back too, and the summary says so of both."""
    code, err, reports = _run(
        tmp_path,
        ["--nproc-per-node", "4", "--replace-dead", "--max-replacements", "2"],
        ["--regrow", "--steps", "60", "--pause", "0.15", "--kill", f"3:3:average,{second}"],
    )
    assert code == 0, err[-3000:]
    ranks = [report for report in reports if "rank" in report]
    assert sorted(report["rank"] for report in ranks) == [0, 1, 2, 3], reports
    for report in ranks:
        assert report["shape"] == {"tp": 2, "dp": 2} and report["step"] == 60, report
        assert report["max_abs_vs_one_process"] < 1e-9, report
    for tp in (0, 1):
        assert len({report["weights_sha256"] for report in ranks if report["tp"] == tp}) == 1, ranks
    summary = err[err.index("summary: ") :]
    assert summary.startswith("summary: succeeded: 4 of 6 workers finished"), summary
    assert (
        f"{who}: died by signal SIGKILL; shrunk away" in summary
        and "rank 3: died by signal SIGKILL; shrunk away" in summary
    )
    assert "replacements started: 2" in summary, summary
