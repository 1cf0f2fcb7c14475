"""Random kills under ``python -m hypergrid.run``, repeated: the failure promises of issue 53 as a user lives them.

    python benchmarks/chaos.py [--cases resume,grow-death,two-at-once,during-growth,churn] [--runs 30] [--seed 1]
        [--json FILE] [--logs DIR]

Each run starts ``examples/elastic_tp_dp.py`` (tp 2 MLP blocks, Adam, float64) under the launcher in a process
group of its own, under a hard wall-clock limit, and kills at a moment drawn from the run's seed:

- ``resume``: 6 workers; one random worker SIGKILLed from outside at a random moment of training.
- ``grow-death``: 4 workers with ``--replace-dead --max-replacements 2 --regrow``; rank 3 dies in step 3, the grid
  grows back, then a random member (an original, or the replacement ``3.1``) dies a random 1-4 steps later at a
  random point of the step.
- ``two-at-once``: 6 workers with ``--replace-dead --max-replacements 2 --regrow``; two random workers die at the
  same point of the same step.
- ``during-growth``: 6 workers with ``--replace-dead --max-replacements 2 --regrow``; rank 5 dies in step 3 (tp 2 x
  dp 2 go on, rank 4 waits to come back), and a random other worker (rank 4 included) is SIGKILLed from outside a
  random 0-1.5 s after rank 5's replacement announced itself (the growth's shrink runs then). A death that leaves
  no complete replica (tp 2 x dp 1 losing a rank) is not a case: the job cannot go on, and that it ends is
  issue 54's (today its waiting arrivals hang).
- ``churn``: 8 workers of `benchmarks/churn_worker.py` create, use and destroy tp 2 x dp groups in a loop; one random
  worker is SIGKILLed from outside a random 0.5-8 s into it. Every survivor must raise ``RankFailure`` naming exactly
  that rank within `CHURN_BOUND_S` of the kill, none may be fenced, and each must write its result.

A run of the example passes when the launcher exits 0 within the limit, its summary says ``succeeded``, every
report is at the final step, every dp replica of a tp shard is bitwise equal and within 1e-9 of the same training
in one process, and no C++ ``frame #`` line was printed. Each run prints one line; the failures are listed at the
end, with the seed that reproduces each (``--seed S --runs 1``); the exit code is 1 when any run failed.
``make chaos`` runs 30 of each.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import pathlib
import random
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from typing import Any

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

from benchmarks.common import ROOT, median  # (run by path: the repository on the path first)

EXAMPLE = ROOT / "examples" / "elastic_tp_dp.py"
CHURN = ROOT / "benchmarks" / "churn_worker.py"
CASES = ("resume", "grow-death", "two-at-once", "during-growth", "churn")
#: ``churn``: every survivor names the dead rank within this long of the kill (issue 53).
CHURN_BOUND_S = 1.0
POINTS = ("begin", "forward", "backward", "average", "optimizer", "loss", "end")
#: The wall-clock limit of one run (a hang fails it).
LIMIT_S = 150.0


@dataclass
class Run:
    """One run's outcome."""

    case: str
    seed: int
    passed: bool
    why: str
    seconds: float
    kills: str
    reports: int
    shape: dict[str, int] | None
    warnings: int
    detected_s: float | None = None  # ``churn``: the slowest survivor's seconds from the kill to its RankFailure


