"""Growing back with real processes: members train tp x dp, ranks die, arrivals join (tests/grid/test_regrow.py).

Run as ``python -m tests.workers.regrow [flags]`` by the test, one process per member (``env://``: the test hosts
the store, ``TORCHELASTIC_USE_AGENT_STORE=True``) and one per arrival (``HYPERGRID_ARRIVAL=1``: it builds the grid
as the members did and calls ``grid.arrive``). A linear model, its weight vector sharded over ``tp``, the batch
split over ``dp``, plain gradient descent with hand-written gradients, in float64: every rank ends comparing its
shard with the same training in one process. Each process appends one JSON line to ``--report``.

Faults: ``--kill RANK:STEP:POINT`` (the member of first rank RANK SIGKILLs itself at POINT of STEP), ``--kill-in-grow
RANK`` (the member SIGKILLs itself while the world forms with an arrival: inside torch's rendezvous),
``--arrival-dies POINT`` (the arrival ``os._exit``s at ``drafted``, ``forming`` or ``families``).
"""

from __future__ import annotations

import argparse
import faulthandler
import functools
import hashlib
import json
import os
import signal
import time
from typing import Any

import torch
import torch.distributed as dist

import hypergrid
from hypergrid.grid import arrival, recovery

FEATURES, BATCH, LR = 8, 96, 0.05
#: When the process started (``HYPERGRID_BENCH_T0``, set by whoever started it: benchmarks/regrow.py) and when its
#: imports (torch, hypergrid) were done: the benchmark's first phase.
STARTED, IMPORTED = float(os.environ.get("HYPERGRID_BENCH_T0", "0")) or time.time(), time.time()


def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(1000 + step)
    x = torch.randn(BATCH, FEATURES, generator=generator, dtype=torch.float64)
    return x, x.sum(dim=1, keepdim=True).sin()


def one_process(steps: int) -> torch.Tensor:
    w = torch.zeros(FEATURES, 1, dtype=torch.float64)
    for step in range(steps):
        x, y = batch(step)
        w -= LR * 2 * x.T @ (x @ w - y) / BATCH
    return w


#: Where ``--kill`` may strike, in a step's order.
POINTS = ("begin", "tp", "dp", "end")


