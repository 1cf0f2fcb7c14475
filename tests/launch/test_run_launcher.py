"""``python -m hypergrid.run`` for real: a worker SIGKILLed, the survivors shrink and finish; plain torchrun's contrast.

Each run starts the launcher (one agent per node, gloo workers on 127.0.0.1)
on examples/launcher_survivors.py, whose workers all-reduce over ``dp`` and
``tp`` for a few steps; one SIGKILLs itself at a step. Every worker that gets
to its end appends a JSON line to a report file: what EVERY survivor saw is
checked against sums computed here, with the launcher's exit code and its
summary. Outcomes, never times: the dead rank may be named at once or found
by shrink's timeout. Each run is under a hard wall-clock limit that kills
its whole process group.
"""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import signal
import subprocess
import sys
import time
from typing import Any

import pytest

from benchmarks.common import free_port

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "examples" / "launcher_survivors.py"
ENDINGS = ROOT / "tests" / "workers" / "launched.py"  # workers that end as a test asks
STEPS, KILL_STEP, VICTIM = 5, 2, 3
pytestmark = [pytest.mark.processes, pytest.mark.timeout(240)]


def _start(
    launcher: str, flags: list[str], script_args: list[str], script: pathlib.Path = SCRIPT
) -> subprocess.Popen[str]:
    env = {key: value for key, value in os.environ.items() if key not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    command = [sys.executable, "-m", launcher, *flags, str(script), *script_args]
    return subprocess.Popen(
        command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )


def _descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (torchelastic starts each worker in a session of its own)."""
    found = []
    for task in pathlib.Path(f"/proc/{pid}/task").glob("*"):
        try:
            children = (task / "children").read_text().split()
        except OSError:
            continue
        for child in map(int, children):
            found += [child, *_descendants(child)]
    return found


def _finish(*processes: subprocess.Popen[str], timeout_s: float = 150) -> list[tuple[int, str, str]]:
    """Wait for the launchers; past the limit, kill them and every worker they started, and fail."""
    deadline = time.monotonic() + timeout_s
    results = []
    try:
        for process in processes:
            out, err = process.communicate(timeout=max(deadline - time.monotonic(), 0.1))
            results.append((process.returncode, out, err))
    except subprocess.TimeoutExpired:
        tails = []
        for process in processes:
            for pid in [*_descendants(process.pid), process.pid]:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            tails.append(process.communicate(timeout=30)[1][-2000:])
        pytest.fail(f"the launcher(s) did not finish within {timeout_s} s; stderr tails:\n" + "\n".join(tails))
    return results


def _run(launcher: str, flags: list[str], report: pathlib.Path, *script: str) -> tuple[int, str, str]:
    args = ["--steps", str(STEPS), "--kill-rank", str(VICTIM), "--report", str(report), *script]
    return _finish(_start(launcher, flags, args))[0]


def _reports(path: pathlib.Path) -> dict[int, dict[str, Any]]:
    """first rank -> what that worker reported (one JSON line each; a killed worker writes none)."""
    if not path.exists():
        return {}
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    by_rank = {line["first_rank"]: line for line in lines}
    assert len(by_rank) == len(lines), lines  # nobody reported twice
    return by_rank


def _expected_sums(world: int, tp: int, rank: int, step: int) -> dict[str, float]:
    """The sums of step ``step`` for ``rank`` of a tp x dp grid over ``world`` ranks (rank r adds (r+1)(step+1))."""
    dp_members = [r for r in range(world) if r % tp == rank % tp]
    tp_members = [r for r in range(world) if r // tp == rank // tp]
    return {
        "dp": float(sum(r + 1 for r in dp_members) * (step + 1)),
        "tp": float(sum(r + 1 for r in tp_members) * (step + 1)),
    }


def _check_survivor(report: dict[str, Any], *, world: int, tp: int, new_world: int, kill_step: int) -> None:
    """A survivor caught RankFailure, shrank past the victim and got every step's sums right, before and after."""
    assert report["caught"] == "RankFailure" and report["dead"] == [VICTIM], report
    assert not report["retired"] and report["world"] == new_world, report
    assert report["shape"] == {"tp": tp, "dp": new_world // tp}, report
    assert len(report["sums"]) == STEPS, report
    for step, sums in enumerate(report["sums"]):
        if step < kill_step:
            expected = _expected_sums(world, tp, report["first_rank"], step)
        else:
            expected = _expected_sums(new_world, tp, report["rank"], step)
        assert sums == expected, (report["first_rank"], step, sums, expected)


def _summary_lines(err: str) -> dict[int, str]:
    """rank -> its line in the launcher's exit summary (``  rank 3: died by signal SIGKILL (pid ...)``)."""
    lines = {}
    for line in err.splitlines():
        head, sep, rest = line.strip().partition(": ")
        if sep and head.startswith("rank ") and head[5:].isdigit() and "(pid " in rest:
            lines[int(head[5:])] = rest
    return lines


def test_a_sigkilled_worker_leaves_three_survivors_that_shrink_and_finish(tmp_path: pathlib.Path) -> None:
    report = tmp_path / "report.jsonl"
    code, _, err = _run("hypergrid.run", ["--standalone", "--nproc-per-node", "4"], report, "--kill-step", "2")
    assert code == 0, err[-3000:]
    reports = _reports(report)
    assert sorted(reports) == [0, 1, 2], err[-3000:]
    for first in (0, 1, 2):
        _check_survivor(reports[first], world=4, tp=1, new_world=3, kill_step=KILL_STEP)
    assert sorted(r["rank"] for r in reports.values()) == [0, 1, 2]
    # the launcher reported the death when it happened, kept the others running, and summed up
    assert f"worker rank {VICTIM} (local rank {VICTIM}" in err and "the others keep running" in err
    # the death was accounted for: the survivors' shrink excluded it
    assert "summary: succeeded: 3 of 4 workers finished; rank 3 died by signal SIGKILL and was shrunk away" in err
    summary = _summary_lines(err)
    assert summary[VICTIM].startswith("died by signal SIGKILL; shrunk away")
    assert all(summary[r].startswith("exited 0") for r in (0, 1, 2)), summary
    assert "job: 1 of 4 workers failed; --min-healthy 1; restarts used: 0" in err


def test_plain_torchrun_stops_the_survivors(tmp_path: pathlib.Path) -> None:
    """The problem hypergrid.run exists for: torchrun's agent SIGTERMs every other worker when one dies."""
    report = tmp_path / "report.jsonl"
    flags = ["--standalone", "--nproc-per-node", "4"]
    code, _, err = _run("torch.distributed.run", flags, report, "--kill-step", "0")
    assert code == 1, err[-3000:]
    assert _reports(report) == {}  # no survivor got to its end
    assert err.count("closing signal SIGTERM") == 3, err[-3000:]


def test_below_the_minimum_the_survivors_are_stopped_and_the_run_fails(tmp_path: pathlib.Path) -> None:
    report = tmp_path / "report.jsonl"
    flags = ["--standalone", "--nproc-per-node", "4", "--min-healthy", "4"]
    code, _, err = _run("hypergrid.run", flags, report, "--kill-step", "0")
    assert code == 1, err[-3000:]
    assert _reports(report) == {}
    assert "the job fell below --min-healthy 4 (1 of 4 workers failed) and no restart left" in err
    summary = _summary_lines(err)
    assert summary[VICTIM].startswith("died by signal SIGKILL")
    assert all(summary[r].startswith("stopped by the launcher") for r in (0, 1, 2)), summary
    assert "summary: failed" in err


def test_below_the_minimum_with_a_restart_left_every_worker_restarts(tmp_path: pathlib.Path) -> None:
    report = tmp_path / "report.jsonl"
    flags = ["--standalone", "--nproc-per-node", "4", "--min-healthy", "4", "--max-restarts", "1"]
    code, _, err = _run("hypergrid.run", flags, report, "--kill-step", "0")
    assert code == 0, err[-3000:]
    reports = _reports(report)
    assert sorted(reports) == [0, 1, 2, 3], err[-3000:]  # the victim kills itself on the first attempt only
    for first, seen in reports.items():
        assert seen["restart"] == 1 and seen["caught"] is None and seen["world"] == 4, seen
        assert seen["sums"] == [_expected_sums(4, 1, first, step) for step in range(STEPS)]
    assert "restarting every worker" in err and "restarts used: 1" in err


def test_two_nodes_the_survivors_on_both_shrink_and_both_agents_succeed(tmp_path: pathlib.Path) -> None:
    """Two agents on this host (c10d rendezvous on 127.0.0.1), 2 workers each, tp=2 x dp=2; rank 3 dies.

    Rank 3's dp slice (ranks 2, 3: node 1) goes: rank 2 retires and exits 0,
    so node 1's workers are all done while node 0's still run; its agent waits
    in the exit barrier (it may host the store node 0's workers use).
    """
    report = tmp_path / "report.jsonl"
    flags = _two_nodes()
    args = ["--steps", str(STEPS), "--kill-rank", str(VICTIM), "--kill-step", "2", "--tp", "2", "--report", str(report)]
    agents = [_start("hypergrid.run", flags, args) for _ in range(2)]
    finished = _finish(*agents)
    assert [code for code, _, _ in finished] == [0, 0], [err[-2000:] for _, _, err in finished]
    reports = _reports(report)
    assert sorted(reports) == [0, 1, 2]
    retired = reports[2]
    assert retired["caught"] == "RankFailure" and retired["dead"] == [VICTIM] and retired["retired"], retired
    assert retired["sums"] == [_expected_sums(4, 2, 2, step) for step in range(KILL_STEP)]
    for first in (0, 1):
        _check_survivor(reports[first], world=4, tp=2, new_world=2, kill_step=KILL_STEP)
    errs = "\n".join(err for _, _, err in finished)
    assert errs.count("summary: succeeded") == 2
    assert "summary: succeeded: 1 of 2 workers finished; rank 3 died by signal SIGKILL and was shrunk away" in errs
    assert "job: 1 of 4 workers failed" in errs
    summary = _summary_lines(errs)
    assert summary[VICTIM].startswith("died by signal SIGKILL; shrunk away")
    assert all(summary[r].startswith("exited 0") for r in (0, 1, 2)), summary


def _two_nodes(*more: str) -> list[str]:
    """The flags of one of two agents on this host: a c10d rendezvous on 127.0.0.1, 2 workers each."""
    port = free_port()
    return [
        "--nnodes", "2", "--nproc-per-node", "2", "--rdzv-backend", "c10d",
        "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", f"two-nodes-{port}", "--local-addr", "127.0.0.1", *more,
    ]  # fmt: skip


def test_two_nodes_restart_together_below_the_minimum_and_no_agent_is_taken_for_dead(tmp_path: pathlib.Path) -> None:
    """Rank 3 (node 1) dies at step 0 under ``--min-healthy 4 --max-restarts 1``: both agents restart every
    worker, each closing its round's ring before the next rendezvous, and the second round (a ring of its own) runs
    to the end. Neither agent reports the other dead, nor a ring that could not start or act: the ring's own cases
    (an orderly leave, all at once, never read as a death) are in tests/launch/test_ring.py."""
    report = tmp_path / "report.jsonl"
    flags = _two_nodes("--min-healthy", "4", "--max-restarts", "1")
    args = ["--steps", str(STEPS), "--kill-rank", str(VICTIM), "--kill-step", "0", "--report", str(report)]
    finished = _finish(*[_start("hypergrid.run", flags, args) for _ in range(2)])
    errs = "\n".join(err for _, _, err in finished)
    assert [code for code, _, _ in finished] == [0, 0], errs[-3000:]
    reports = _reports(report)
    assert sorted(reports) == [0, 1, 2, 3], errs[-3000:]
    assert all(seen["restart"] == 1 and seen["caught"] is None for seen in reports.values()), reports
    assert errs.count("restarting every worker") == 2 and "died with their agent" not in errs, errs[-3000:]
    assert "agents' ring" not in errs and "the ring could not" not in errs, errs[-3000:]  # (start, act)


def test_a_signalled_launcher_stops_its_workers_and_exits_128_plus_the_signal() -> None:
    launcher = _start("hypergrid.run", ["--standalone", "--nproc-per-node", "2"], ["--steps", "10000000"])
    deadline = time.monotonic() + 60
    while len(_descendants(launcher.pid)) < 2 and time.monotonic() < deadline:
        time.sleep(0.2)
    time.sleep(2)  # the workers are in their steps
    launcher.send_signal(signal.SIGTERM)
    ((code, _, err),) = _finish(launcher)
    assert code == 128 + signal.SIGTERM, err[-3000:]
    assert "summary: stopped: the launcher got SIGTERM" in err
    summary = _summary_lines(err)
    assert sorted(summary) == [0, 1] and all(line.startswith("stopped by the launcher") for line in summary.values())


# -- the exit code tells the truth -------------------------------------------------------------


def _ending(mode: str, workers: int) -> tuple[int, str, dict[int, str]]:
    """Run ``tests/workers/launched.py MODE`` on ``workers`` workers: the exit code, stderr and the summary's lines."""
    launcher = _start("hypergrid.run", ["--standalone", "--nproc-per-node", str(workers)], [mode], ENDINGS)
    ((code, _, err),) = _finish(launcher)
    return code, err, _summary_lines(err)


def test_workers_that_raise_fail_the_run_and_the_summary_names_them() -> None:
    """Six workers for a 4-rank grid: ranks 4 and 5 raise RankError; nobody shrinks them away."""
    code, err, summary = _ending("outside", 6)
    assert code == 1, err[-3000:]
    assert "summary: failed: rank 4 raised RankError, rank 5 raised RankError; no shrink excluded them" in err
    for rank in (4, 5):
        assert summary[rank].startswith(f"raised RankError: all_reduce: rank {rank} is outside the grid"), summary
        assert "; exit code 1 (pid " in summary[rank]
    assert all(summary[r].startswith("exited 0") for r in range(4)), summary
    assert "job: 2 of 6 workers failed" in err


def test_a_death_no_shrink_accounted_for_fails_the_run() -> None:
    """Rank 3 SIGKILLs itself after the last collective; the others finish without noticing."""
    code, err, summary = _ending("die", 4)
    assert code == 1, err[-3000:]
    assert "summary: failed: rank 3 died by signal SIGKILL and no shrink excluded it" in err
    assert summary[3].startswith("died by signal SIGKILL (pid"), summary
    assert all(summary[r].startswith("exited 0") for r in range(3)), summary


def _started(launcher: subprocess.Popen[str], pids: pathlib.Path, count: int) -> list[int]:
    """The workers' pids, once each has written its own (fails the test if they do not start)."""
    deadline = time.monotonic() + 90
    while len(list(pids.glob("rank*.pid"))) < count and time.monotonic() < deadline and launcher.poll() is None:
        time.sleep(0.1)
    found = [int(path.read_text()) for path in sorted(pids.glob("rank*.pid"))]
    assert len(found) == count, launcher.poll()
    return found


def test_the_summary_after_a_sigterm_counts_the_failures_it_lists(tmp_path: pathlib.Path) -> None:
    flags = ["--standalone", "--nproc-per-node", "2"]
    launcher = _start("hypergrid.run", flags, ["sleep", "--pids", str(tmp_path)], ENDINGS)
    _, victim = _started(launcher, tmp_path, 2)
    os.kill(victim, signal.SIGKILL)
    assert launcher.stderr is not None
    for line in launcher.stderr:  # the agent saw the death before it is stopped
        if line.startswith("hypergrid.run: worker rank 1 "):
            break
    launcher.send_signal(signal.SIGTERM)
    ((code, _, err),) = _finish(launcher)
    assert code == 128 + signal.SIGTERM, err[-3000:]
    assert "summary: stopped: the launcher got SIGTERM" in err
    summary = _summary_lines(err)
    assert summary[0].startswith("stopped by the launcher") and summary[1].startswith("died by signal SIGKILL")
    assert "job: 1 of 2 workers failed" in err


def test_a_sigkilled_launcher_leaves_no_worker_behind(tmp_path: pathlib.Path) -> None:
    flags = ["--standalone", "--nproc-per-node", "2"]
    launcher = _start("hypergrid.run", flags, ["sleep", "--pids", str(tmp_path)], ENDINGS)
    workers = _started(launcher, tmp_path, 2)
    try:
        launcher.kill()
        launcher.communicate(timeout=30)
        deadline = time.monotonic() + 10  # "within a few seconds": a bound on the wait, not a timing asserted
        while time.monotonic() < deadline and not all(_ended(pid) for pid in workers):
            time.sleep(0.05)
        assert [pid for pid in workers if not _ended(pid)] == []
    finally:
        for pid in workers:
            with contextlib.suppress(ProcessLookupError):
                if not _ended(pid):
                    os.kill(pid, signal.SIGKILL)


def _ended(pid: int) -> bool:
    """The process has ended (a zombie not yet reaped by its new parent counts)."""
    try:
        return pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except OSError:
        return True


def test_two_shrinks_account_for_both_deaths_in_the_launchers_ranks() -> None:
    """Rank 1 dies, the survivors shrink (ranks move down); rank 4 (that world's rank 3) dies, they shrink again."""
    code, err, summary = _ending("twice", 6)
    assert code == 0, err[-3000:]
    assert (
        "summary: succeeded: 4 of 6 workers finished; rank 1 died by signal SIGKILL and was shrunk away; "
        "rank 4 died by signal SIGKILL and was shrunk away"
    ) in err
    assert summary[1].startswith("died by signal SIGKILL; shrunk away") and summary[4].startswith("died by signal")
    assert all(summary[r].startswith("exited 0") for r in (0, 2, 3, 5)), summary
