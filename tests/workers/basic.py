"""Functions run inside spawned gloo processes (module level, so spawn can import them)."""

from __future__ import annotations

import datetime
import os
import signal
import sys
import time
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

from hypergrid import GroupExistsError, HyperCommGrid, HyperGridError
from hypergrid.agreement.world import World


def _allreduce_rank(group: Any) -> int:
    value = torch.tensor([dist.get_rank()], dtype=torch.int64)
    dist.all_reduce(value, group=group)
    return int(value.item())


def grid_scenarios() -> dict[str, Any]:
    """Every family of a [2,2,2] grid, then an offset grid, then destroy and re-create."""
    rank = dist.get_rank()
    grid = HyperCommGrid([2, 2, 2], ["tp", "cp", "dp"])
    layout = grid.layout
    out: dict[str, Any] = {"rank": rank, "families": {}}
    for family in layout.all_families():
        group = grid.create_pg(list(reversed(family)), group_desc=f"HG_{layout.key(family)}")
        out["families"][layout.key(family)] = {
            "sum": _allreduce_rank(group),
            "ranks": dist.get_process_group_ranks(group),
            "group_rank": dist.get_rank(group),
            "same_object": grid.get_pg(list(family)) is group and grid.get_pg(layout.key(family)) is group,
            "desc": group.group_desc,
        }
    try:
        grid.create_pg(["cp", "tp"])
        out["recreate"] = "no error"
    except GroupExistsError as error:
        out["recreate"] = str(error)

    # An offset grid over ranks 4..7: ranks 0..3 are outside and get None.
    offset = HyperCommGrid([2, 2], ["tp", "dp"], rank_offset=4)
    out["in_offset_grid"] = offset.is_current_rank_in_grid()
    offset_groups = {}
    for family in offset.layout.all_families():
        group = offset.create_pg(family)
        offset_groups[offset.layout.key(family)] = None if group is None else _allreduce_rank(group)
    out["offset"] = offset_groups
    out["offset_get_pg_none"] = offset.get_pg("dp") is None

    # destroy, then create again: new groups, same membership, working collectives.
    old = grid.get_pg("tp")
    grid.destroy()
    out["after_destroy_keys"] = grid.created_keys
    try:
        dist.get_process_group_ranks(old)
        out["old_still_registered"] = True
    except KeyError:
        out["old_still_registered"] = False
    again = grid.create_pg("tp")
    out["recreated_sum"] = _allreduce_rank(again)
    out["recreated_is_new"] = again is not old
    grid.destroy()
    offset.destroy()
    return out


def fail_on_rank(bad_rank: int) -> int:
    """Raise on one rank; the others wait in a collective that will never complete."""
    if dist.get_rank() == bad_rank:
        raise RuntimeError(f"deliberate failure on rank {bad_rank}")
    dist.barrier()
    return dist.get_rank()


def exit_on_rank(bad_rank: int) -> int:
    """One rank dies without a word (as a killed process would)."""
    if dist.get_rank() == bad_rank:
        os._exit(17)
    dist.barrier()
    return dist.get_rank()


def sleep_forever() -> None:
    time.sleep(3600)


def environment() -> dict[str, str]:
    keys = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")
    return {key: os.environ[key] for key in keys} | {"dist_rank": str(dist.get_rank())}


def imported(names: list[str]) -> list[str]:
    """Which of the modules ``names`` this worker had imported when its function began."""
    return [name for name in names if name in sys.modules]


def variable(name: str) -> str | None:
    """The worker's value of the environment variable ``name`` (None: not set)."""
    return os.environ.get(name)


def _outcome(create: Any) -> str:
    """Run a creation; describe its result or the hypergrid error it raised."""
    try:
        group = create()
    except HyperGridError as error:
        return f"{type(error).__name__}: {error}"
    return "none" if group is None else f"ok {dist.get_process_group_ranks(group)}"


