"""How long growing back takes: from a replacement's process start to its first step at the full shape (issue 47).

    python benchmarks/regrow.py [--world 8,16] [--repeats 3] [--json FILE]

Runs `tests/workers/regrow.py` as a launcher does (``env://``, the store hosted here): ``N`` gloo workers on one
host train tp2 x dp(N/2); the last one SIGKILLs itself in step 3; ``"drop"`` removes its slice (its tp peer is
retired and waits to come back, ``grid.arrive``); the moment the death is seen, a replacement is started (a fresh
interpreter, as ``hypergrid.run --replace-dead`` starts one). Per run, the replacement's phases:

- ``import``: from its process start to torch and hypergrid imported;
- ``wait``: from ``grid.arrive`` to its draft: its wake reaches the others, they end their step, agree on the dead
  (none) and on the arrivals (``agreement``, the survivors' median, is part of it);
- ``reform``: the new world formed with it (torch's rendezvous, every family re-created, the commit);
- ``state``: the agreed step's state copied to it from a replica of its shard (the step agreement included);
- ``first step``: its first step at the full shape;
- ``total``: from its process start to the end of that step.

The contrast, ``restart``: the whole job started again from a checkpoint on the same host (every process started
at once: imports, ``init_process_group``, the grid and its families, the checkpoint loaded, one step): what a
launcher's restart costs before the job trains again, without the steps lost since the checkpoint.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time
from typing import Any

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

from torch.distributed import TCPStore  # type: ignore[attr-defined]

from benchmarks.common import free_port, median, progress, write_json

ROOT = pathlib.Path(__file__).resolve().parent.parent
STEPS = ["--steps", "40", "--pause", "0.1"]
PHASES = ("import", "wait", "agreement", "reform", "state", "first step", "total")


def _env(size: int, port: int) -> dict[str, str]:
    env = {name: value for name, value in os.environ.items() if not name.startswith("HYPERGRID_")}
    env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE=str(size), PYTHONPATH=str(ROOT))
    env["TORCHELASTIC_USE_AGENT_STORE"], env["CUDA_VISIBLE_DEVICES"] = "True", ""  # gloo, on the CPU
    return env


def _start(command: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(command, env={**env, "HYPERGRID_BENCH_T0": repr(time.time())}, cwd=ROOT,
                            stderr=subprocess.DEVNULL)  # fmt: skip


def _wait(processes: list[subprocess.Popen[bytes]], limit_s: float) -> None:
    deadline = time.monotonic() + limit_s
    try:
        for process in processes:
            process.wait(max(0.1, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"a process was still running after {limit_s} s") from None
    finally:
        for process in processes:
            process.kill()


def grow_run(size: int) -> dict[str, float]:
    """One job of ``size`` members, a death, a replacement; the replacement's phases (seconds)."""
    with tempfile.TemporaryDirectory() as out:
        report = pathlib.Path(out) / "report.jsonl"
        store = TCPStore("127.0.0.1", free_port(), is_master=True, wait_for_workers=False)
        env = _env(size, store.port)
        command = [sys.executable, "-m", "tests.workers.regrow", "--report", str(report)]
        members = [_start([*command, "--kill", f"{size - 1}:3:tp", *STEPS], {**env, "RANK": str(rank)})
                   for rank in range(size)]  # fmt: skip
        while members[-1].poll() is None:
            time.sleep(0.01)
        arrival = _start([*command, *STEPS], {**env, "RANK": str(size - 1), "HYPERGRID_ARRIVAL": "1"})
        _wait([*members, arrival], 240)
        reports = [json.loads(line) for line in report.read_text().splitlines()]
    (mine,) = [report for report in reports if report["arrival"]]
    if mine.get("world") != size or any(each.get("world") != size for each in reports):
        raise RuntimeError(f"the grid did not grow back to {size} ranks: {reports}")
    times, phases = mine["timings"], mine["timings"]["seconds"]
    formed = sum(phases.values())
    grown = [each["timings"].get("grow_seconds", {}) for each in reports]
    agreements = [phases["agreement"] for phases in grown if "agreement" in phases]  # (the survivors': they agreed)
    return {
        "import": times["imported"] - times["started"],
        "wait": times["arrived"] - times["arrive"] - formed,
        "agreement": median(agreements),
        "reform": formed - phases.get("step", 0.0),
        "state": phases.get("step", 0.0),
        "first step": times["first_full_step"] - times["arrived"],
        "total": times["first_full_step"] - times["started"],
    }


def restart_run(size: int) -> float:
    """The whole job of ``size`` started again from a checkpoint: seconds until every rank finished a step."""
    from tests.workers.regrow import one_process  # (torch: imported here, not at the benchmark's start)

    with tempfile.TemporaryDirectory() as out:
        checkpoint, report = pathlib.Path(out) / "w.pt", pathlib.Path(out) / "report.jsonl"
        import torch

        torch.save(one_process(20), checkpoint)
        store = TCPStore("127.0.0.1", free_port(), is_master=True, wait_for_workers=False)
        env = _env(size, store.port)
        command = [sys.executable, "-m", "tests.workers.regrow", "--report", str(report), "--steps", "21"]
        command += ["--restart-from", str(checkpoint), "--restart-step", "20"]
        started = time.time()
        _wait([_start(command, {**env, "RANK": str(rank)}) for rank in range(size)], 240)
        reports = [json.loads(line) for line in report.read_text().splitlines()]
    if len(reports) != size or any(each["max_abs_vs_one_process"] > 1e-9 for each in reports):
        raise RuntimeError(f"the restarted job is wrong: {reports}")
    return max(each["timings"]["first_full_step"] for each in reports) - started


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world", default="8,16", help="worker counts (even, 4 or more), comma-separated")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", default="", help="write the rows here")
    return parser


def check_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> list[int]:
    """The worker counts, or ``parser.error`` (exit 2) naming the bad value and what was expected.

    Examples:
        >>> parser = build_parser()
        >>> check_args(parser, parser.parse_args(["--world", "4,8"]))
        [4, 8]
    """
    try:
        sizes = [int(value) for value in args.world.split(",")]
    except ValueError:
        parser.error(f"--world: {args.world!r}; expected worker counts such as 8,16")
    for size in sizes:
        if size < 4 or size % 2:
            parser.error(f"--world {size}: expected an even count of 4 or more (tp2 x dp, one slice dropped)")
    if args.repeats < 1:
        parser.error(f"--repeats: {args.repeats}; expected 1 or more")
    return sizes


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    sizes = check_args(parser, args)
    rows: list[dict[str, Any]] = []
    for size in sizes:
        try:
            runs = [grow_run(size) for _ in range(args.repeats)]
            restarts = [restart_run(size) for _ in range(args.repeats)]
        except (RuntimeError, OSError, ValueError, KeyError) as error:
            print(f"{size} workers: {error}", file=sys.stderr)
            return 1
        row = {"world": size, **{phase: median([run[phase] for run in runs]) for phase in PHASES}}
        row["restart"], row["runs"], row["restarts"] = median(restarts), runs, restarts
        progress(f"# {size:>3} workers: grown back in {row['total']:.2f} s, restart {row['restart']:.2f} s (medians)")
        rows.append(row)
    print(f"{'world':>5} " + " ".join(f"{phase:>10}" for phase in (*PHASES, "restart")))
    for row in rows:
        print(f"{row['world']:>5} " + " ".join(f"{row[phase]:>10.2f}" for phase in (*PHASES, "restart")))
    if args.json:
        write_json(pathlib.Path(args.json), rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