def plan(case: str, rng: random.Random, out: pathlib.Path) -> tuple[int, list[str], list[str], dict[str, Any]]:
    """The run's workers, launcher flags, script and its flags, and the outside kill (``{"after": line regex,
    "delay": s}``); ``out``: the run's scratch folder."""
    grow = ["--replace-dead", "--max-replacements", "2"]
    if case == "churn":
        outside = {"after": r"^rank \d+ of 8: pid", "delay": rng.uniform(0.5, 8.0), "wait_for": 8}
        return 8, [], [str(CHURN), str(out), "20"], outside
    if case == "resume":
        return (
            6,
            [],
            [str(EXAMPLE), "--steps", "30", "--pause", "0.1"],
            {"after": r"^step 1: loss", "delay": rng.uniform(0, 2.5)},
        )
    if case == "grow-death":
        victim = rng.choice(["0", "1", "2", "3.1"])
        kill = f"3:3:average,{victim}:g{rng.randint(1, 4)}:{rng.choice(POINTS)}"
        return 4, grow, [str(EXAMPLE), "--regrow", "--steps", "60", "--pause", "0.15", "--kill", kill], {}
    if case == "two-at-once":
        first, second = rng.sample(range(6), 2)
        step, point = rng.randint(2, 6), rng.choice(POINTS)
        kill = f"{first}:{step}:{point},{second}:{step}:{point}"
        return 6, grow, [str(EXAMPLE), "--regrow", "--steps", "60", "--pause", "0.15", "--kill", kill], {}
    if case == "during-growth":  # (tp 2 x dp 3: after the first death a complete replica is left whoever dies next)
        outside = {"after": r"^rank 5 arrives to join", "delay": rng.uniform(0, 1.5), "among": [0, 1, 2, 3, 4]}
        return 6, grow, [str(EXAMPLE), "--regrow", "--steps", "60", "--pause", "0.15", "--kill", "5:3:average"], outside
    raise ValueError(f"--cases: unknown case {case!r}; expected some of {', '.join(CASES)}")


def one_run(case: str, seed: int, logs: pathlib.Path | None = None) -> Run:
    """Run ``case`` once with ``seed``; its outcome. ``logs``: where a failed run's output and reports are kept."""
    rng = random.Random(seed)
    with tempfile.TemporaryDirectory(prefix="hypergrid-chaos-") as scratch:
        out = pathlib.Path(scratch)
        workers, flags, script, outside = plan(case, rng, out)
        report = out / "report.jsonl"
        env = {key: value for key, value in os.environ.items() if key not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
        env["HYPERGRID_STACK_DIR"] = str(out / "stacks")  # a hung run's workers dump their stacks there
        (out / "stacks").mkdir()
        reporting = [] if case == "churn" else ["--report", str(report)]
        command = [sys.executable, "-m", "hypergrid.run", "--standalone", "--nproc-per-node", str(workers), *flags,
                   *script, *reporting]  # fmt: skip
        started = time.monotonic()
        launcher = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                    text=True, start_new_session=True)  # fmt: skip
        lines: list[str] = []
        killed = threading.Thread(target=_read, args=(launcher, lines, outside, rng), daemon=True)
        killed.start()
        try:
            code: int | None = launcher.wait(LIMIT_S)
        except subprocess.TimeoutExpired:
            code = None
            _kill_all(launcher.pid, out / "stacks")
        killed.join(10)
        seconds = time.monotonic() - started
        reports = [json.loads(line) for line in report.read_text().splitlines()] if report.exists() else []
        churned = {int(path.stem[4:]): json.loads(path.read_text()) for path in out.glob("rank*.json")}
        stacks = "".join(
            f"\n--- {path.name}\n{path.read_text()}"
            for path in sorted(out.glob("stacks/*.stack"))
            if path.stat().st_size
        )
    output = "".join(lines) + stacks
    kills = " ".join(script[script.index("--kill") + 1 :][:1]) if "--kill" in script else ""
    kills += "".join(f" outside:{line.strip()}" for line in lines if line.startswith("chaos: killed"))
    why = _judge_churn(code, output, churned) if case == "churn" else _judge(code, output, reports)
    if why and logs is not None:
        logs.mkdir(parents=True, exist_ok=True)
        kept = {"why": why, "reports": reports, "churned": churned}
        (logs / f"{case}-{seed}.log").write_text(output + "\n" + json.dumps(kept, indent=1))
    final = [each for each in reports if "rank" in each]
    shape = final[0]["shape"] if final else None
    warnings = output.count("[W")
    run = Run(case, seed, not why, why, round(seconds, 1), kills.strip(), len(final), shape, warnings)
    killed = re.search(r"chaos: killed rank \d+ \(pid \d+\) at ([\d.]+)", output)
    if case == "churn" and killed and churned and all("at" in seen for seen in churned.values()):
        run.detected_s = round(max(float(seen["at"]) for seen in churned.values()) - float(killed.group(1)), 3)
    return run


