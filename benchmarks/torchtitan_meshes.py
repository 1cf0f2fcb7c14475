"""torchtitan's meshes at start-up: torchtitan's own ``ParallelDims.build_mesh`` against hypergrid's, side by side.

    python benchmarks/torchtitan_meshes.py [--config dense] [--repeats 5] [--json PATH]

Needs torchtitan 0.3 (``make test-frameworks`` installs it in ``.venv/frameworks``). Each measurement is a
fresh job of 8 gloo processes, the world of ``tests/workers/titan.py``'s configurations (a fresh job, as in
``benchmarks/creation.py``: groups kept alive from an earlier build would slow the next one), the two builders
alternating job by job. In each job every rank times the build
between two barriers and counts the ``new_group`` calls torch made and the process groups it holds after, real
and fake-backend apart. Reported per builder: the median over jobs of the slowest rank's time and of the median
rank's, the groups and calls per rank (the grid's guard is on, its default).

torchtitan's builder runs with the two patches it needs on CPU (``tests/workers/titan.py``).
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import time
from typing import Any

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

from benchmarks.common import median, write_json
from benchmarks.creation import counting_new_group
from hypergrid import spawn

BUILDERS = ("torchtitan", "hypergrid")


def _groups() -> tuple[int, int]:
    """Process groups this rank holds besides the default group: (real, fake-backend)."""
    held = [group for group in c10d._world.pg_map if group is not dist.group.WORLD]
    fake = sum(1 for group in held if dist.get_backend(group) == "fake")
    return len(held) - fake, fake


def build(builder: str, config: str) -> dict[str, Any]:
    """One build on this rank: seconds between barriers, new_group calls, groups held."""
    from tests.workers.titan import CONFIGS, patch_torchtitan_for_cpu

    patch_torchtitan_for_cpu()
    from torchtitan.distributed.parallel_dims import ParallelDims

    from hypergrid.compat.torchtitan import build_mesh

    parallel_dims = ParallelDims(**CONFIGS[config], world_size=dist.get_world_size())
    dist.barrier()
    with counting_new_group() as calls:
        started = time.perf_counter()
        if builder == "torchtitan":
            parallel_dims.build_mesh()
        else:
            build_mesh(parallel_dims, device_type="cpu")
        dist.barrier()
        seconds = time.perf_counter() - started
    real, fake = _groups()
    return {"seconds": seconds, "calls": len(calls), "real_groups": real, "fake_groups": fake}


def measure(world: int, config: str, repeats: int, timeout_s: float) -> list[dict[str, Any]]:
    samples: dict[str, list[list[dict[str, Any]]]] = {builder: [] for builder in BUILDERS}
    for repeat in range(repeats):
        for builder in BUILDERS if repeat % 2 == 0 else BUILDERS[::-1]:
            samples[builder].append(spawn(build, world, (builder, config), timeout_s=timeout_s))
            print(f"# {builder} job {repeat + 1}/{repeats}", file=sys.stderr, flush=True)
    rows = []
    for builder, jobs in samples.items():
        rows.append(
            {
                "builder": builder,
                "world": world,
                "config": config,
                "repeats": repeats,
                "seconds_max_median": median([max(rank["seconds"] for rank in job) for job in jobs]),
                "seconds_median_rank_median": median([median([rank["seconds"] for rank in job]) for job in jobs]),
                "new_group_calls_per_rank": max(rank["calls"] for job in jobs for rank in job),
                "real_groups_per_rank": max(rank["real_groups"] for job in jobs for rank in job),
                "fake_groups_per_rank": max(rank["fake_groups"] for job in jobs for rank in job),
            }
        )
    return rows


def print_table(rows: list[dict[str, Any]]) -> None:
    print(f"{'builder':<11} {'world':>5} {'config':<7} {'max rank s':>10} {'median rank s':>13} "
          f"{'new_group calls':>15} {'real groups':>11} {'fake groups':>11}")  # fmt: skip
    for row in rows:
        print(
            f"{row['builder']:<11} {row['world']:>5} {row['config']:<7} {row['seconds_max_median']:>10.4f} "
            f"{row['seconds_median_rank_median']:>13.4f} {row['new_group_calls_per_rank']:>15} "
            f"{row['real_groups_per_rank']:>11} {row['fake_groups_per_rank']:>11}"
        )
    by = {row["builder"]: row for row in rows}
    ratio = by["hypergrid"]["seconds_max_median"] / by["torchtitan"]["seconds_max_median"]
    print(f"hypergrid / torchtitan (slowest rank, median over jobs): {ratio:.2f}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="dense", help="a configuration of tests/workers/titan.py CONFIGS")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument("--json", type=pathlib.Path)
    args = parser.parse_args(argv)
    try:
        import torchtitan  # noqa: F401
    except ImportError:
        parser.error("needs torchtitan 0.3: run it with .venv/frameworks/bin/python (make test-frameworks installs it)")
    from tests.workers.titan import CONFIGS, WORLD

    if args.config not in CONFIGS:
        parser.error(f"--config must be one of {sorted(CONFIGS)}, got {args.config!r}")
    if args.repeats < 1:
        parser.error(f"--repeats must be at least 1, got {args.repeats}")
    rows = measure(WORLD, args.config, args.repeats, args.timeout)
    print_table(rows)
    if args.json:
        write_json(args.json, rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
