"""Growing back (issue 47): ranks die, processes arrive, the grid regains its shape with the agreed step's state.

Real gloo processes started the way a launcher starts them (``env://``, the store hosted here, outliving every
worker: ``TORCHELASTIC_USE_AGENT_STORE=True``), each test under a hard wall-clock limit (`_Job.wait`, then
pytest-timeout). Members run ``tests/workers/regrow.py``: a linear model sharded over ``tp``, the batch over
``dp``; an arrival is the same script with ``HYPERGRID_ARRIVAL=1`` (it calls ``grid.arrive``), a rank a shrink
retired calls ``arrive`` too (without waking anyone). The other kill points and ways for an arrival to die are
``stress`` (``make test-stress``). Every test reads EVERY process's report line and checks the
final shape, that the dp replicas of each tp shard are bitwise equal, and that each shard is within 1e-9 of the
same training in one process.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from torch.distributed import TCPStore  # type: ignore[attr-defined]

from benchmarks.common import free_port

pytestmark = [pytest.mark.processes]

ROOT = Path(__file__).resolve().parents[2]
#: Slow steps: an arrival (a fresh interpreter importing torch, a few seconds here) comes while the others train.
STEPS = ["--steps", "30", "--pause", "0.15"]


class _Job:
    """Members of a job and its arrivals, as processes of ``tests/workers/regrow.py``, on a store hosted here."""

    def __init__(self, tmp_path: Path, size: int, flags: list[str]) -> None:
        self.report = tmp_path / "report.jsonl"
        self.store = TCPStore("127.0.0.1", free_port(), is_master=True, wait_for_workers=False)
        self.env = {
            **{name: value for name, value in os.environ.items() if not name.startswith("HYPERGRID_")},
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(self.store.port),
            "WORLD_SIZE": str(size),
            "TORCHELASTIC_USE_AGENT_STORE": "True",
            "PYTHONPATH": str(ROOT),
        }
        self.command = [sys.executable, "-m", "tests.workers.regrow", "--report", str(self.report), *flags]
        self.members = [self._start({"RANK": str(rank)}) for rank in range(size)]
        self.arrivals: list[subprocess.Popen[bytes]] = []

    def _start(self, env: dict[str, str]) -> subprocess.Popen[bytes]:
        return subprocess.Popen(self.command, env={**self.env, **env}, cwd=ROOT, stderr=subprocess.PIPE)

    def arrive(self, rank: int) -> None:
        """Start an arrival in place of launcher rank ``rank`` (as ``hypergrid.run --replace-dead`` does)."""
        self.arrivals.append(self._start({"RANK": str(rank), "HYPERGRID_ARRIVAL": "1"}))

    def first_death(self, limit_s: float) -> int:
        """Wait until a member exited (the one a ``--kill`` killed): its index."""
        deadline = time.monotonic() + limit_s
        while time.monotonic() < deadline:
            for rank, process in enumerate(self.members):
                if process.poll() is not None:
                    return rank
            time.sleep(0.05)
        raise AssertionError(f"no member died within {limit_s} s")

    def wait(self, limit_s: float) -> list[dict[str, Any]]:
        """Every process ended within ``limit_s`` (else each is killed and the test fails); their reports."""
        deadline = time.monotonic() + limit_s
        processes = self.members + self.arrivals
        for process in processes:
            try:
                process.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                for each in processes:
                    each.kill()
                raise AssertionError(f"a process was still running after {limit_s} s:\n{self.stderr()}") from None
        return [json.loads(line) for line in self.report.read_text().splitlines()] if self.report.exists() else []

    def stderr(self) -> str:
        return "\n".join(
            f"--- pid {process.pid} (exit {process.returncode}):\n" + process.stderr.read().decode()[-3000:]
            for process in self.members + self.arrivals
            if process.stderr is not None and process.poll() is not None
        )


def _trained(reports: list[dict[str, Any]], shape: list[int], spares: int = 0) -> list[dict[str, Any]]:
    """The reports of the final grid's ranks: one per rank, the shape ``shape``, replicas equal, each shard right."""
    ranks = [report for report in reports if "rank" in report]
    assert sorted(report["rank"] for report in ranks) == list(range(shape[0] * shape[1])), reports
    for report in ranks:
        assert report["shape"] == shape and report["world"] == shape[0] * shape[1] + spares, report
        assert report["step"] == 30, report
        assert report["max_abs_vs_one_process"] < 1e-9, report
    for tp in range(shape[0]):
        digests = {report["weights_sha256"] for report in ranks if report["tp"] == tp}
        assert len(digests) == 1, (tp, ranks)  # every dp replica of the shard: bitwise equal
    return ranks


@pytest.mark.timeout(150)
@pytest.mark.parametrize(
    "point", ["dp", *(pytest.param(point, marks=pytest.mark.stress) for point in ("begin", "tp", "end"))]
)
def test_a_death_then_an_arrival_brings_the_grid_back_to_its_shape(tmp_path: Path, point: str) -> None:
    """tp2 x dp2: rank 3 SIGKILLs itself at ``point`` of step 3; "drop" removes its dp slice (rank 2 retired, it
    waits to come back); an arrival started in rank 3's place wakes the others, whose shrink takes both in: every
    process ends on tp2 x dp2 at step 30, replicas equal, within 1e-9 of one process."""
    job = _Job(tmp_path, 4, ["--kill", f"3:3:{point}", *STEPS])
    assert job.first_death(60) == 3
    job.arrive(3)
    reports = job.wait(120)
    ranks = _trained(reports, [2, 2])
    assert [process.returncode for process in job.members] == [0, 0, 0, -9], job.stderr()
    assert [process.returncode for process in job.arrivals] == [0], job.stderr()
    by_first = {report["first_rank"]: report for report in reports if not report["arrival"]}
    assert by_first[2].get("retired") == 1 and by_first[2]["grew"] == 1, reports  # it came back
    assert all(report["grew"] == 1 for report in ranks), reports
    assert next(report for report in ranks if report["arrival"])["first_rank"] == 3