def _read(launcher: subprocess.Popen[str], lines: list[str], outside: dict[str, Any], rng: random.Random) -> None:
    """Collect the launcher's output; where the case kills from outside, do it after its line and delay."""
    pids: dict[int, int] = {}
    armed: float | None = None
    assert launcher.stdout is not None
    for line in launcher.stdout:
        lines.append(line)
        for match in re.finditer(r"rank (\d+) of \d+: pid (\d+)", line):  # (two workers' lines may share one)
            pids[int(match.group(1))] = int(match.group(2))
        if outside and armed is None and re.match(outside["after"], line) and len(pids) >= outside.get("wait_for", 0):
            armed = outside["delay"]
            victim = rng.choice(outside.get("among", sorted(pids)))
            timer = threading.Timer(armed, _kill_one, (pids.get(victim), victim, lines))
            timer.daemon = True
            timer.start()


def _kill_one(pid: int | None, rank: int, lines: list[str]) -> None:
    if pid is None:
        return
    try:
        os.kill(pid, signal.SIGKILL)
        lines.append(f"chaos: killed rank {rank} (pid {pid}) at {time.time()!r}\n")
    except ProcessLookupError:
        lines.append(f"chaos: rank {rank} (pid {pid}) was gone already\n")


def _kill_all(pid: int, stacks: pathlib.Path) -> None:
    """SIGKILL the launcher's process group and every worker below it (each worker has a session of its own), after
    the workers dumped their Python stacks into ``stacks`` (``SIGUSR1``: `hypergrid.launch.stacks`)."""
    found = [pid]
    for parent in list(found):
        for task in pathlib.Path(f"/proc/{parent}/task").glob("*"):
            try:
                found += [int(child) for child in (task / "children").read_text().split()]
            except OSError:
                continue
    for each in found[1:]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(each, signal.SIGUSR1)
    time.sleep(2.0 if len(found) > 1 else 0.0)  # (faulthandler writes from its signal handler at once)
    for each in reversed(found):
        with contextlib.suppress(ProcessLookupError):
            os.kill(each, signal.SIGKILL)


def _judge(code: int | None, output: str, reports: list[dict[str, Any]]) -> str:
    """Why the run failed ("" where it passed)."""
    if code is None:
        return f"hung: the launcher did not exit within {LIMIT_S:g} s"
    summary = next((line for line in output.splitlines() if "summary: " in line), "")
    if code != 0:
        return f"exit {code}: {summary[summary.find('summary: ') :][:200] or 'no summary'}"
    if "summary: succeeded" not in summary:
        return f"exit 0 without a success summary: {summary[:200]!r}"
    final = [each for each in reports if "rank" in each]
    if not final:
        return "no rank reported a result"
    if len({each["step"] for each in final}) != 1:
        return f"ranks ended at different steps: {sorted(each['step'] for each in final)}"
    for tp in {each["tp"] for each in final}:
        if len({each["weights_sha256"] for each in final if each["tp"] == tp}) != 1:
            return f"the dp replicas of tp shard {tp} differ"
    worst = max(each["max_abs_vs_one_process"] for each in final)
    if worst > 1e-9:
        return f"a shard is {worst:.1e} from the same training in one process"
    if sorted(each["rank"] for each in final) != list(range(len(final))):
        return f"the final ranks are not 0..{len(final) - 1}: {sorted(each['rank'] for each in final)}"
    if "frame #" in output:
        return f"{output.count('frame #')} C++ 'frame #' lines in the output"
    return ""


