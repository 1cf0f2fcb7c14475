"""Functions run inside spawned gloo processes for the elastic grid's tests (module level, so spawn can import them).

The training: a linear model ``y = x @ w`` fitted by full-batch gradient descent
to targets ``x @ w_true``, its 8 weights split over ``tp`` (4 each), the
global batch of 12 samples split over ``dp``. Whatever the grid's ``dp``
(4, 3, 2), the step is the same full-batch step, so a run interrupted by a
shrink must end where a plain single-process run ends (`reference_weights`).
"""

from __future__ import annotations

import contextlib
import datetime
import os
import time
from typing import Any

import torch
import torch.distributed as dist

from hypergrid import HyperCommGrid
from hypergrid.agreement.world import World
from hypergrid.errors import HyperGridError, RankFailure

FEATURES, BATCH, LR = 8, 12, 0.05
FAMILIES = ["tp", "dp", ["dp", "tp"]]


def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The global batch of ``step`` (the same on every rank and in the reference)."""
    generator = torch.Generator().manual_seed(1000 + step)
    x = torch.randn(BATCH, FEATURES, generator=generator, dtype=torch.float64)
    w_true = torch.arange(1, FEATURES + 1, dtype=torch.float64) / FEATURES
    return x, x @ w_true


def reference_weights(steps: int) -> list[float]:
    """Plain full-batch gradient descent, one process, no grid: what every run must end with."""
    w = torch.zeros(FEATURES, dtype=torch.float64)
    for step in range(steps):
        x, y = batch(step)
        w = w - LR * 2 / BATCH * x.T @ (x @ w - y)
    return w.tolist()


def _step(grid: Any, w: torch.Tensor, step: int) -> torch.Tensor:
    """One training step on ``grid``: this rank's weights and rows, tensor- then data-parallel reductions."""
    rank = dist.get_rank()
    coords = dict(zip(grid.dim_names, grid.layout.coords_of(rank)))
    x, y = batch(step)
    half = FEATURES // grid.layout.dim_size("tp")
    columns = slice(coords["tp"] * half, (coords["tp"] + 1) * half)
    rows = BATCH // grid.layout.dim_size("dp")
    mine = slice(coords["dp"] * rows, (coords["dp"] + 1) * rows)
    prediction = x[mine, columns] @ w
    grid.all_reduce(prediction, "tp")
    gradient = 2 / BATCH * x[mine, columns].T @ (prediction - y[mine])
    grid.all_reduce(gradient, "dp")
    return w - LR * gradient


