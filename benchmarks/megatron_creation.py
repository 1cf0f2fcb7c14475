"""Building Megatron-Core's ProcessGroupCollection: hypergrid's one call against Megatron-Core's own builders.

    python benchmarks/megatron_creation.py [--world 4,8] [--repeats 12] [--fresh] [--json PATH]

Needs megatron-core 0.19 (CPython 3.12): ``make bench-megatron`` runs it in the
environment ``.ci/megatron-env`` builds.

For each world size and each variant, one job of gloo processes builds the
collection for tp 2, pp 2, ep 2, etp 1 (dp fills the world) once untimed,
then ``--repeats`` times, each build destroyed before the next (no build pays
for groups an earlier one keeps alive):

- ``hypergrid``: ``process_groups(tp=2, pp=2, ep=2, etp=1)`` (guard on; the
  expert families are the grid's here, so one guarded ``create_pgs`` batch);
- ``hypergrid guard off``: the same with ``guard=False``;
- ``megatron initialize_model_parallel``: ``initialize_model_parallel(2, 2,
  expert_model_parallel_size=2, expert_tensor_parallel_size=1,
  create_gloo_process_groups=False)`` then ``use_mpu_process_groups()``;
- ``megatron grid builder``: ``megatron.core.inference.shards.build_inference_pg_collection``,
  Megatron's own collection from two of its ``HyperCommGrid`` (15 of the 27 fields).

Every build starts after a barrier; its time is the slowest rank's. The four
jobs of a world size run one after the other in one run. With ``--fresh``,
each sample is instead the first build of a fresh job (as at a job's start),
``--repeats`` jobs per variant, the variants taking turns. One job per variant,
not the variants taking turns in one job: on this box any creation right
after a Megatron-Core build and its destroy took 0.1-0.2 s longer (raw
``new_subgroups_by_enumeration`` calls too, whatever came between: a
throwaway group, a sleep, another build), which would charge whichever
variant came next. Reported per variant: the median over repeats of the
slowest rank's time, the ratio to Megatron's ``initialize_model_parallel``,
the distinct groups a rank holds afterwards (the most on any rank),
``new_group`` calls per rank, and hypergrid's guarded batches.
"""

from __future__ import annotations

import argparse
import gc
import pathlib
import sys
import time
import warnings
from collections.abc import Callable
from typing import Any

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

import torch
import torch.distributed as dist

from benchmarks.common import median, write_json
from benchmarks.creation import counting_new_group
from hypergrid import HyperCommGrid, spawn
from hypergrid.compat.megatron import PG_FIELDS, collection_class, destroy_process_groups, grid_of, process_groups

SIZES = dict(tp=2, pp=2, ep=2, etp=1)
VARIANTS = ("hypergrid", "hypergrid guard off", "megatron initialize_model_parallel", "megatron grid builder")


def _distinct(pgs: Any) -> list[Any]:
    """The distinct process groups a collection holds on this rank."""
    groups: dict[int, Any] = {}
    for name in PG_FIELDS:
        value = getattr(pgs, name, None)
        for group in value if isinstance(value, list) else [value]:
            if isinstance(group, dist.ProcessGroup):
                groups[id(group)] = group
    return list(groups.values())


def _hypergrid(guard: bool) -> tuple[Callable[[], Any], Callable[[Any], int], Callable[[Any], None]]:
    def build() -> Any:
        return process_groups(**SIZES, guard=guard)

    def held(pgs: Any) -> int:
        return len(grid_of(pgs).communicators())

    return build, held, destroy_process_groups


def _initialize_model_parallel() -> tuple[Callable[[], Any], Callable[[Any], int], Callable[[Any], None]]:
    from megatron.core import parallel_state
    from megatron.core.process_groups_config import ProcessGroupCollection

    def build() -> Any:
        parallel_state.initialize_model_parallel(
            SIZES["tp"],
            SIZES["pp"],
            expert_model_parallel_size=SIZES["ep"],
            expert_tensor_parallel_size=SIZES["etp"],
            create_gloo_process_groups=False,
        )
        return ProcessGroupCollection.use_mpu_process_groups()

    def made() -> list[Any]:
        return [group for group in parallel_state._global_process_group_list or [] if group is not None]

    def destroy(pgs: Any) -> None:
        for group in made():  # destroy_model_parallel forgets the groups but leaves them alive
            dist.destroy_process_group(group)
        parallel_state.destroy_model_parallel()
        parallel_state.destroy_global_memory_buffer()

    return build, lambda pgs: len(made()), destroy


def _grid_builder() -> tuple[Callable[[], Any], Callable[[Any], int], Callable[[Any], None]]:
    from megatron.core.inference.shards import build_inference_pg_collection

    def build() -> Any:
        return build_inference_pg_collection(
            dist.get_world_size(),
            tp_size=SIZES["tp"],
            pp_size=SIZES["pp"],
            cp_size=1,
            ep_size=SIZES["ep"],
            expt_tp_size=SIZES["etp"],
        )

    def destroy(pgs: Any) -> None:
        for group in _distinct(pgs):
            dist.destroy_process_group(group)

    return build, lambda pgs: len(_distinct(pgs)), destroy


