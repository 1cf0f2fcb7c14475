"""Group-creation cost against world size, per strategy (and guard on/off, create_pg or create_pgs).

    python benchmarks/creation.py --world 4,8,16 --strategies enumerate,local [--guard on,off]
        [--api create_pg,create_pgs] [--repeats 3] [--json PATH]
    python benchmarks/creation.py --fake --world 1024,16384,65536 --strategies enumerate,local [--json PATH]

With gloo processes (the default): for each world size, a grid of 2 x 2 x ... over
it (at most 4 dims; the last takes the rest), every family created once in a
fresh job (new processes), ``--repeats`` jobs per variant: what a job pays at
start-up. (Repeating inside one job would measure something else: groups kept
alive slow every later creation on a small host, and after a destroy torch
reuses members-only group names.) Reported per strategy: the time to
create all families on the slowest rank and the median rank (median over
repeats), and the new_group calls and groups held per rank. ``--api``:
``create_pg`` creates the families one by one (one guard round each),
``create_pgs`` all of them in one call (one guard round); ``--guard on,off``
measures both in the same run, and the table ends with the guard's overhead.

With ``--fake``: torch's fake backend in one process, a ``[8, 8, 16, world/1024]``
grid, all 15 families created on a sample of ranks, one group per family
(``share_groups=False``, as dp = 1 at 1024 ranks): new_group calls per rank per
family, and time per rank.

With ``--first``: a job's first creation, side by side with torch's own. For
each world size, ``--repeats`` fresh jobs of each kind, taking turns: torch's
``new_subgroups_by_enumeration`` of the ``tp`` family; hypergrid's first
``create_pg("tp")`` (its world object and watcher, the guard round, the
groups, the commit); and one guard round alone (torch's creation replaced by
nothing). Reported: the worst rank of the worst job of each, and
``hypergrid / (2 x torch + guard)`` (issue 30 asks for at most 1).

With ``--sharing``: communicator economy, sharing on and off, on a grid with
tp = cp = 1 (``[1, 1, 2, world/2]`` under gloo, ``[1, 1, 16, world/16]`` with
``--fake``): distinct groups per rank, new_group calls per rank, seconds.
"""

from __future__ import annotations

import argparse
import math
import pathlib
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

from benchmarks.common import median, write_json
from hypergrid import HyperCommGrid, spawn

NAMES = ["tp", "cp", "ep", "dp"]


