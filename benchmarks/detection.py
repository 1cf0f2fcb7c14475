"""How long a worker's death takes to reach every survivor under ``python -m hypergrid.run`` (issue 46).

    python benchmarks/detection.py [--world 8,16] [--places create,step,shrink,agent] [--repeats 3] [--without-agent]
                                   [--backend gloo|nccl] [--json FILE]

Runs `tests/workers/detected.py` under the launcher: ``N`` gloo workers on one host with production timeouts
(groups 600 s, guard 300 s, ``HYPERGRID_PROBE_S`` 30 s); the last rank SIGKILLs itself while the others are in a
``create_pg`` waiting for it (``create``: no operation of theirs fails), in a step's all-reduce (``step``: gloo's
closed connection shows it) or while the survivors of an earlier death form their shrink's world (``shrink``: they
wait inside torch's ``init_process_group``; the shrink absorbs it), or, ``agent``, two nodes of ``N / 2`` workers
(a static rendezvous on this host) where node 1's agent is SIGKILLed and its workers die with it, while node 0's
wait in a ``create_pg`` (the agents' ring finds it, `hypergrid.launch.ring`). Per run: the seconds from the death
to each survivor's ``RankFailure`` (``shrink``: to its shrink's return), the slowest and the median.
``--without-agent``: the same launcher with the agent's announcement off (0.3.0's behaviour: a
guard round waiting for the dead rank learns of it from the probe after ``HYPERGRID_PROBE_S``). ``--backend nccl``:
one worker per GPU (``make gpu-check``'s ``death`` step); a run whose survivors differ from the expected exits 1.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile
from typing import Any

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

from benchmarks.common import free_port, median, progress, write_json

ROOT = pathlib.Path(__file__).resolve().parent.parent
WORKER = ROOT / "tests" / "workers" / "detected.py"
#: The launcher without the agent's announcement (``hypergrid.run`` passes ``announce_death``).
WITHOUT = "import sys, os; from hypergrid.launch.launcher import main; os._exit(main(sys.argv[1:]))"


def one_run(size: int, place: str, agent: bool, backend: str = "gloo") -> dict[str, Any]:
    """One job of ``size`` workers; the seconds from the death to each survivor's ``RankFailure``.

    ``agent``: two nodes of ``size / 2`` workers on this host (a static rendezvous; node 0 hosts the store), node 1's
    agent SIGKILLed by its first worker; its workers die with it.
    """
    with tempfile.TemporaryDirectory() as out:
        env = {key: value for key, value in os.environ.items() if key not in ("RANK", "WORLD_SIZE")}
        env["PYTHONPATH"], env["HYPERGRID_DETECT_BACKEND"] = str(ROOT), backend
        launcher = ["-m", "hypergrid.run"] if agent else ["-c", WITHOUT]
        nodes = 2 if place == "agent" else 1
        script = [str(WORKER), place, out]
        if nodes == 1:
            commands = [[*launcher, "--standalone", "--nproc-per-node", str(size), *script]]
        else:
            port = str(free_port())
            rendezvous = ["--nnodes", "2", "--rdzv-backend", "static", "--master-addr", "127.0.0.1"]
            rendezvous += ["--master-port", port, "--nproc-per-node", str(size // 2), "--exit-barrier-timeout", "20"]
            commands = [[*launcher, *rendezvous, "--node-rank", str(node), *script] for node in range(nodes)]
        procs = [subprocess.Popen([sys.executable, *command], cwd=ROOT, env=env, stderr=subprocess.PIPE)
                 for command in commands]  # fmt: skip
        try:
            errors = [proc.communicate(timeout=300)[1] for proc in procs]
        finally:
            for proc in procs:
                proc.kill()
        if procs[0].returncode != 0:
            raise RuntimeError(f"the launcher exited {procs[0].returncode}: {errors[0].decode()[-2000:]}")
        killed = float((pathlib.Path(out) / "killed").read_text())
        survivors = {"shrink": size - 2, "agent": size // 2}.get(place, size - 1)
        dead = list(range(size // 2, size)) if place == "agent" else [size - 1]
        seen = [json.loads((pathlib.Path(out) / f"rank{rank}.json").read_text()) for rank in range(survivors)]
    if any(each.get("dead") != dead or each.get("sum") != survivors for each in seen):
        raise RuntimeError(f"a survivor did not name ranks {dead} dead, or its new all-reduce is wrong: {seen}")
    delays = sorted(each["at"] - killed for each in seen)
    return {"slowest_s": delays[-1], "median_s": median(delays)}


PLACES = ("create", "step", "shrink", "agent")
#: The fewest workers each place needs: survivors after its deaths (``agent``: two nodes of two).
FEWEST = {"create": 2, "step": 2, "shrink": 3, "agent": 4}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world", default="8,16", help="worker counts, comma-separated")
    parser.add_argument("--places", default=",".join(PLACES), help=f"where the others wait: {', '.join(PLACES)}")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--without-agent", action="store_true", help="the agent announces nothing (the contrast)")
    parser.add_argument("--backend", choices=["gloo", "nccl"], default="gloo", help="nccl: one worker per GPU")
    parser.add_argument("--json", default="", help="write the rows here")
    return parser


def check_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> tuple[list[int], list[str]]:
    """The worker counts and places, or ``parser.error`` (exit 2) naming the bad value and what was expected.

    Examples:
        >>> parser = build_parser()
        >>> check_args(parser, parser.parse_args(["--world", "4,8", "--places", "step,agent"]))
        ([4, 8], ['step', 'agent'])
    """
    places = args.places.split(",")
    for place in places:
        if place not in PLACES:
            parser.error(f"--places: {place!r} is not a place; expected some of {', '.join(PLACES)}")
    try:
        sizes = [int(value) for value in args.world.split(",")]
    except ValueError:
        parser.error(f"--world: {args.world!r}; expected worker counts such as 8,16")
    for size in sizes:
        for place in places:
            if size < FEWEST[place] or (place == "agent" and size % 2):
                parser.error(
                    f"--world {size} for place {place!r}: expected {FEWEST[place]} workers or more (agent: even)"
                )
    if args.repeats < 1:
        parser.error(f"--repeats: {args.repeats}; expected 1 or more")
    return sizes, places


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    sizes, places = check_args(parser, args)
    rows = []
    for size in sizes:
        for place in places:
            try:
                runs = [one_run(size, place, not args.without_agent, args.backend) for _ in range(args.repeats)]
            except (RuntimeError, OSError, subprocess.TimeoutExpired) as error:
                print(f"{size} workers, {place}: {error}", file=sys.stderr)
                return 1
            row = {
                "world": size,
                "place": place,
                "agent": not args.without_agent,
                "backend": args.backend,
                "slowest_s": median([run["slowest_s"] for run in runs]),
                "runs": runs,
            }
            progress(f"# {size:>3} workers, {place:>6}: slowest survivor {row['slowest_s']:.2f} s (median of runs)")
            rows.append(row)
    print(f"{'world':>5} {'place':>6} {'agent':>5} {'slowest(s)':>10}")
    for row in rows:
        print(f"{row['world']:>5} {row['place']:>6} {row['agent']!s:>5} {row['slowest_s']:>10.2f}")
    if args.json:
        write_json(pathlib.Path(args.json), rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