@pytest.mark.timeout(150)
def test_grow_at_a_chosen_step_takes_in_arrivals_that_did_not_wake_anyone(tmp_path: Path) -> None:
    """tp2 x dp2 with one spare slot of nothing: rank 3 dies at step 3; the arrival does not wake the ranks
    (``wake_ranks=False``); at step 25 every member calls ``grid.grow``, which takes the arrival and the retired rank
    in: tp2 x dp2 again."""
    job = _Job(tmp_path, 4, ["--kill", "3:3:begin", "--no-wake", "--grow-at", "25", *STEPS])
    job.first_death(60)
    job.arrive(3)
    reports = job.wait(120)
    _trained(reports, [2, 2])
    survivors = [report for report in reports if report["first_rank"] in (0, 1) and not report["arrival"]]
    assert all(report["grew_by_call"] and report["shrinks"] == [[3]] for report in survivors), reports


@pytest.mark.timeout(150)
@pytest.mark.parametrize(
    "where", ["forming", *(pytest.param(where, marks=pytest.mark.stress) for where in ("drafted", "families"))]
)
def test_an_arrival_that_dies_while_it_joins_is_dropped_and_the_job_goes_on(tmp_path: Path, where: str) -> None:
    """The arrival ``os._exit``s once drafted, inside torch's rendezvous, or while the families are created: the
    others plan without it; one arrival short of a slice, the retired rank waits again (released at the end) and
    the job ends on tp2 x dp1, right."""
    job = _Job(tmp_path, 4, ["--kill", "3:3:tp", "--arrival-dies", where, *STEPS])
    job.first_death(60)
    job.arrive(3)
    reports = job.wait(120)
    _trained(reports, [2, 1])
    assert [process.returncode for process in job.arrivals] == [3], job.stderr()
    retired = [report for report in reports if report["first_rank"] == 2 and not report["arrival"]]
    assert retired and retired[0].get("released"), reports


@pytest.mark.stress
@pytest.mark.timeout(150)
def test_an_arrival_stopped_while_it_joins_is_dropped_and_fenced_once_it_resumes(tmp_path: Path) -> None:
    """The arrival SIGSTOPs itself inside torch's rendezvous of the new world; 8 s later the test resumes it. The
    others dropped it (its heartbeat stood still) and went on at tp2 x dp1; resumed, it raises ``FencedError``."""
    job = _Job(tmp_path, 4, ["--kill", "3:3:tp", "--arrival-dies", "stopped", *STEPS])
    job.first_death(60)
    job.arrive(3)
    stat = Path(f"/proc/{job.arrivals[0].pid}/stat")
    deadline = time.monotonic() + 60
    while stat.read_text().rpartition(")")[2].split()[0] != "T":
        assert time.monotonic() < deadline and job.arrivals[0].poll() is None, job.stderr()
        time.sleep(0.05)
    time.sleep(8.0)
    job.arrivals[0].send_signal(signal.SIGCONT)
    reports = job.wait(120)
    _trained(reports, [2, 1])
    arrivals = [report for report in reports if report["arrival"]]
    assert len(arrivals) == 1, job.stderr()
    assert arrivals[0].get("raised") == "FencedError" and "without arrival" in arrivals[0]["said"], arrivals
    assert job.arrivals[0].returncode == 0, job.stderr()


@pytest.mark.timeout(200)
def test_a_member_that_dies_while_the_grid_grows_is_absorbed(tmp_path: Path) -> None:
    """tp2 x dp4: rank 7 dies at step 3 (rank 6 retired); the arrival wakes the others; while the world forms with
    it, rank 0 SIGKILLs itself inside torch's rendezvous. The attempt fails, the next plan drops rank 0's slice
    (rank 1 retired) and still grows by the slice of the arrival and rank 6: tp2 x dp3, right, everyone told."""
    job = _Job(tmp_path, 8, ["--kill", "7:3:tp", "--kill-in-grow", "0", *STEPS])
    job.first_death(90)
    job.arrive(7)
    reports = job.wait(170)
    ranks = _trained(reports, [2, 3])
    assert job.members[0].returncode == -9 and job.members[7].returncode == -9, job.stderr()
    assert {report["first_rank"] for report in ranks if report["arrival"]} == {7}
    assert any(report["first_rank"] == 6 and not report["arrival"] for report in ranks), reports
    assert all(report["shrinks"][-1] == [0] for report in ranks if not report["arrival"] and "retired" not in report)


@pytest.mark.timeout(150)
def test_an_arrival_refills_the_spares_after_one_was_drafted(tmp_path: Path) -> None:
    """tp2 x dp2 and one spare (5 ranks), policy "spares": rank 3 dies, the spare takes its place; the arrival is
    taken in as the new spare (the grid keeps its shape, the spares come back to one), and is released at the
    end."""
    job = _Job(tmp_path, 5, ["--kill", "3:3:dp", "--spares", "1", "--policy", "spares", *STEPS])
    job.first_death(60)
    job.arrive(3)
    reports = job.wait(120)
    _trained(reports, [2, 2], spares=1)
    arrival = [report for report in reports if report["arrival"]]
    assert len(arrival) == 1 and arrival[0].get("spare") and arrival[0].get("released"), reports