def _judge_churn(code: int | None, output: str, reports: dict[int, dict[str, Any]]) -> str:
    """Why a ``churn`` run failed ("" where it passed): every survivor names exactly the dead rank within the bound,
    none is fenced, each wrote its result, the launcher exits 0."""
    killed = re.search(r"chaos: killed rank (\d+) \(pid \d+\) at ([\d.]+)", output)
    if code is None:
        return f"hung: the launcher did not exit within {LIMIT_S:g} s"
    if killed is None:
        return "nobody was killed (the loop ended first?)"
    victim, at = int(killed.group(1)), float(killed.group(2))
    missing = sorted(set(range(8)) - {victim} - set(reports))
    if missing:
        return f"survivors {missing} wrote no result"
    for rank, seen in sorted(reports.items()):
        if seen.get("raised") != "RankFailure" or seen.get("dead") != [victim]:
            said = str(seen.get("said", ""))[:160]
            return f"rank {rank} saw {seen.get('raised')} {seen.get('dead')} ({said}), not [{victim}]"
        if float(seen["at"]) - at > CHURN_BOUND_S:
            return f"rank {rank} knew {float(seen['at']) - at:.2f} s after the kill (bound {CHURN_BOUND_S:g} s)"
        if "shrink_raised" in seen or (not seen.get("retired") and seen.get("sum") != 6.0):
            said = str(seen.get("shrink_said", ""))[:160]
            return f"rank {rank}'s shrink: {seen.get('shrink_raised')} {said}; sum {seen.get('sum')}"
    if code != 0:
        summary = next((line for line in output.splitlines() if "summary: " in line), "")
        return f"exit {code}: {summary[summary.find('summary: ') :][:200]}"
    slowest = max(float(seen["at"]) - at for seen in reports.values())
    return "" if slowest >= 0 else f"a survivor raised before the kill ({slowest:.2f} s)"


def main() -> int:
    parse = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parse.add_argument("--cases", default=",".join(CASES))
    parse.add_argument("--runs", type=int, default=30)
    parse.add_argument("--seed", type=int, default=1, help="the first run's seed; run k uses seed + k")
    parse.add_argument("--json", default="")
    parse.add_argument("--logs", default="", help="a folder for each failed run's output (<case>-<seed>.log)")
    args = parse.parse_args()
    cases = [case for case in args.cases.split(",") if case]
    unknown = [case for case in cases if case not in CASES]
    if unknown or not cases:
        parse.error(f"--cases {args.cases}: expected some of {', '.join(CASES)}")
    if args.runs < 1:
        parse.error(f"--runs {args.runs}: expected an int >= 1")
    runs: list[Run] = []
    for case in cases:
        for k in range(args.runs):
            run = one_run(case, args.seed + k, pathlib.Path(args.logs) if args.logs else None)
            runs.append(run)
            mark, why = ("ok  ", "") if run.passed else ("FAIL", f"; {run.why}")
            known = "" if run.detected_s is None else f"; known in {run.detected_s} s"
            print(f"{mark} {case} seed {run.seed}: {run.seconds:5.1f} s, {run.reports} reports, shape {run.shape}, "
                  f"[W lines {run.warnings}; kills {run.kills}{known}{why}", flush=True)  # fmt: skip
    print()
    for case in cases:
        mine = [run for run in runs if run.case == case]
        passed, taken = sum(run.passed for run in mine), median([run.seconds for run in mine])
        times = [run.detected_s for run in mine if run.detected_s is not None]
        known = (
            f"; the slowest survivor knew in {median(times):.2f} s (median), {max(times):.2f} s at most"
            if times
            else ""
        )
        print(f"{case}: {passed} of {len(mine)} passed; median {taken:.1f} s a run{known}")
    failures = [run for run in runs if not run.passed]
    for run in failures:
        print(f"FAILED {run.case} --seed {run.seed}: {run.why}")
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps([asdict(run) for run in runs], indent=1))
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
