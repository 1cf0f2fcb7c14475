"""Spawned-rank scenarios for checked collectives: one rank calls differently, every rank reports what it saw.

Workers return raw outcomes (the error's type, message and signatures, or the
result); the tests decide what each rank should have seen.
"""

from __future__ import annotations

import datetime
import os
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from hypergrid import CollectiveMismatchError, HyperCommGrid, HyperGridError

DIMS = ["tp", "dp"]  # a [2, 2] grid over 4 ranks; nodes of 2 ranks for the hierarchical all-reduce
FAMILY = "dp-tp"  # every rank: a mismatch on one rank must reach all four
ODD = 3  # the rank that calls differently

SUM, MAX = dist.ReduceOp.SUM, dist.ReduceOp.MAX


def _data(rank: int, count: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.arange(count, dtype=dtype) + 100 * rank


def mismatches(rank: int) -> dict[str, tuple[Callable[[HyperCommGrid], Any], str]]:
    """Each kind of mismatch: the call this rank makes, and the field it differs in (on rank ``ODD``)."""
    odd = rank == ODD

    def call(name: str, *args: Any, **kwargs: Any) -> Callable[[HyperCommGrid], Any]:
        return lambda grid: getattr(grid, name)(*args, **kwargs)

    per_node = {"ranks_per_node": 2}
    wide = torch.float64 if odd else torch.float32  # the dtype rank ODD passes
    op = MAX if odd else SUM  # the op rank ODD passes
    tree = "hierarchical_all_reduce"
    return {
        "all_reduce shape": (call("all_reduce", torch.ones(3 if odd else 2, 2), FAMILY), "shape"),
        "all_reduce dtype": (call("all_reduce", _data(rank, 4, wide), FAMILY), "dtype"),
        "all_reduce op": (call("all_reduce", _data(rank, 4), FAMILY, op=op), "op"),
        "all_gather shape": (call("all_gather", _data(rank, 5 if odd else 4), FAMILY), "shape"),
        "all_gather dim": (call("all_gather", torch.ones(2, 2), FAMILY, dim=1 if odd else 0), "dim"),
        "reduce_scatter count": (call("reduce_scatter", _data(rank, 6 if odd else 8), FAMILY), "shape"),
        "reduce_scatter op": (call("reduce_scatter", _data(rank, 8), FAMILY, op=op), "op"),
        "broadcast dtype": (call("broadcast", _data(rank, 4, torch.int64 if odd else torch.float32), FAMILY), "dtype"),
        "broadcast src": (call("broadcast", torch.ones(4), FAMILY, group_src=1 if odd else 0), "group_src"),
        "hierarchical count": (call(tree, _data(rank, 7 if odd else 8), FAMILY, **per_node), "shape"),
        "hierarchical dtype": (call(tree, _data(rank, 8, wide), FAMILY, **per_node), "dtype"),
        "hierarchical op": (call(tree, _data(rank, 8), FAMILY, op=op, **per_node), "op"),
        "not a tensor on one rank": (call("all_reduce", [1.0, 2.0] if odd else torch.ones(2), FAMILY), "tensor"),
    }


def _outcome(run: Callable[[], Any]) -> dict[str, Any]:
    try:
        run()
    except CollectiveMismatchError as error:
        return {"error": "CollectiveMismatchError", "message": str(error), "signatures": error.signatures}
    except HyperGridError as error:
        return {"error": type(error).__name__, "message": str(error)}
    return {"error": None}


def mismatch_scenarios(from_env: bool) -> dict[str, Any]:
    """Every mismatch kind on a checked grid; then matching calls still work on the same groups."""
    rank = dist.get_rank()
    if from_env:
        os.environ["HYPERGRID_CHECK_COLLECTIVES"] = "1"
        grid = HyperCommGrid([2, 2], DIMS)
    else:
        grid = HyperCommGrid([2, 2], DIMS, check_collectives=True)
    out: dict[str, Any] = {"checking": grid.check_collectives}
    for name, (run, _) in mismatches(rank).items():
        out[name] = _outcome(lambda run=run: run(grid))  # type: ignore[misc]
    after = _data(rank, 4)
    grid.all_reduce(after, FAMILY)
    out["after"] = after.tolist()
    grid.destroy()
    return out


def matching_calls(check: bool) -> dict[str, Any]:
    """The same collectives with matching calls, on a checked or an unchecked grid: the raw results."""
    rank = dist.get_rank()
    grid = HyperCommGrid([2, 2], DIMS, check_collectives=check)
    results: dict[str, Any] = {}
    for family in ["tp", "dp", FAMILY]:
        reduced = _data(rank, 6)
        grid.all_reduce(reduced, family)
        maximum = _data(rank, 6)
        grid.all_reduce(maximum, family, op=MAX)
        broadcast = _data(rank, 3)
        grid.broadcast(broadcast, family, group_src=1)
        hierarchical = _data(rank, 7, torch.float64)
        grid.hierarchical_all_reduce(hierarchical, family, ranks_per_node=2)
        results[family] = {
            "all_reduce": reduced.tolist(),
            "all_reduce_max": maximum.tolist(),
            "all_gather": grid.all_gather(_data(rank, 2).reshape(1, 2), family, dim=1).tolist(),
            "reduce_scatter": grid.reduce_scatter(_data(rank, 8), family).tolist(),
            "broadcast": broadcast.tolist(),
            "hierarchical": hierarchical.tolist(),
        }
    grid.destroy()
    return results


def matching_calls_both() -> tuple[dict[str, Any], dict[str, Any]]:
    """``matching_calls`` on a checked grid, then on an unchecked one, in the same world."""
    return matching_calls(True), matching_calls(False)


def one_rank_checks() -> str:
    """Rank ``ODD`` alone turns checking on: the first collective's creation must refuse on every rank."""
    rank = dist.get_rank()
    grid = HyperCommGrid([2, 2], DIMS, check_collectives=rank == ODD, guard_timeout_s=20)
    try:
        grid.all_reduce(torch.ones(2), FAMILY)
    except HyperGridError as error:
        return f"{type(error).__name__}: {error}"
    finally:
        grid.destroy()
    return "no error"


#: Scenarios whose calls can never meet: what rank ``ODD`` does instead of the others' program.
NEVER_MEET = ("cross-family", "skipped", "extra")


def _timed_steps(steps: list[Callable[[], Any]]) -> dict[str, Any]:
    """Run the steps in order until one raises: which step, what it raised, and the seconds since the start."""
    start = time.monotonic()
    for index, step in enumerate(steps):
        try:
            step()
        except HyperGridError as error:
            return {
                "step": index,
                "error": type(error).__name__,
                "message": str(error),
                "seconds": time.monotonic() - start,
            }
    return {"step": None, "error": None, "seconds": time.monotonic() - start}


def never_meet(case: str) -> dict[str, Any]:
    """One rank's calls can never meet the others' (600 s group timeouts): every rank must raise, soon.

    The program: a step of collectives, then a barrier over every rank. ``cross-family``: rank ``ODD``
    all-reduces over ``tp`` while the others use ``dp``; ``skipped``: it makes one of two ``dp``
    all-reduces; ``extra``: it makes three. Then every rank destroys the grid and the grid works again.
    """
    rank = dist.get_rank()
    odd = rank == ODD
    options = {"timeout": datetime.timedelta(seconds=600)}
    grid = HyperCommGrid([2, 2], DIMS, check_collectives=True, group_options=options, guard_timeout_s=600)
    for family in ("tp", "dp", FAMILY):
        grid.pg(family)

    def reduce(family: str) -> Callable[[], Any]:
        return lambda: grid.all_reduce(torch.ones(2), family)

    program = {
        "cross-family": [reduce("tp" if odd else "dp")],
        "skipped": [reduce("dp")] * (1 if odd else 2),
        "extra": [reduce("dp")] * (3 if odd else 2),
    }[case]
    outcome = _timed_steps([*program, lambda: grid.barrier(FAMILY)])
    grid.destroy()
    after = torch.ones(2)
    grid.all_reduce(after, FAMILY)  # a new epoch: the grid works again
    outcome["after"] = after.tolist()
    grid.destroy()
    return outcome


def mismatched_arguments(case: str) -> dict[str, Any]:
    """average_gradients or exchange with arguments that differ on rank ``ODD``: every rank raises at once."""
    rank = dist.get_rank()
    odd = rank == ODD
    if case.startswith("average_gradients"):
        grid = HyperCommGrid([2, 2], DIMS, check_collectives=True)
        model = torch.nn.Sequential(torch.nn.Linear(4, 4), *([torch.nn.Linear(4, 4)] if odd else []))
        model(torch.ones(1, 4)).sum().backward()
        mb = 1e-5 if odd and case.endswith("buckets") else 25
        if case.endswith("buckets"):
            model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 4))
            model(torch.ones(1, 4)).sum().backward()
        outcome = _timed_steps([lambda: grid.average_gradients(model, "dp", bucket_mb=mb)])
    else:  # exchange along a pipeline of 4 stages: rank ODD receives a tensor of another shape
        grid = HyperCommGrid([4], ["pp"], check_collectives=True)
        size = 3 if odd else 2
        outcome = _timed_steps([lambda: grid.exchange("pp", send_next=torch.ones(2), recv_prev=torch.empty(size))])
    grid.destroy()
    return outcome


def each(scenario: Callable[[str], dict[str, Any]], cases: list[str]) -> dict[str, dict[str, Any]]:
    """``scenario`` for each of ``cases`` in turn, in one world (each builds and destroys its own grid)."""
    return {case: scenario(case) for case in cases}
