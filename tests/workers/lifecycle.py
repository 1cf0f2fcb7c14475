"""A world's lifecycle (issue 44): a late rank, shrinks with nobody dead, a replaced grid, refusals that change nothing,
a fenced rank under ``spawn``. The scenarios of ``tests/grid/test_world_lifecycle.py``.

Module-level functions so that ``hypergrid.spawn`` (or ``torch.multiprocessing``) can import them. Only the public
API: ``HyperCommGrid``, its collectives and ``shrink``, ``StepSnapshots``, ``hypergrid.errors`` and torch. Each
worker catches what the grid raises and returns it as data (`_raised`), so that the test sees what EVERY rank saw
instead of the first traceback; only the resumed rank of `stopped_then_fenced` lets its error go, as a training
script would.
"""

from __future__ import annotations

import datetime
import json
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

import hypergrid.errors
from hypergrid import HyperCommGrid, StepSnapshots
from hypergrid.errors import HyperGridError, RankFailure

#: Production-like: a collective waits this long before torch gives up on its own.
GROUP_TIMEOUT = datetime.timedelta(seconds=600)


def _raised(error: BaseException, began: float | None = None) -> dict[str, Any]:
    """What a call raised, as data: its class, whether it is hypergrid's, its first line, and when."""
    text = str(error)
    out: dict[str, Any] = {
        "type": type(error).__name__,
        "hypergrid": isinstance(error, HyperGridError),
        "message": text.splitlines()[0] if text else "",
        "text": text[:2000],
    }
    if began is not None:
        out["seconds"] = time.monotonic() - began
    return out


def _step(grid: Any) -> list[float]:
    """A tensor-parallel then a data-parallel reduction of ones: [the tp group's size, the world's size]."""
    x = torch.ones(4)
    grid.all_reduce(x, "tp")
    after_tp = float(x[0].item())
    grid.all_reduce(x, "dp")
    return [after_tp, float(x[0].item())]


def _threads() -> list[str]:
    return sorted(thread.name for thread in threading.enumerate() if thread.name.startswith("hypergrid"))


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


# -- 1. late is not dead ---------------------------------------------------------------------------------------------


def late_rank(late: int, late_s: float, where: str) -> dict[str, Any]:
    """Every rank makes a tp2 x dp2 grid, creates tp and dp, reduces over both; ``late`` is ``late_s`` late.

    ``where``: ``"before_grid"`` (the late rank sleeps before it constructs its grid) or ``"before_create"`` (it
    constructs its grid first, then sleeps before its first ``create_pgs``). Returns the sums, or what was raised.
    """
    rank = dist.get_rank()
    out: dict[str, Any] = {"rank": rank}
    began = time.monotonic()
    try:
        if rank == late and where == "before_grid":
            time.sleep(late_s)
        grid = HyperCommGrid([2, 2], ["tp", "dp"])
        if rank == late and where == "before_create":
            time.sleep(late_s)
        grid.create_pgs(["tp", "dp"])
        out["sums"] = _step(grid)
    except BaseException as error:
        out["error"] = _raised(error, began)
        return out
    out["seconds"] = time.monotonic() - began
    return out


# -- 2. a shrink with nobody dead -----------------------------------------------------------------------------------


