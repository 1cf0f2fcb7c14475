"""``make gpu-check``: the NCCL paths on every GPU of this machine, in one run of at most about 8 minutes.

    python benchmarks/gpu_check.py [--limit 480] [--json PATH]
    python benchmarks/gpu_check.py --dry-run [--gpus N]     # the plan only, for N GPUs (default: those found)

One process per GPU. The steps (`plan_steps` says which run and why the others do not):

- ``ops``: ``torchrun --standalone`` over every GPU, ``env://``, each rank on
  the GPU of its ``LOCAL_RANK`` with ``init_process_group("nccl", device_id=...)``
  (`hypergrid.init_from_env`): NCCL grid creation with each strategy
  (``enumerate``, ``local``, ``split``), every grid operation on CUDA tensors
  (blocking and ``async_op``, checked collectives, ``average_gradients``,
  ``exchange``), the bridge between two grids and the autograd mappings
  (benchmarks/gpu_workers.py).
- ``death`` (2 GPUs or more): under ``python -m hypergrid.run`` (its agent
  announces the death), the last rank is SIGKILLed in an NCCL all-reduce, then
  where the others wait in a ``create_pg`` for it, then (3 GPUs or more) while a
  shrink forms its world; each survivor must get ``RankFailure`` naming it
  (NCCL's communicators aborted), ``shrink`` to the others and all-reduce on
  the new grid, and the seconds from the death are reported
  (benchmarks/detection.py; benchmarks/gpu_death.py is the same death under
  ``hypergrid.spawn``, by hand).
- ``allreduce``: benchmarks/allreduce.py under torchrun: algbw and busbw as
  nccl-tests computes them, hypergrid's groups and plain ``new_group`` ones
  (the raw torch.distributed baseline) side by side in the same run, from 8 bytes
  to 256 MiB.

Each step runs in its own process group of processes under its share of the
hard limit (``--limit``, 480 s): a step past it is killed with its children and
reported, and the next one runs in what is left. With one GPU every step runs on
a world of one (the death is skipped: no peer to lose). Without a GPU (or without
NCCL in this torch) it says so and exits 0. Exit status 1 if a step that ran failed.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import pathlib
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

from benchmarks.gpu_workers import OPS_CHECKS

ROOT = pathlib.Path(__file__).resolve().parent.parent

#: The whole run's hard limit, in seconds (each step gets its share, and what an earlier one left).
LIMIT_S = 480.0


@dataclass(frozen=True)
class Step:
    """One step of the check: what runs, on how many ranks, for how long at most; or why it does not run."""

    name: str
    ranks: int
    argv: tuple[str, ...]
    share: float  # of the hard limit
    skipped: str = ""  # why it does not run ("" when it runs)
    note: str = ""  # what to know when reading its output


def _torchrun(ranks: int, script: str, *args: str) -> tuple[str, ...]:
    return (sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={ranks}", script, *args)


def bench_grid(gpus: int) -> tuple[str, str]:
    """The benchmark's grid: ``tp=2 x dp`` where 4 or more GPUs make both families groups, else ``dp`` over all.

    Examples:
        >>> bench_grid(1), bench_grid(2), bench_grid(8)
        (('1', 'dp'), ('2', 'dp'), ('2,4', 'tp,dp'))
    """
    if gpus >= 4 and gpus % 2 == 0:
        return f"2,{gpus // 2}", "tp,dp"
    return str(gpus), "dp"


def plan_steps(gpus: int) -> list[Step]:
    """What the check runs with ``gpus`` GPUs, and why what it skips is skipped.

    Examples:
        >>> [(s.name, s.ranks, bool(s.skipped)) for s in plan_steps(2)]
        [('ops', 2, False), ('death', 2, False), ('allreduce', 2, False)]
        >>> [s.skipped for s in plan_steps(1)][1]
        'needs 2 GPUs or more: a world of one has no peer to lose'
    """
    workers, death, bench = "benchmarks/gpu_workers.py", "benchmarks/detection.py", "benchmarks/allreduce.py"
    if gpus < 1:
        why = "no CUDA GPU here (or no NCCL in this torch): nothing of NCCL can run"
        return [Step(name, 0, (), 0.0, why) for name in ("ops", "death", "allreduce")]
    shape, dims = bench_grid(gpus)
    bench_args = ("--shape", shape, "--dims", dims, "--backend", "nccl", "--minbytes", "8", "--maxbytes", "256M")
    bench_args += ("--stepfactor", "4", "--iters", "20", "--warmup", "5", "--summary-at", "64M", "--quiet")
    ops_note = f"{len(OPS_CHECKS)} checks: {', '.join(OPS_CHECKS)}"
    if gpus == 1:
        ops_note += " (a world of one rank; 'bridge disjoint' skipped: one rank has no disjoint pair of grids)"
    one = "one rank: busbw is 0 by nccl-tests' factor 2(n-1)/n, algbw is the GPU's own copy" if gpus == 1 else ""
    return [
        Step("ops", gpus, _torchrun(gpus, workers, "ops"), 0.35, note=ops_note),
        Step("death", gpus, (sys.executable, death, "--world", str(gpus), *death_args(gpus)), 0.35)
        if gpus >= 2
        else Step("death", gpus, (), 0.0, "needs 2 GPUs or more: a world of one has no peer to lose"),
        Step("allreduce", gpus, _torchrun(gpus, bench, *bench_args), 0.30, note=one),
    ]


def death_args(gpus: int) -> tuple[str, ...]:
    """The death step's places: the shrink's needs a survivor after two deaths (3 GPUs or more); the agent's, two
    "nodes" of half the GPUs each (an even number, 4 or more).

    Examples:
        >>> death_args(2), death_args(8)[1]
        (('--places', 'step,create', '--repeats', '1', '--backend', 'nccl'), 'step,create,shrink,agent')
    """
    places = "step,create" + (",shrink" if gpus >= 3 else "") + (",agent" if gpus >= 4 and gpus % 2 == 0 else "")
    return ("--places", places, "--repeats", "1", "--backend", "nccl")


def count_gpus() -> tuple[int, str]:
    """GPUs NCCL can use here, and the card's name (0 and why, when none)."""
    import torch
    import torch.distributed as dist

    if not torch.cuda.is_available():
        return 0, "torch.cuda.is_available() is False"
    if not dist.is_nccl_available():
        return 0, "this torch has CUDA but no NCCL (torch.distributed.is_nccl_available() is False)"
    count = torch.cuda.device_count()
    return (
        count,
        f"{count} x {torch.cuda.get_device_name(0)}, torch {torch.__version__}, NCCL {torch.cuda.nccl.version()}",
    )


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (children first), from /proc: none where there is no /proc."""
    parents: dict[int, list[int]] = {}
    for stat in pathlib.Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            parents.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, queue = [], [pid]
    while queue:
        children = parents.get(queue.pop(), [])
        found += children
        queue += children
    return found


def run_step(step: Step, limit_s: float) -> dict[str, object]:
    """Run one step in a new session, killed with its children past ``limit_s``; its outcome."""
    print(f"\n## {step.name} on {step.ranks} GPU(s), at most {limit_s:.0f} s: {' '.join(step.argv)}", flush=True)
    started = time.monotonic()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    process = subprocess.Popen(step.argv, cwd=ROOT, env=env, start_new_session=True)
    try:
        code = process.wait(timeout=limit_s)
        status = "passed" if code == 0 else f"failed (exit status {code})"
    except subprocess.TimeoutExpired:
        for pid in [*descendants(process.pid), process.pid]:  # torchrun starts each worker in a session of its own
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        process.wait()
        status = f"killed past its {limit_s:.0f} s"
    return {"step": step.name, "ranks": step.ranks, "status": status, "seconds": round(time.monotonic() - started, 1)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true", help="print the plan and run nothing")
    parser.add_argument("--gpus", type=int, help="plan for this many GPUs (with --dry-run; default: those found)")
    parser.add_argument("--limit", type=float, default=LIMIT_S, help=f"hard limit in seconds (default {LIMIT_S:g})")
    parser.add_argument("--json", type=pathlib.Path, help="write the plan and the outcomes here")
    args = parser.parse_args(argv)
    if args.gpus is not None and (not args.dry_run or args.gpus < 0):
        parser.error(f"--gpus plans for another machine: only with --dry-run, and >= 0; got {args.gpus}")
    gpus, found = (args.gpus, f"{args.gpus} GPU(s), as asked") if args.gpus is not None else count_gpus()
    steps = plan_steps(gpus)
    print(f"# gpu-check: {found}; hard limit {args.limit:g} s")
    for step in steps:
        said = f"skipped: {step.skipped}" if step.skipped else f"runs on {step.ranks} rank(s), {step.share:.0%} of it"
        print(f"{step.name:<10} {said}{'; ' + step.note if step.note else ''}")
        if not step.skipped:
            print(f"           $ {' '.join(step.argv)}")
    outcomes: list[dict[str, object]] = []
    if not args.dry_run and gpus > 0:
        deadline = time.monotonic() + args.limit
        for index, step in enumerate(steps):
            if step.skipped:
                continue
            left = deadline - time.monotonic()
            later = sum(s.share for s in steps[index + 1 :] if not s.skipped)
            outcomes.append(run_step(step, max(1.0, left * step.share / (step.share + later))))
        print("\n# gpu-check summary")
        for outcome in outcomes:
            print(f"{outcome['step']:<10} {outcome['status']} in {outcome['seconds']} s on {outcome['ranks']} GPU(s)")
    elif gpus == 0:
        print("# nothing ran: this check needs a CUDA GPU and a torch built with NCCL; exit status 0")
    if args.json:
        args.json.write_text(json.dumps({"found": found, "plan": [asdict(s) for s in steps], "outcomes": outcomes}))
    return 1 if any(o["status"] != "passed" for o in outcomes) else 0


if __name__ == "__main__":
    sys.exit(main())