def strategy_families(strategy: str) -> dict[str, Any]:
    """Every family of a [2,2,2] grid and of an offset [2,2] grid with one strategy."""
    grid = HyperCommGrid([2, 2, 2], ["tp", "cp", "dp"], strategy=strategy)
    out: dict[str, Any] = {}
    for family in grid.layout.all_families():
        group = grid.create_pg(family)
        out[grid.layout.key(family)] = (dist.get_process_group_ranks(group), _allreduce_rank(group))
    offset = HyperCommGrid([2, 2], ["tp", "dp"], rank_offset=4)
    for family in offset.layout.all_families():
        group = offset.create_pg(family, strategy=strategy)  # the per-call override
        out[f"offset {offset.layout.key(family)}"] = None if group is None else _allreduce_rank(group)
    grid.destroy()
    offset.destroy()
    # Re-create after destroy: torch would reuse a members-only group's name and stale keys.
    out["recreate"] = _outcome(lambda: grid.create_pg("tp"))
    grid.destroy()
    return out


def local_with_extra_group(guard: bool, timeout_s: float) -> str:
    """Ranks 0 and 1 hold an extra unrelated group, then 'local' creates the dp family."""
    if dist.get_rank() in (0, 1):
        dist.new_group([0, 1], use_local_synchronization=True)
    grid = HyperCommGrid([2, 2], ["tp", "dp"], strategy="local", guard=guard, guard_timeout_s=timeout_s)
    try:
        return _outcome(lambda: grid.create_pg("dp", timeout=datetime.timedelta(seconds=timeout_s)))
    except Exception as error:  # torch's own failure when nothing guards the creation
        return f"torch {type(error).__name__}: {error}"


def guard_scenarios() -> dict[str, Any]:
    """Mismatched family, order, grid and lazy access on 8 ranks; then consistent use still works."""
    rank = dist.get_rank()
    names = ["tp", "cp", "dp"]
    out: dict[str, Any] = {}
    grid = HyperCommGrid([2, 2, 2], names, guard_timeout_s=60)
    out["family"] = _outcome(lambda: grid.create_pg("dp" if rank == 3 else "tp"))
    first, second = ("cp", "dp") if rank < 4 else ("dp", "cp")
    ordered = HyperCommGrid([2, 2, 2], names, guard_timeout_s=60)
    out["order"] = [_outcome(lambda: ordered.create_pg(first)), _outcome(lambda: ordered.create_pg(second))]
    shape = [4, 2] if rank == 0 else [2, 4]
    other = HyperCommGrid(shape, ["tp", "dp"], guard_timeout_s=60)
    out["grid"] = _outcome(lambda: other.create_pg("tp"))
    lazy = HyperCommGrid([2, 2, 2], names, guard_timeout_s=60)
    out["lazy"] = _outcome(lambda: lazy.pg("cp" if rank == 6 else "dp-cp"))
    # Everyone consistent again: works, and the lazy accessor returns the same object.
    out["after"] = _outcome(lambda: lazy.pg("tp"))
    out["after_sum"] = _allreduce_rank(lazy.pg("tp"))
    out["lazy_same"] = lazy.pg("tp") is lazy.get_pg("tp")
    # Two grids over the same ranks, interleaved, and a grid rebuilt after destroy(). (Not tp x dp: rank 0
    # built a grid of another shape above, so its later tp x dp grids are told apart from the others' by
    # their ordinal among grids of that description, and would be refused as out of step.)
    one, two = HyperCommGrid([2, 4], ["a", "b"]), HyperCommGrid([4, 2], ["a", "b"])
    one.create_pg("a")
    two.create_pg("a")
    one.destroy()
    rebuilt = HyperCommGrid([2, 4], ["a", "b"])
    out["rebuilt"] = _outcome(lambda: rebuilt.create_pg("b"))
    out["two_sum"] = _allreduce_rank(two.get_pg("a"))
    # destroy() twice on some ranks, once (later) on the others; then create again.
    if rank < 4:
        lazy.destroy()
        lazy.destroy()
    dist.barrier()
    lazy.destroy()
    out["recreate_after_uneven_destroy"] = _allreduce_rank(lazy.pg("tp"))
    for each in (grid, ordered, other, lazy, two, rebuilt):
        each.destroy()
    return out


def dead_rank_during_creation(victim: int, how: str, guard_timeout_s: float) -> str:
    """``victim`` is killed (or just never calls) while the others create a family."""
    grid = HyperCommGrid([2, 2], ["tp", "dp"], guard_timeout_s=guard_timeout_s)
    store = c10d._get_default_store()
    dist.barrier()
    if dist.get_rank() == victim:
        if how == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        World.current().join()  # (its grid joined already) its watcher answers roll calls: alive, never named dead
        # Alive but absent until every other rank has its outcome (at most twice the timeout and 5 s).
        store.wait(["test/absent/others-done"], datetime.timedelta(seconds=guard_timeout_s * 2 + 5))
        return "stayed away"
    start = time.monotonic()
    outcome = _outcome(lambda: grid.create_pg("dp"))
    seconds = time.monotonic() - start
    if store.add("test/absent/outcomes", 1) == dist.get_world_size() - 1:
        store.set("test/absent/others-done", "1")
    return f"{outcome} after {seconds:.1f} s"