def _variant(name: str) -> tuple[Callable[[], Any], Callable[[Any], int], Callable[[Any], None]]:
    if name.startswith("hypergrid"):
        return _hypergrid(guard=name == "hypergrid")
    return _initialize_model_parallel() if name == "megatron initialize_model_parallel" else _grid_builder()


def _guarded_batches(build: Callable[[], Any]) -> tuple[Any, int]:
    """``build()`` and the create_pgs calls it made (each one guard round when the guard is on)."""
    calls = []
    real = HyperCommGrid.create_pgs

    def counted(self: HyperCommGrid, *args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return real(self, *args, **kwargs)

    HyperCommGrid.create_pgs = counted  # type: ignore[method-assign]
    try:
        return build(), len(calls)
    finally:
        HyperCommGrid.create_pgs = real  # type: ignore[method-assign]


def job(name: str, repeats: int, timed_first: bool = False) -> dict[str, Any]:
    """On every rank: ``name`` built once untimed (timed with ``timed_first``), then ``repeats`` times timed."""
    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    collection_class()  # imports megatron.core (seconds): not inside a build
    build, held, destroy = _variant(name)
    out: dict[str, Any] = {"times": []}
    for repeat in range(repeats + 1):
        dist.barrier()
        with counting_new_group() as calls:
            start = time.perf_counter()
            pgs, batches = _guarded_batches(build)
            seconds = time.perf_counter() - start
        if repeat or timed_first:  # else the first build warms up (first use of each code path)
            out["times"].append(seconds)
        out.update(held=held(pgs), new_group_calls=len(calls), batches=batches)
        destroy(pgs)
        gc.collect()
    return out


def first(name: str) -> dict[str, Any]:
    """On every rank of a fresh job: ``name`` built once (after megatron.core is imported); time and counts."""
    return job(name, 0, timed_first=True)


def _per_rank(world: int, repeats: int, timeout_s: float, fresh: bool) -> dict[str, list[dict[str, Any]]]:
    """Variant -> each rank's times and counts."""
    if not fresh:
        return {name: spawn(job, world, (name, repeats), timeout_s=timeout_s) for name in VARIANTS}
    samples: dict[str, list[list[dict[str, Any]]]] = {name: [] for name in VARIANTS}
    for _ in range(repeats):  # one fresh job per sample, the variants taking turns
        for name in VARIANTS:
            samples[name].append(spawn(first, world, (name,), timeout_s=timeout_s))
    return {
        name: [{**rank, "times": [sample[i]["times"][0] for sample in done]} for i, rank in enumerate(done[0])]
        for name, done in samples.items()
    }


def rows(world: int, repeats: int, timeout_s: float, fresh: bool = False) -> list[dict[str, Any]]:
    found = []
    for name, per_rank in _per_rank(world, repeats, timeout_s, fresh).items():
        slowest = [max(rank["times"][i] for rank in per_rank) for i in range(repeats)]
        found.append(
            {
                "world": world,
                "sizes": SIZES,
                "variant": name,
                "time_s": median(slowest),
                "groups_per_rank": max(rank["held"] for rank in per_rank),
                "new_group_calls_per_rank": max(rank["new_group_calls"] for rank in per_rank),
                "guarded_batches": per_rank[0]["batches"] if name == "hypergrid" else 0,
                "repeats": repeats,
                "protocol": "first build of a fresh job" if fresh else "repeated in one job per variant",
            }
        )
    reference = next(row["time_s"] for row in found if row["variant"] == "megatron initialize_model_parallel")
    for row in found:
        row["ratio_to_initialize_model_parallel"] = row["time_s"] / reference
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--world", default="4,8", help="comma-separated world sizes (multiples of 4)")
    parser.add_argument("--repeats", type=int, default=12)
    parser.add_argument("--timeout-s", type=float, default=900.0)
    parser.add_argument("--json", type=pathlib.Path, default=None)
    parser.add_argument("--fresh", action="store_true", help="time the first build of --repeats fresh jobs instead")
    args = parser.parse_args(argv)
    found = []
    print(f"{'world':>5}  {'variant':<36} {'median s':>9} {'ratio':>6} {'groups':>6} {'new_group':>9} {'batches':>7}")
    for world in (int(text) for text in args.world.split(",")):
        for row in rows(world, args.repeats, args.timeout_s, args.fresh):
            found.append(row)
            ratio = row["ratio_to_initialize_model_parallel"]
            print(
                f"{world:5d}  {row['variant']:<36} {row['time_s']:9.4f} {ratio:6.2f}"
                f" {row['groups_per_rank']:6d} {row['new_group_calls_per_rank']:9d} {row['guarded_batches']:7d}"
            )
    if args.json:
        write_json(args.json, found)
    return 0


if __name__ == "__main__":
    sys.exit(main())