def shrink_nobody_dead(tp: int, cycles: int) -> dict[str, Any]:
    """``cycles`` times: every rank shrinks a tp x dp grid along dp with nobody dead, then reduces on the new grid.

    The reduction is a step of a tp x dp job: over tp, then over dp (tp1: one reduction over the world, the
    family over both). Returns each cycle's sums (or what was raised, and at which cycle), and the open file
    descriptors and hypergrid threads after cycle 1 and after the last.
    """
    size = dist.get_world_size()
    grid = HyperCommGrid([tp, size // tp], ["tp", "dp"], group_options={"timeout": GROUP_TIMEOUT})
    grid.create_pgs(["tp", "dp", ["tp", "dp"]])
    out: dict[str, Any] = {"rank": dist.get_rank(), "sums": [], "worlds": []}
    for cycle in range(1, cycles + 1):
        try:
            regrid = grid.shrink(dim="dp", policy="drop")
            if regrid.grid is None:
                out["error"] = {"type": "retired", "cycle": cycle, "dead": list(regrid.dead)}
                return out
            grid = regrid.grid
            out["worlds"].append([dist.get_world_size(), list(regrid.dead)])
            if tp == 1:
                x = torch.ones(2)
                grid.all_reduce(x, ["tp", "dp"])
                out["sums"].append([float(x[0].item())])
            else:
                out["sums"].append(_step(grid))
        except BaseException as error:
            out["error"] = _raised(error) | {"cycle": cycle}
            return out
        if cycle == 1:
            out["first"] = {"fds": _fds(), "threads": _threads()}
    out["last"] = {"fds": _fds(), "threads": _threads()}
    grid.destroy()
    return out


# -- 3. a replaced grid refuses at once ------------------------------------------------------------------------------


def _killed_and_shrunk(victim: int) -> tuple[Any, Any, dict[str, Any]]:
    """tp1 x dp4 (600 s groups); ``victim`` SIGKILLs itself inside a step; the others catch RankFailure and shrink.

    Returns (the old grid, the new one, what this survivor saw).
    """
    grid = HyperCommGrid([1, dist.get_world_size()], ["tp", "dp"], group_options={"timeout": GROUP_TIMEOUT})
    grid.create_pgs(["tp", "dp"])
    _step(grid)
    seen: dict[str, Any] = {"rank": dist.get_rank()}
    try:
        if dist.get_rank() == victim:
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(0.2)  # the victim dies while the others are in their collectives
        _step(grid)
        seen["error"] = {"type": "a step went through with a dead rank"}
        return grid, None, seen
    except RankFailure as failure:
        seen["caught"] = list(failure.dead)
    regrid = grid.shrink(dim="dp", policy="drop")
    seen["dead"] = list(regrid.dead)
    return grid, regrid.grid, seen


def replaced_grid(victim: int) -> dict[str, Any]:
    """After the shrink, rank 0 alone calls the OLD grid (shrink, all_reduce, create_pg, pg); then every survivor
    reduces over the NEW grid. Returns, per old call, what it raised and how fast; and the new grid's sum."""
    old, new, seen = _killed_and_shrunk(victim)
    if new is None:
        return seen
    replaced = getattr(hypergrid.errors, "GridReplacedError", None)
    seen["has_class"] = replaced is not None
    if dist.get_rank() == 0:
        calls = {
            "shrink": lambda: old.shrink(),
            "all_reduce": lambda: old.all_reduce(torch.ones(2), "dp"),
            "create_pg": lambda: old.create_pg("dp", tag="x"),
            "pg": lambda: old.pg("dp"),
        }
        seen["old"] = {}
        for name, call in calls.items():
            began = time.monotonic()
            try:
                call()
                seen["old"][name] = {"type": None, "seconds": time.monotonic() - began}
            except BaseException as error:
                seen["old"][name] = _raised(error, began) | {
                    "replaced": replaced is not None and isinstance(error, replaced)
                }
    try:
        seen["sums"] = _step(new)
        seen["world"] = dist.get_world_size()
    except BaseException as error:
        seen["new_error"] = _raised(error)
    return seen


# -- 4. a refused call before init ----------------------------------------------------------------------------------


def refused_before_init(rank: int, size: int, port: int, out: str) -> None:
    """``torch.multiprocessing`` target: rank 0 calls ``shrink`` on a grid before torch.distributed is initialized
    (refused); then every rank joins (``env://``, rank 0 hosting the store), creates tp and dp, and reduces.

    Writes ``<out>/rank<r>.json``: what the early call raised (rank 0) and the sums, or what was raised.
    """
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(size))
    seen: dict[str, Any] = {"rank": rank}
    if rank == 0:
        try:
            HyperCommGrid([2, size // 2], ["tp", "dp"]).shrink(dead=[1])
            seen["early"] = {"type": None}
        except BaseException as error:
            seen["early"] = _raised(error)
    dist.init_process_group("gloo", init_method="env://", timeout=datetime.timedelta(seconds=120))
    try:
        grid = HyperCommGrid([2, size // 2], ["tp", "dp"], guard_timeout_s=60.0)
        grid.create_pgs(["tp", "dp"])
        seen["sums"] = _step(grid)
        grid.destroy()
    except BaseException as error:
        seen["error"] = _raised(error)
    Path(out, f"rank{rank}.json").write_text(json.dumps(seen, indent=1))
    dist.barrier()  # rank 0 hosts the store: nobody leaves before every report is written
    dist.destroy_process_group()


# -- 5. snapshots that no longer match -------------------------------------------------------------------------------

#: The model's layer: ``weight`` is (OUT, IN); the mismatched one is WRONG.
IN, OUT, WRONG = 3, 5, (7, 11)


def _train_step(grid: Any, model: torch.nn.Linear, optimizer: Any) -> None:
    model.zero_grad()
    model(torch.ones(2, IN)).sum().backward()
    for parameter in model.parameters():
        grid.all_reduce(parameter.grad, "dp")
    optimizer.step()


def mismatched_snapshots(victim: int) -> dict[str, Any]:
    """Steps 0 and 1 snapshotted; ``victim`` SIGKILLs itself in step 1; every survivor replaces the weight with
    one of another shape and shrinks with its snapshots (refused), then puts the weight back and shrinks again."""
    torch.manual_seed(0)
    model = torch.nn.Linear(IN, OUT)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    snapshots = StepSnapshots(model, optimizer)
    grid = HyperCommGrid([1, dist.get_world_size()], ["tp", "dp"], group_options={"timeout": GROUP_TIMEOUT})
    grid.create_pgs(["tp", "dp"])
    seen: dict[str, Any] = {"rank": dist.get_rank()}
    snapshots.take(0)
    _train_step(grid, model, optimizer)
    snapshots.take(1)
    at_step_1 = model.weight.detach().clone()
    try:
        if dist.get_rank() == victim:
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(0.2)
        _train_step(grid, model, optimizer)
        seen["error"] = {"type": "a step went through with a dead rank"}
        return seen
    except RankFailure as failure:
        seen["caught"] = list(failure.dead)
    right = model.weight
    model.weight = torch.nn.Parameter(torch.zeros(*WRONG))
    began = time.monotonic()
    try:
        grid.shrink(dim="dp", policy="drop", snapshots=snapshots)
        seen["refused"] = {"type": None, "seconds": time.monotonic() - began}
    except BaseException as error:
        seen["refused"] = _raised(error, began)
    model.weight = right
    with torch.no_grad():
        right.add_(1.0)  # as if part of the failed step had been applied: the shrink must undo it
    try:
        regrid = grid.shrink(dim="dp", policy="drop", snapshots=snapshots)
        seen["step"] = regrid.step
        seen["dead"] = list(regrid.dead)
        seen["restored"] = bool(torch.equal(model.weight.detach(), at_step_1))
        seen["sums"] = _step(regrid.grid)
        seen["world"] = dist.get_world_size()
    except BaseException as error:
        seen["retry"] = _raised(error)
    return seen


# -- 6. a fenced rank under spawn(allow_deaths=True) -----------------------------------------------------------------


def stopped_then_fenced(victim: int, folder: str) -> dict[str, Any]:
    """``victim`` SIGSTOPs itself inside a step (its pid in ``<folder>/pid``); the others catch RankFailure, shrink,
    and rank 0 then SIGCONTs it; the survivors finish a step on the new grid. The resumed rank's next grid call
    raises (FencedError): it is not caught here, as a training script would not catch it."""
    grid = HyperCommGrid([1, dist.get_world_size()], ["tp", "dp"], group_options={"timeout": GROUP_TIMEOUT})
    grid.create_pgs(["tp", "dp"])
    _step(grid)
    rank = dist.get_rank()
    seen: dict[str, Any] = {"rank": rank}
    try:
        if rank == victim:
            Path(folder, "pid").write_text(str(os.getpid()))
            os.kill(os.getpid(), signal.SIGSTOP)
            time.sleep(0.5)  # resumed: the others' world moved on
            _step(grid)  # raises FencedError
            return {"rank": rank, "error": "the resumed rank got a result of the old world"}
        time.sleep(0.3)  # the victim stops while the others are in their collectives
        _step(grid)
        seen["error"] = "a step went through with a stopped rank"
        return seen
    except RankFailure as failure:
        if rank == victim:
            raise
        seen["caught"] = list(failure.dead)
    regrid = grid.shrink(dim="dp", policy="drop")
    seen["dead"] = list(regrid.dead)
    if rank == 0:
        os.kill(int(Path(folder, "pid").read_text()), signal.SIGCONT)
    seen["sums"] = _step(regrid.grid)
    seen["world"] = dist.get_world_size()
    return seen