def create_destroy_cycles(cycles: int) -> dict[str, int]:
    """Create every family and destroy them, ``cycles`` times; count torch's registry."""
    registry = c10d._world.pg_map
    before = len(registry)
    grid = HyperCommGrid([2, 2], ["tp", "dp"])
    peak = 0
    for _ in range(cycles):
        for family in grid.layout.all_families():
            grid.create_pg(family)
        peak = max(peak, len(registry) - before)
        grid.destroy()
    check = grid.create_pg("dp-tp")
    total = _allreduce_rank(check)
    dist.barrier()  # a rank that destroys (and exits) while a peer still finishes the all_reduce breaks it (gloo)
    grid.destroy()
    return {"left": len(registry) - before, "peak": peak, "sum": total}


def framework_scenarios() -> dict[str, Any]:
    """Getters, a folded view, an MPU and a DeviceMesh with a DTensor op, on 8 ranks."""
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    from hypergrid.compat.megatron import moe_grids
    from hypergrid.compat.mpu import MPU

    grid = HyperCommGrid([2, 2, 2], ["tp", "dp", "pp"])
    out: dict[str, Any] = {"coord": tuple(grid.my_coord())}
    getters = {}
    for family in grid.layout.all_families():
        group = grid.pg(family)
        getters[grid.layout.key(family)] = (
            grid.group_rank(family) == dist.get_rank(group),
            grid.group_size(family) == dist.get_world_size(group),
            grid.src_rank(family) == dist.get_global_rank(group, 0),
        )
    out["getters"] = getters
    # MoE folding: the expert view shares pp with the dense grid.
    dense, expert = moe_grids(tp=2, pp=2, etp=1, ep=4)
    out["moe_shapes"] = (dense.shape, expert.shape)
    out["pp_same_object"] = expert.pg("pp") is dense.pg("pp")
    out["ep_ranks"] = dist.get_process_group_ranks(expert.pg("ep"))
    out["ep_sum"] = _allreduce_rank(expert.pg("ep"))
    out["ep_not_dense"] = expert.pg("ep") is not dense.pg("dp")
    expert.destroy()
    out["pp_alive_after_view_destroy"] = _allreduce_rank(dense.get_pg("pp"))
    dense.destroy()
    # An MPU over the grid.
    mpu = MPU(grid)
    out["mpu"] = (
        mpu.get_data_parallel_rank() == dist.get_rank(mpu.get_data_parallel_group()),
        mpu.get_tensor_model_parallel_world_size(),
        mpu.get_model_parallel_world_size(),
        mpu.is_first_stage(),
        mpu.is_last_stage(),
        mpu.get_data_parallel_group() is grid.get_pg("dp"),
    )
    # A DeviceMesh over (dp, tp) made of the grid's groups, and a real DTensor op on it.
    mesh = grid.to_device_mesh(["dp", "tp"])
    out["mesh_groups_are_grids"] = mesh.get_group("dp") is grid.get_pg("dp") and mesh.get_group("tp") is grid.get_pg(
        "tp"
    )
    out["mesh"] = mesh.mesh.tolist()
    full = torch.arange(16, dtype=torch.float32).reshape(4, 4)
    sharded = distribute_tensor(full, mesh, [Shard(0), Replicate()])
    out["local_shape"] = tuple(sharded.to_local().shape)
    out["dtensor_sum"] = float((sharded * 2).sum().full_tensor())
    out["redistributed"] = torch.equal(sharded.redistribute(mesh, [Replicate(), Replicate()]).to_local(), full)
    # The launcher's placement matches 8 ranks per node; not 4 (LOCAL_RANK is rank % 8 here).
    grid.check_local_rank()
    try:
        grid.check_local_rank(ranks_per_node=4)
        out["wrong_node_size"] = "accepted"
    except HyperGridError as error:
        out["wrong_node_size"] = str(error)
    grid.destroy()
    return out
