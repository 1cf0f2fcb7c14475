"""Long benchmarks report progress on stderr, never in the report they print on stdout."""

from __future__ import annotations

import re

import pytest

from benchmarks import allreduce, enumeration
from benchmarks.common import progress

LINE = re.compile(r"^\[\s*(\d+\.\d)s\] (.*)$")


def _progress_lines(err: str) -> list[tuple[float, str]]:
    lines = [LINE.match(line) for line in err.splitlines()]
    return [(float(m.group(1)), m.group(2)) for m in lines if m]


def test_progress_goes_to_stderr_with_the_elapsed_time(capsys: pytest.CaptureFixture[str]) -> None:
    progress("first")
    progress("second step")
    out, err = capsys.readouterr()
    assert out == ""
    lines = _progress_lines(err)
    assert [message for _, message in lines] == ["first", "second step"]
    assert 0 <= lines[0][0] <= lines[1][0]
    assert len(err.splitlines()) == 2


def test_enumeration_reports_each_family(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(enumeration, "SHAPE", [2, 2, 2, 4])
    monkeypatch.setattr(enumeration, "SMALL_SHAPE", [2, 2, 2])
    monkeypatch.setattr("sys.argv", ["enumeration.py", "--repeats", "1", "--slow-repeats", "1", "--lookups", "3"])
    assert enumeration.main() == 0
    out, err = capsys.readouterr()
    messages = [message for _, message in _progress_lines(err)]
    enumerated = [m for m in messages if m.startswith("enumeration ")]
    looked_up = [m for m in messages if m.startswith("own-group lookups ")]
    assert [m.split()[1] for m in enumerated] == [f"{i}/15" for i in range(1, 16)]
    assert [m.split()[2] for m in looked_up] == [f"{i}/7" for i in range(1, 8)]
    assert "Targets:" in out and not _progress_lines(out)


@pytest.mark.processes
@pytest.mark.timeout(240)
def test_allreduce_reports_families_and_sizes(capfd: pytest.CaptureFixture[str]) -> None:
    argv = ["--shape", "2,2", "--dims", "tp,dp", "--families", "tp;dp", "--minbytes", "1K", "--maxbytes", "2K"]
    assert allreduce.main([*argv, "--iters", "1", "--warmup", "0"]) == 0
    out, err = capfd.readouterr()
    messages = [message for _, message in _progress_lines(err)]
    assert messages[0] == "starting 4 local gloo processes"
    assert [m.split(":")[0] for m in messages if m.startswith("family ")] == ["family 1/2 tp", "family 2/2 dp"]
    rows = [m.split() for m in messages if m.startswith(("tp ", "dp "))]
    assert [(r[0], r[1], r[2]) for r in rows] == [
        (family, impl, size) for family in ("tp", "dp") for size in ("1024", "2048") for impl in ("hypergrid", "raw")
    ]
    assert "# total #wrong: 0" in out and not _progress_lines(out)
