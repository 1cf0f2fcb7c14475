"""The docs' quick start (docs/elastic.md) under ``python -m hypergrid.run --replace-dead``, a worker SIGKILLed in
set-up, mid-run, and while the grid grows back (issue 54): the launcher exits 0 and every finisher's replicas are
bitwise equal.

The quick start runs as written but for its pause (0.15 s a step instead of 0.5). The test reads the workers'
output as a user would and kills from outside, by pid: whatever the exact moment the kill lands (torch's formation
of the first world, the families' creation, ``setup``, a step), the outcome must be the same.
"""

from __future__ import annotations

import os
import pathlib
import re
import signal
import subprocess
import sys
import threading
import time

import pytest

from tests import snippets
from tests.launch.test_run_launcher import ROOT, _descendants

pytestmark = [pytest.mark.processes, pytest.mark.timeout(200)]


def _quick_start(tmp_path: pathlib.Path) -> pathlib.Path:
    text = (ROOT / "docs" / "elastic.md").read_text(encoding="utf-8")
    (quick,) = snippets.parse("docs/elastic.md", text)
    constants = "TP, SPARES, STEPS, PAUSE, BATCH = 2, 2, 30, {}, 24"
    source = quick.source.replace(constants.format("0.5"), constants.format("0.15"))
    assert source != quick.source, "the quick start's constants changed: update this test"
    script = tmp_path / "quickstart.py"
    script.write_text(source)
    return script


class Job:
    """The launcher on the quick start, its stdout read line by line (pids by first rank) while it runs."""

    def __init__(self, script: pathlib.Path, flags: list[str]) -> None:
        env = {key: value for key, value in os.environ.items() if key not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
        command = [sys.executable, "-m", "hypergrid.run", "--standalone", "--nproc-per-node", "6", *flags, str(script)]
        self.process = subprocess.Popen(command, cwd=script.parent, env=env, stdout=subprocess.PIPE,
                                        stderr=subprocess.PIPE, text=True, start_new_session=True)  # fmt: skip
        self.lines: list[str] = []
        self.errors: list[str] = []  # (stderr: read by a thread of its own, so that neither pipe fills)
        self.pids: dict[str, int] = {}
        self.seen = threading.Condition()
        errors = threading.Thread(target=lambda: self.errors.extend(self.process.stderr or []), daemon=True)
        self.readers = [threading.Thread(target=self._read, daemon=True), errors]
        for reader in self.readers:
            reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            with self.seen:
                self.lines.append(line)
                for pid, rank in re.findall(r"pid (\d+): rank (\d+)", line):
                    self.pids.setdefault(rank, int(pid))
                self.seen.notify_all()

    def wait_for(self, pattern: str, timeout_s: float = 90) -> None:
        with self.seen:
            seen = self.seen.wait_for(lambda: re.search(pattern, "".join(self.lines)) is not None, timeout_s)
        assert seen, f"never saw {pattern!r}:\n{''.join(self.lines)[-3000:]}"

    def kill(self, rank: str) -> None:
        os.kill(self.pids[rank], signal.SIGKILL)

    def finish(self, timeout_s: float = 150) -> tuple[int, str, str]:
        try:
            self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            for pid in [*_descendants(self.process.pid), self.process.pid]:
                os.kill(pid, signal.SIGKILL)
            pytest.fail(f"the job did not finish within {timeout_s} s:\n{''.join(self.lines)[-3000:]}")
        for reader in self.readers:
            reader.join(10)
        return self.process.returncode, "".join(self.lines), "".join(self.errors)


def _check(code: int, out: str, err: str) -> None:
    assert code == 0, f"exit {code}\n{out[-3000:]}\n{err[-3000:]}"
    equal = re.findall(r"finished 30 steps as Coord\(tp=\d, dp=\d\); replicas equal: (\w+)", out)
    assert equal == ["True"] * 4, out[-3000:]
    assert "Traceback" not in out + err and "frame #" not in err, err[-3000:]


def test_a_kill_in_set_up_ends_with_exit_0_and_equal_replicas(tmp_path: pathlib.Path) -> None:
    job = Job(_quick_start(tmp_path), ["--replace-dead"])
    job.wait_for(r"(?s)(pid \d+: rank \d.*){6}")  # every worker started; torch forms the world fast
    time.sleep(
        1.0
    )  # the families' creation, setup or the first steps (not torch's formation: the agent's check is off)
    job.kill("3")
    _check(*job.finish())


def test_a_kill_mid_run_ends_with_exit_0_and_equal_replicas(tmp_path: pathlib.Path) -> None:
    job = Job(_quick_start(tmp_path), ["--replace-dead"])
    job.wait_for(r"step 5: loss")
    job.kill("2")
    code, out, err = job.finish()
    _check(code, out, err)
    assert re.search(r"hypergrid.loop: rank 4: .*resuming at step \d+", out), out[-3000:]  # the spare was drafted


def test_a_kill_during_a_growth_ends_with_exit_0_and_equal_replicas(tmp_path: pathlib.Path) -> None:
    """Rank 3 dies (a spare takes its place); as its replacement arrives and the job takes it in, rank 0 dies."""
    job = Job(_quick_start(tmp_path), ["--replace-dead"])
    job.wait_for(r"step 5: loss")
    job.kill("3")
    job.wait_for(r"arrives to join the running job")
    job.kill("0")
    code, out, err = job.finish()
    _check(code, out, err)
    assert "replacements started: 2" in err, err[-3000:]