def train_step(grid: Any, w: torch.Tensor, step: int, hook: Any) -> None:
    me, tp, dp = grid.my_coord(), grid.group_size("tp"), grid.group_size("dp")
    x, y = batch(step)
    rows = slice(me.dp * BATCH // dp, (me.dp + 1) * BATCH // dp)
    cols = slice(me.tp * FEATURES // tp, (me.tp + 1) * FEATURES // tp)
    xs = x[rows, cols]
    prediction = xs @ w
    hook("tp")
    grid.all_reduce(prediction, "tp")
    gradient = 2 * xs.T @ (prediction - y[rows]) / BATCH  # this replica's rows' share of the batch's mean
    hook("dp")
    grid.all_reduce(gradient, "dp")
    w -= LR * gradient
    hook("end")


def _die_at(point: str) -> None:
    """The arrival ends itself (``os._exit``) when it reaches ``point`` while it joins: ``drafted`` (it read its
    draft), ``forming`` (torch's rendezvous of the new world) or ``families`` (their creation, the world formed)."""
    if point == "stopped":  # it SIGSTOPs itself inside torch's rendezvous instead (the test resumes it)
        original = recovery.reform_world

        def stop_then_form(*args: Any, **kwargs: Any) -> Any:
            os.kill(os.getpid(), signal.SIGSTOP)
            return original(*args, **kwargs)

        recovery.reform_world = stop_then_form  # type: ignore[assignment]
        return
    name = {"drafted": "Intake", "forming": "reform_world", "families": "recreate"}[point]
    if name == "Intake":
        arrival.Intake = _exit_on_call  # type: ignore[misc,assignment]  # (built as it reads its draft)
    else:
        setattr(recovery, name, _exit_on_call)


def _exit_on_call(*args: Any, **kwargs: Any) -> Any:
    os._exit(3)


def _kill_in_grow() -> None:
    """This member SIGKILLs itself while a world forms with an arrival in it (inside torch's rendezvous)."""
    original_reform, original_form = recovery.reform_world, recovery.Recovery._form
    arrived = [False]

    def reform(*args: Any, **kwargs: Any) -> Any:
        if arrived[0]:
            os.kill(os.getpid(), signal.SIGKILL)
        return original_reform(*args, **kwargs)

    def form(self: Any, plan: Any, *args: Any, **kwargs: Any) -> Any:
        arrived[0] = bool(plan.arrived)
        return original_form(self, plan, *args, **kwargs)

    recovery.reform_world = reform  # type: ignore[assignment]
    recovery.Recovery._form = form  # type: ignore[method-assign]


def _strike(kill: str, first: int, step: int, point: str) -> None:
    """``--kill RANK:STEP:POINT``: the member of first rank RANK SIGKILLs itself at POINT of STEP."""
    if kill:
        rank, at, where = kill.split(":")
        if int(rank) == first and int(at) == step and where == point:
            os.kill(os.getpid(), signal.SIGKILL)


def settle(grid: Any, regrid: Any, snapshots: Any, seen: dict[str, Any]) -> tuple[Any, int] | None:
    """Where a regrid left this process: in the grid (its grid and step), or a spare: it waits in standby."""
    while not regrid.grid.layout.contains(regrid.rank):
        seen["spare"] = True
        regrid = regrid.grid.standby(snapshots=snapshots)
        if regrid is None:
            return None
    return regrid.grid, regrid.step


def run(args: argparse.Namespace, grid: Any, w: torch.Tensor, snapshots: Any, step: int, seen: dict[str, Any]) -> Any:
    first = seen["first_rank"]  # (RANK follows the world a shrink forms: not the launcher's any more)
    while step <= args.steps:
        try:
            snapshots.take(step)
            if step == args.steps:
                grid.barrier(["tp", "dp"])  # nobody leaves while another recovers
                step += 1
                continue
            hook = functools.partial(_strike, args.kill if not seen["arrival"] else "", first, step)
            hook("begin")
            if args.grow_at == step and not seen["grew"]:  # (once: not again on those it took in)
                seen["grew_by_call"] = True
                regrid = grid.grow(snapshots=snapshots)
                grid, step = regrid.grid, regrid.step
                seen["grew"] += bool(regrid.arrived)
                continue
            train_step(grid, w, step, hook)
            if "first_full_step" not in seen["timings"] and grid.size == args.tp * seen["dp0"]:
                seen["timings"]["first_full_step"] = time.time()  # (an arrival's first step at the full shape)
            time.sleep(args.pause)
            step += 1
        except hypergrid.RankFailure as failure:
            regrid = grid.shrink(failure.dead or None, dim="dp", policy=args.policy, snapshots=snapshots)
            seen["shrinks"].append(list(regrid.dead))
            if regrid.retired:  # its dp slice was dropped: it waits to come back (without waking anyone)
                seen["retired"] = seen.get("retired", 0) + 1
                regrid = grid.arrive(120, snapshots=snapshots, wake_ranks=False)
                if regrid is None:
                    return None
            if regrid.arrived:  # the growth's phases, as this member saw them
                seen["timings"]["grow_seconds"] = dict(regrid.seconds)
            settled = settle(grid, regrid, snapshots, seen)
            if settled is None:
                return None
            grid, step = settled
            seen["grew"] += bool(regrid.arrived)
    return grid


def main() -> int:
    parse = argparse.ArgumentParser()
    parse.add_argument("--tp", type=int, default=2)
    parse.add_argument("--steps", type=int, default=8)
    parse.add_argument("--spares", type=int, default=0)
    parse.add_argument("--policy", default="drop")
    parse.add_argument("--kill", default="")
    parse.add_argument("--kill-in-grow", type=int, default=-1)
    parse.add_argument("--arrival-dies", default="")
    parse.add_argument("--grow-at", type=int, default=-1)
    parse.add_argument("--no-wake", action="store_true")
    parse.add_argument("--pause", type=float, default=0.0, help="seconds each step waits (an arrival's time)")
    parse.add_argument("--restart-from", default="", help="a checkpoint (the whole weight vector) to start from")
    parse.add_argument("--restart-step", type=int, default=0, help="with --restart-from: the step it holds")
    parse.add_argument("--report", required=True)
    args = parse.parse_args()
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # (a hung test dumps every stack)
    arriving = os.environ.get("HYPERGRID_ARRIVAL") == "1"
    size = int(os.environ["WORLD_SIZE"])
    seen: dict[str, Any] = {"first_rank": int(os.environ["RANK"]), "arrival": arriving, "grew": 0, "shrinks": []}
    seen["grew_by_call"] = False
    shape = [args.tp, (size - args.spares) // args.tp]
    seen["dp0"], seen["timings"] = shape[1], {"started": STARTED, "imported": IMPORTED}
    if not arriving:
        hypergrid.init_from_env(timeout_s=120)
        seen["timings"]["initialized"] = time.time()
    grid = hypergrid.HyperCommGrid(shape, ["tp", "dp"], spares=args.spares)
    w = torch.zeros(FEATURES // args.tp, 1, dtype=torch.float64)
    snapshots = hypergrid.StepSnapshots(w)
    step = 0
    if arriving:
        if args.arrival_dies:
            _die_at(args.arrival_dies)
        seen["timings"]["arrive"] = time.time()
        try:
            regrid = grid.arrive(120, snapshots=snapshots, wake_ranks=not args.no_wake)
        except hypergrid.FencedError as error:  # (it was stopped while it joined: the others went on)
            seen.update(raised=type(error).__name__, said=str(error)[:300])
            _write(args.report, seen)
            return 0
        seen["timings"]["arrived"] = time.time()
        if regrid is not None:
            seen["timings"]["seconds"] = dict(regrid.seconds)
        if regrid is None:
            seen["released"] = True
            _write(args.report, seen)
            return 0
        seen["grew"] = 1
        settled = settle(grid, regrid, snapshots, seen)
        if settled is None:
            seen["released"] = True
            _write(args.report, seen)
            return 0
        grid, step = settled
    else:
        grid.create_pgs(["tp", "dp", ["tp", "dp"]])  # (the last: the final barrier's, spares in the world)
        seen["timings"]["created"] = time.time()
        if args.restart_from:  # a restart of the whole job from a checkpoint (benchmarks/regrow.py's contrast)
            me = grid.my_coord()
            w.copy_(torch.load(args.restart_from)[me.tp * (FEATURES // args.tp) : (me.tp + 1) * (FEATURES // args.tp)])
            seen["timings"]["loaded"] = time.time()
            step = args.restart_step
        if args.kill_in_grow == int(os.environ["RANK"]):
            _kill_in_grow()
        if not grid.is_current_rank_in_grid():
            regrid = grid.standby(snapshots=snapshots)
            if regrid is None:
                seen["released"] = True
                _write(args.report, seen)
                return 0
            grid, step = regrid.grid, regrid.step
    final = run(args, grid, w, snapshots, step, seen)
    if final is None:
        seen["released"] = True
    else:
        final.release_spares()
        me = final.my_coord()
        tp = final.group_size("tp")
        cols = slice(me.tp * FEATURES // tp, (me.tp + 1) * FEATURES // tp)
        seen.update(
            rank=dist.get_rank(),
            world=dist.get_world_size(),
            shape=list(final.shape),
            tp=me.tp,
            dp=me.dp,
            step=snapshots.step,
            weights_sha256=hashlib.sha256(w.numpy().tobytes()).hexdigest(),
            max_abs_vs_one_process=(w - one_process(args.steps)[cols]).abs().max().item(),
        )
    _write(args.report, seen)
    if dist.is_initialized():
        dist.destroy_process_group()
    return 0


def _write(path: str, seen: dict[str, Any]) -> None:
    with open(path, "a") as out:
        out.write(json.dumps(seen) + "\n")


if __name__ == "__main__":
    raise SystemExit(main())