def _grid(spares: int, timeout_s: float) -> HyperCommGrid:
    """tp=2 x dp=(the world less the spares, over 2), with the families the tests shrink."""
    grid = HyperCommGrid(
        [2, (dist.get_world_size() - spares) // 2],
        ["tp", "dp"],
        spares=spares,
        guard_timeout_s=30.0,
        group_options={"timeout": datetime.timedelta(seconds=timeout_s)},
    )
    grid.create_pgs(FAMILIES)
    grid.create_pg("dp", tag="ag")
    return grid


def _memberships(grid: Any) -> dict[str, list[int]]:
    return {str(key): dist.get_process_group_ranks(grid._pgs[key]) for key in grid.created_keys}


def train(
    steps: int,
    victims: list[int],
    at: int,
    given: bool,
    policy: str = "drop",
    spares: int = 0,
    timeout_s: float = 3.0,
    shrink_timeout_s: float = 10.0,
) -> dict[str, Any]:
    """Train ``steps`` steps on tp=2 x dp=4; ``victims`` die at step ``at``; survivors shrink and finish.

    ``given``: survivors name the dead to ``shrink`` (else it finds them by timeout). ``timeout_s``: the
    groups' (a survivor far from the dead learns of the failure only then); ``shrink_timeout_s``: how long
    ``shrink`` waits for a rank nobody named (longer than ``timeout_s``, so that slow survivors arrive).
    Returns what this rank saw: its caught error, its Regrid's fields, the new groups and its final shard.
    """
    grid: Any = _grid(spares, timeout_s)
    old_keys = [str(key) for key in grid.created_keys]
    rank = dist.get_rank()
    out: dict[str, Any] = {"old_rank": rank, "old_keys": old_keys}
    w = torch.zeros(FEATURES // 2, dtype=torch.float64)
    if rank >= dist.get_world_size() - spares:  # a spare: wait to be drafted
        regrid = grid.standby(timeout_s=shrink_timeout_s)
        out["drafted"] = regrid is not None
        if regrid is None:
            return out
        step, grid = regrid.step, regrid.grid  # the step the survivors agreed on; their state comes from a source
        regrid.broadcast_from_sources([w])
        out.update(regrid=_fields(regrid), started_at=step)
    else:
        step = 0
    shrunk = False
    while step < steps:
        start = w
        try:
            if step == at and not shrunk and rank in victims:
                os._exit(1)  # dies in the middle of the step: the others are in its collectives
            w = _step(grid, w, step)
            step += 1
        except RankFailure as failure:
            out["caught"] = type(failure).__name__
            out["cause"] = type(failure.__cause__).__name__
            out["named"] = list(failure.dead)
            began = time.monotonic()
            regrid = grid.shrink(dead=victims if given else None, policy=policy, timeout_s=shrink_timeout_s, step=step)
            out["shrink_s"] = time.monotonic() - began
            out["regrid"] = _fields(regrid)
            if regrid.retired:
                return out
            grid, w, shrunk = regrid.grid, start, True
            regrid.broadcast_from_sources([w])
    out.update(new_keys=[str(key) for key in grid.created_keys], groups=_memberships(grid))
    out.update(rank=dist.get_rank(), world=dist.get_world_size(), shape=grid.shape, w=w.tolist())
    coords = grid.layout.coords_of(dist.get_rank())
    out["coords"] = dict(zip(grid.dim_names, coords))
    if spares:
        grid.release_spares()
    return out


def _fields(regrid: Any) -> dict[str, Any]:
    return {
        "rank": regrid.rank,
        "epoch": regrid.epoch,
        "dead": list(regrid.dead),
        "retired": regrid.retired,
        "old_to_new": regrid.old_to_new,
        "source": regrid.source,
        "policy": regrid.policy,
        "step": regrid.step,
    }


def absent_survivor(timeout_s: float, shrink_timeout_s: float) -> dict[str, Any]:
    """Rank 5 never calls shrink (it sleeps); rank 3 dies; the others must declare 5 dead after the timeout."""
    grid: Any = _grid(0, timeout_s)
    rank = dist.get_rank()
    if rank == 3:
        os._exit(1)
    store = World.current().base_store  # the job's first store: it outlives the world the shrink forms
    survivors = [r for r in range(dist.get_world_size()) if r not in (3, 5)]
    if rank == 5:  # alive, but never calls shrink, until every survivor is through it; then gone without a word
        with contextlib.suppress(RuntimeError):  # the wait's own bound passed: gone anyway
            store.wait([f"test/absent/done/{r}" for r in survivors], datetime.timedelta(seconds=shrink_timeout_s + 60))
        os._exit(0)
    with contextlib.suppress(RankFailure):
        grid.all_reduce(torch.ones(1), "dp")
    regrid = grid.shrink(dead=[3], timeout_s=shrink_timeout_s)
    out: dict[str, Any] = {"regrid": _fields(regrid)}
    if not regrid.retired:
        out["world"] = dist.get_world_size()
        total = torch.ones(1)
        regrid.grid.all_reduce(total, ["dp", "tp"])
        out["sum"] = total.item()
    store.set(f"test/absent/done/{rank}", "1")
    return out


def abort_with_dead_peer(timeout_s: float) -> dict[str, Any]:
    """Rank 3 dies; every other rank aborts the grid's groups: how long abort takes, and what is left."""
    grid: Any = _grid(0, timeout_s)
    if dist.get_rank() == 3:
        os._exit(1)
    time.sleep(0.5)
    began = time.monotonic()
    grid.abort()
    return {"abort_s": time.monotonic() - began, "keys": list(grid.created_keys)}


def bad_inputs() -> dict[str, str]:
    """Each impossible shrink on a healthy world of 4 (tp=2 x dp=2): the error, and the groups still working."""
    grid: Any = HyperCommGrid([2, 2], ["tp", "dp"], guard_timeout_s=30.0)
    grid.create_pgs(["tp", "dp"])
    rank = dist.get_rank()
    out: dict[str, str] = {}
    cases: dict[str, dict[str, Any]] = {
        "outside": {"dead": [4]},
        "negative": {"dead": [-1]},
        "self": {"dead": [rank]},
        "dim": {"dim": "cp"},
        "policy": {"policy": "shuffle"},
    }
    for name, kwargs in cases.items():
        try:
            grid.shrink(**kwargs)
            out[name] = "no error"
        except HyperGridError as error:
            out[name] = f"{type(error).__name__}: {error}"
    total = torch.ones(1)
    grid.all_reduce(total, ["dp", "tp"])
    out["still_working"] = str(total.item())
    return out


def released_spare() -> dict[str, Any]:
    """dp=3 and one spare: the grid's ranks work, then release the spare; its standby returns None."""
    grid: Any = HyperCommGrid([3], ["dp"], spares=1, guard_timeout_s=30.0)
    grid.create_pg("dp")
    if dist.get_rank() == 3:
        return {"standby": grid.standby()}
    total = torch.ones(1)
    grid.all_reduce(total, "dp")
    grid.release_spares()
    grid.release_spares()  # a second call changes nothing
    return {"sum": total.item()}