def grid_shape(world: int) -> list[int]:
    """2 x 2 x ... over ``world`` (a power of two), at most 4 dims, the last taking the rest.

    Examples:
        >>> grid_shape(4), grid_shape(16), grid_shape(64)
        ([2, 2], [2, 2, 2, 2], [2, 2, 2, 8])
    """
    if world < 2 or world & (world - 1):
        raise ValueError(f"world sizes must be powers of two >= 2, got {world}")
    dims = min(int(math.log2(world)), len(NAMES))
    return [2] * (dims - 1) + [world // 2 ** (dims - 1)]


def fake_shape(world: int) -> list[int]:
    """``[8, 8, 16, world // 1024]`` for the fake backend.

    Examples:
        >>> fake_shape(65536)
        [8, 8, 16, 64]
    """
    if world < 1024 or world % 1024:
        raise ValueError(f"--fake world sizes must be multiples of 1024, got {world}")
    return [8, 8, 16, world // 1024]


@contextmanager
def counting_new_group() -> Iterator[list[int]]:
    """Count the new_group calls torch makes (enumerate calls it per group, local once)."""
    calls: list[int] = []
    real = c10d._new_group_with_tag

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return real(*args, **kwargs)

    c10d._new_group_with_tag = counted
    try:
        yield calls
    finally:
        c10d._new_group_with_tag = real


def create_all(grid: HyperCommGrid, api: str = "create_pg") -> tuple[float, int, int]:
    """Create every family of ``grid`` one by one or in one create_pgs: (seconds, new_group calls, groups held)."""
    families = grid.layout.all_families()
    with counting_new_group() as calls:
        start = time.perf_counter()
        if api == "create_pgs":
            held = sum(group is not None for group in grid.create_pgs(families).values())
        else:
            held = sum(grid.create_pg(family) is not None for family in families)
        seconds = time.perf_counter() - start
    return seconds, len(calls), held


def gloo_rank(world: int, strategy: str, guard: bool, api: str = "create_pg") -> dict[str, Any]:
    """On every rank of a fresh world: create every family once; every rank's time, calls and groups."""
    shape = grid_shape(world)
    grid = HyperCommGrid(shape, NAMES[: len(shape)], strategy=strategy, guard=guard)
    dist.barrier()
    seconds, calls, held = create_all(grid, api)
    everyone: list[Any] = [None] * world
    dist.all_gather_object(everyone, seconds)
    grid.destroy()
    return {"times": everyone, "calls": calls, "held": held}


def first_rank(kind: str) -> float:
    """A fresh job's first creation of the ``tp`` family on this rank: torch's own, hypergrid's, or a guard round."""
    world = dist.get_world_size()
    grid = HyperCommGrid([2, world // 2], ["tp", "dp"])
    if kind == "guard":
        import hypergrid.grid.batch

        hypergrid.grid.batch.create_family = lambda *args, **kwargs: None  # type: ignore[assignment]
    dist.barrier()
    start = time.perf_counter()
    if kind == "torch":
        dist.new_subgroups_by_enumeration(grid.get_rank_enum("tp"))
    else:
        grid.create_pg("tp")
    seconds = time.perf_counter() - start
    everyone: list[Any] = [None] * world
    dist.all_gather_object(everyone, seconds)
    return float(max(everyone))


def first_rows(world: int, repeats: int, timeout_s: float) -> list[dict[str, Any]]:
    """``--first``: the worst rank of the worst of ``repeats`` fresh jobs, for each kind, taking turns."""
    worst = {kind: 0.0 for kind in ("torch", "hypergrid", "guard")}
    for _ in range(repeats):
        for kind in worst:
            worst[kind] = max(worst[kind], spawn(first_rank, world, (kind,), timeout_s=timeout_s)[0])
    budget = 2 * worst["torch"] + worst["guard"]
    return [{"mode": "first", "world": world, "repeats": repeats, **{f"{k}_ms": v * 1e3 for k, v in worst.items()},
             "ratio_to_budget": worst["hypergrid"] / budget}]  # fmt: skip


def print_first_table(rows: list[dict[str, Any]]) -> None:
    print("world  torch first(ms)  guard round(ms)  hypergrid first(ms)  hypergrid / (2 x torch + guard)")
    for row in rows:
        print(f"{row['world']:>5}  {row['torch_ms']:>15.1f}  {row['guard_ms']:>15.1f}  {row['hypergrid_ms']:>19.1f}"
              f"  {row['ratio_to_budget']:>30.2f}")  # fmt: skip


def gloo_rows(
    world: int, strategies: list[str], guards: list[bool], repeats: int, timeout_s: float, apis: list[str]
) -> list[dict[str, Any]]:
    """Each sample is the first creation in a fresh job (fresh processes), as at a job's start.

    The variants take turns repeat by repeat, so that a slow spell of the host
    spreads over all of them rather than hitting one.
    """
    shape = grid_shape(world)
    variants = [(api, guard, strategy) for api in apis for guard in guards for strategy in strategies]
    samples: dict[tuple[str, bool, str], list[dict[str, Any]]] = {variant: [] for variant in variants}
    for _ in range(repeats):
        for api, guard, strategy in variants:
            sample = spawn(gloo_rank, world, (world, strategy, guard, api), timeout_s=timeout_s)[0]
            samples[api, guard, strategy].append(sample)
    rows = []
    for (api, guard, strategy), done in samples.items():
        rows.append(
            {
                "mode": "gloo",
                "world": world,
                "shape": shape,
                "strategy": strategy,
                "api": api,
                "guard": guard,
                "families": 2 ** len(shape) - 1,
                "time_s_max": median([max(sample["times"]) for sample in done]),
                "time_s_median": median([median(sample["times"]) for sample in done]),
                "new_group_calls_per_rank": done[0]["calls"],
                "groups_per_rank": done[0]["held"],
                "repeats": repeats,
            }
        )
    return rows


def fake_rows(world: int, strategies: list[str], samples: int) -> list[dict[str, Any]]:
    from torch.testing._internal.distributed.fake_pg import FakeStore

    shape = fake_shape(world)
    rows = []
    for strategy in strategies:
        times, calls = [], []
        for rank in sorted({0, world // 3, world - 1, *range(1, samples - 2)})[:samples]:
            dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world)
            try:
                grid = HyperCommGrid(shape, NAMES, strategy=strategy, share_groups=False)  # one group per family
                seconds, count, _ = create_all(grid)
                grid.destroy()
            finally:
                dist.destroy_process_group()
            times.append(seconds)
            calls.append(count)
        families = 2 ** len(shape) - 1
        rows.append(
            {
                "mode": "fake",
                "world": world,
                "shape": shape,
                "strategy": strategy,
                "api": "create_pg",
                "guard": False,
                "families": families,
                "time_s_max": max(times),
                "time_s_median": median(times),
                "new_group_calls_per_rank": max(calls),
                "new_group_calls_per_family": max(calls) / families,
                "samples": len(times),
            }
        )
    return rows


def sharing_shape(world: int, fake: bool) -> list[int]:
    """A grid with tp = cp = 1 over ``world``: ``[1, 1, ep, dp]``.

    Examples:
        >>> sharing_shape(8, False), sharing_shape(65536, True)
        ([1, 1, 2, 4], [1, 1, 16, 4096])
    """
    ep = 16 if fake else 2
    if world % ep or world < 2 * ep:
        raise ValueError(f"--sharing needs a world that is a multiple of {2 * ep}, got {world}")
    return [1, 1, ep, world // ep]


def sharing_rank(shape: list[int], strategy: str, share: bool) -> dict[str, Any]:
    """Create every family of a tp = cp = 1 grid once; time, new_group calls, distinct groups held."""
    grid = HyperCommGrid(shape, NAMES, strategy=strategy, share_groups=share)
    if dist.get_backend() != "fake":
        dist.barrier()
    seconds, calls, _ = create_all(grid)
    distinct = len(grid.communicators())
    grid.destroy()
    if dist.get_backend() == "fake":
        return {"times": [seconds], "calls": calls, "distinct": distinct}
    everyone: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, seconds)
    return {"times": everyone, "calls": calls, "distinct": distinct}


def sharing_rows(world: int, strategies: list[str], fake: bool, repeats: int, timeout_s: float) -> list[dict[str, Any]]:
    """Sharing on and off for each strategy: fresh jobs under gloo, sampled ranks with the fake backend."""
    from torch.testing._internal.distributed.fake_pg import FakeStore

    shape = sharing_shape(world, fake)
    rows = []
    for strategy in strategies:
        for share in (False, True):
            if fake:
                samples = []
                for rank in (0, world - 1):
                    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world)
                    try:
                        samples.append(sharing_rank(shape, strategy, share))
                    finally:
                        dist.destroy_process_group()
            else:
                samples = [
                    spawn(sharing_rank, world, (shape, strategy, share), timeout_s=timeout_s)[0] for _ in range(repeats)
                ]
            rows.append(
                {
                    "mode": "fake" if fake else "gloo",
                    "world": world,
                    "shape": shape,
                    "strategy": strategy,
                    "share_groups": share,
                    "families": 2 ** len(shape) - 1,
                    "distinct_groups_per_rank": samples[0]["distinct"],
                    "new_group_calls_per_rank": max(sample["calls"] for sample in samples),
                    "time_s_max": median([max(sample["times"]) for sample in samples]),
                    "samples": len(samples),
                }
            )
    return rows


def print_sharing_table(rows: list[dict[str, Any]]) -> None:
    print(
        f"{'mode':<5} {'world':>6} {'shape':<18} {'strategy':<10} {'sharing':<7} {'groups/rank':>11} "
        f"{'new_group/rank':>14} {'max rank(s)':>11}"
    )
    for row in rows:
        print(
            f"{row['mode']:<5} {row['world']:>6} {row['shape']!s:<18} {row['strategy']:<10} "
            f"{'on' if row['share_groups'] else 'off':<7} {row['distinct_groups_per_rank']:>11} "
            f"{row['new_group_calls_per_rank']:>14} {row['time_s_max']:>11.4f}"
        )


def print_table(rows: list[dict[str, Any]]) -> None:
    print(
        f"{'mode':<5} {'world':>6} {'shape':<16} {'strategy':<10} {'api':<10} {'guard':<5} {'families':>8} "
        f"{'max rank(s)':>11} {'median(s)':>9} {'new_group/rank':>14}"
    )
    for row in rows:
        print(
            f"{row['mode']:<5} {row['world']:>6} {row['shape']!s:<16} {row['strategy']:<10} {row['api']:<10} "
            f"{'on' if row['guard'] else 'off':<5} {row['families']:>8} {row['time_s_max']:>11.4f} "
            f"{row['time_s_median']:>9.4f} {row['new_group_calls_per_rank']:>14}"
        )
    by_world: dict[tuple[str, int, str, bool], dict[str, float]] = {}
    by_guard: dict[tuple[int, str, str], dict[bool, float]] = {}
    for row in rows:
        by_world.setdefault((row["mode"], row["world"], row["api"], row["guard"]), {})[row["strategy"]] = row[
            "time_s_max"
        ]
        by_guard.setdefault((row["world"], row["strategy"], row["api"]), {})[row["guard"]] = row["time_s_max"]
    lines = [
        f"{mode} world {world} {api} guard {'on' if guard else 'off'}: enumerate / local = "
        f"{t['enumerate'] / t['local']:.2f}"
        for (mode, world, api, guard), t in by_world.items()
        if "enumerate" in t and "local" in t
    ]
    if lines:
        print("\n# slowest-rank time ratio, enumerate over local")
        print("\n".join(lines))
    overheads = [
        f"world {world} {strategy} {api}: guard on / off = {t[True] / t[False]:.2f}"
        for (world, strategy, api), t in by_guard.items()
        if True in t and False in t
    ]
    if overheads:
        print("\n# slowest-rank time ratio, guard on over guard off")
        print("\n".join(overheads))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world", default="4,8,16", help="comma-separated world sizes (default 4,8,16)")
    parser.add_argument("--strategies", default="enumerate,local", help="comma-separated (default enumerate,local)")
    parser.add_argument("--guard", default="on", help="on, off or on,off (gloo mode; default on)")
    parser.add_argument(
        "--api", default="create_pg,create_pgs", help="create_pg (one family per call), create_pgs (one call) or both"
    )
    parser.add_argument("--repeats", type=int, default=3, help="fresh jobs per variant in gloo mode (default 3)")
    parser.add_argument("--fake", action="store_true", help="torch's fake backend, one process")
    parser.add_argument("--samples", type=int, default=4, help="ranks sampled in fake mode (default 4)")
    parser.add_argument("--timeout", type=float, default=1800.0, help="hard limit per world in seconds")
    parser.add_argument("--json", type=pathlib.Path)
    parser.add_argument("--sharing", action="store_true", help="sharing on and off on a tp = cp = 1 grid")
    parser.add_argument("--first", action="store_true", help="a job's first creation against torch's own")
    args = parser.parse_args(argv)
    try:
        worlds = [int(w) for w in args.world.split(",")]
        strategies = [s.strip() for s in args.strategies.split(",")]
        guards = [{"on": True, "off": False}[g.strip()] for g in args.guard.split(",")]
        apis = [{"create_pg": "create_pg", "create_pgs": "create_pgs"}[a.strip()] for a in args.api.split(",")]
        for world in worlds:
            if args.sharing:
                sharing_shape(world, args.fake)
            else:
                (fake_shape if args.fake else grid_shape)(world)
    except (ValueError, KeyError) as error:
        parser.error(f"bad --world, --strategies, --guard or --api: {error}")
    if bad := [s for s in strategies if s not in ("enumerate", "local")]:
        parser.error(f"--strategies: {bad} not measurable here; choose from enumerate, local")
    rows: list[dict[str, Any]] = []
    for world in worlds:
        print(f"# world {world} ...", file=sys.stderr, flush=True)
        if args.first:
            rows += first_rows(world, args.repeats, args.timeout)
        elif args.sharing:
            rows += sharing_rows(world, strategies, args.fake, args.repeats, args.timeout)
        elif args.fake:
            rows += fake_rows(world, strategies, args.samples)
        else:
            rows += gloo_rows(world, strategies, guards, args.repeats, args.timeout, apis)
    (print_first_table if args.first else print_sharing_table if args.sharing else print_table)(rows)
    if args.json:
        write_json(args.json, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
