"""Train tp x dp through a SIGKILL under ``python -m hypergrid.run``: every survivor resumes at one agreed step.

    python -m hypergrid.run --standalone --nproc-per-node 4 [--replace-dead] examples/elastic_tp_dp.py \\
        [--tp 2] [--steps 12] [--spares 0] [--pause 0] [--report FILE] [--kill RANK:STEP:POINT[+MS][,...]] [--regrow]

A model of two tensor-parallel MLP blocks (column- then row-parallel over
``tp``: the autograd mappings ``copy_to`` and ``reduce_from``), the global batch
of 840 samples split over ``dp``, gradients averaged over ``dp`` with
``grid.average_gradients``, Adam. Every step begins with
``snapshots.take(step)``; when a rank dies, every survivor's grid call raises
``RankFailure``, and ``grid.shrink(..., snapshots=snapshots)`` re-forms the
grid, agrees on the step to resume from (the lowest any survivor was in: a
collective that did not involve the dead rank may have let some replicas finish
the step) and puts the model and the optimizer of every rank at that step's
start. With ``--spares K`` the last K ranks wait in ``grid.standby``; a drafted
spare gets the state from a replica of its tp shard and says so (its new rank
and coordinates, the agreed step). The loop ends with a
barrier over the whole grid, inside the same ``try``, so that nobody leaves
while another still recovers.

Kill a worker from another shell: every rank prints its pid first; slow the
steps down so that there is time, and SIGKILL one of them while it trains::

    python -m hypergrid.run --standalone --nproc-per-node 4 examples/elastic_tp_dp.py --steps 40 --pause 0.25
    # rank 3 of 4: pid 12345 ...           (in another shell:)
    kill -9 12345

``--kill RANK:STEP:POINT[+MS]`` makes rank RANK SIGKILL itself at POINT of
step STEP (first attempt of the job only), MS milliseconds later when given (a
timer thread: the death lands inside whatever runs then). Several specs, comma-separated,
kill several times; ``RANK.K`` names the K-th replacement started in place of rank RANK, and a STEP
``gN`` is N steps after the rank first saw the grid grow back. Points, in a step's
order: ``begin``, ``forward`` (before the forward's tp all-reduce), ``backward``
(before the backward's tp all-reduce), ``average`` (before the dp gradient
average), ``optimizer`` (before Adam's update), ``loss`` (before the loss's dp
all-reduce), ``end`` (after the step, before the next).

At the end every surviving rank compares its parameters with the same
training in one process (the whole batch every step) and prints one line;
with ``--report FILE`` it appends one JSON line to FILE: ``rank``, ``tp`` and
``dp`` (its coordinates), ``step``, ``weights_sha256`` (over its parameters, in
order), ``max_abs_vs_one_process``, ``world`` (the final world's size),
``grew`` (how many times this rank saw the grid grow back), and how it got
there.

**Growing back** (``--regrow``, with the launcher's ``--replace-dead``): a rank
whose dp slice ``"drop"`` removed does not exit; it waits in ``grid.arrive``
to come back. The launcher starts a new worker in place of the dead one
(``HYPERGRID_ARRIVAL=1``: it builds the grid and calls ``grid.arrive``); its
arrival ends the others' waits, their ``shrink`` takes both in, and the job
ends on its original shape, every replica at the agreed step::

    python -m hypergrid.run --standalone --nproc-per-node 6 --replace-dead examples/elastic_tp_dp.py \\
        --regrow --steps 40 --pause 0.2 --kill 3:4:average
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
import signal
import threading
import time
from typing import Any

import torch
import torch.distributed as dist

import hypergrid
from hypergrid.autograd import copy_to, reduce_from

FEATURES, HIDDEN, BATCH, LR = 8, 16, 840, 0.01  # 840: every dp size from 1 to 8 divides the batch
POINTS = ("begin", "forward", "backward", "average", "optimizer", "loss", "end")


def global_batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The same global batch on every rank, whatever the grid (the data loader's job)."""
    generator = torch.Generator().manual_seed(step)
    x = torch.randn(BATCH, FEATURES, generator=generator, dtype=torch.float64)
    return x, torch.sin(x.roll(1, dims=1) * 1.5)


class Block(torch.nn.Module):
    """A Megatron MLP block: column-parallel ``up`` (over ``tp``), row-parallel ``down``; ``tp=1``: the whole block."""

    def __init__(self, tp: int, tp_rank: int, seed: int) -> None:
        super().__init__()
        generator = torch.Generator().manual_seed(seed)
        up = torch.randn(FEATURES, HIDDEN, generator=generator, dtype=torch.float64) / FEATURES**0.5
        down = torch.randn(HIDDEN, FEATURES, generator=generator, dtype=torch.float64) / HIDDEN**0.5
        width = HIDDEN // tp
        columns = slice(tp_rank * width, (tp_rank + 1) * width)
        self.up = torch.nn.Parameter(up[:, columns].clone())
        self.up_bias = torch.nn.Parameter(torch.zeros(width, dtype=torch.float64))
        self.down = torch.nn.Parameter(down[columns, :].clone())
        self.down_bias = torch.nn.Parameter(torch.zeros(FEATURES, dtype=torch.float64))

    def forward(self, x: torch.Tensor, grid: Any = None, hook: Any = None) -> torch.Tensor:
        if grid is not None:
            x = copy_to(x, grid, "tp")  # backward: the all-reduce of x's gradient over tp
        partial = torch.relu(x @ self.up + self.up_bias) @ self.down
        if grid is not None:
            hook("forward")
            partial = reduce_from(partial, grid, "tp")
        return partial + self.down_bias


class Model(torch.nn.Module):
    def __init__(self, tp: int, tp_rank: int) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList([Block(tp, tp_rank, seed) for seed in (11, 12)])

    def forward(self, x: torch.Tensor, grid: Any = None, hook: Any = None) -> torch.Tensor:
        for block in self.blocks:
            x = block(x, grid, hook)
        return x


def train_step(grid: Any, model: Model, optimizer: Any, step: int, hook: Any) -> float:
    """One step: this rank's tp shard on its dp slice of the global batch; returns the global batch's loss."""
    hook("begin")
    me, dp = grid.my_coord(), grid.group_size("dp")
    x, y = global_batch(step)
    rows = slice(me.dp * BATCH // dp, (me.dp + 1) * BATCH // dp)
    loss = ((model(x[rows], grid, hook) - y[rows]) ** 2).mean()
    hook("backward")
    loss.backward()  # the second block's copy_to all-reduces its input's gradient over tp
    hook("average")
    grid.average_gradients(model, "dp")  # each replica's mean over its rows -> the global batch's mean
    hook("optimizer")
    optimizer.step()
    optimizer.zero_grad()
    total = loss.detach().reshape(1)
    hook("loss")
    grid.all_reduce(total, "dp")
    return total.item() / dp


def one_process(steps: int) -> Model:
    """The same training in one process (the whole batch every step): what every survivor must hold."""
    model = Model(1, 0)
    optimizer = torch.optim.Adam(model.parameters(), lr=LR)
    for step in range(steps):
        x, y = global_batch(step)
        ((model(x) - y) ** 2).mean().backward()
        optimizer.step()
        optimizer.zero_grad()
    return model


def compare(model: Model, reference: Model, tp: int, tp_rank: int) -> float:
    """The largest difference between this rank's shard and the same slice of the one-process model."""
    width = HIDDEN // tp
    columns = slice(tp_rank * width, (tp_rank + 1) * width)
    worst = 0.0
    for mine, whole in zip(model.blocks, reference.blocks):
        pairs = [(mine.up, whole.up[:, columns]), (mine.up_bias, whole.up_bias[columns]),
                 (mine.down, whole.down[columns, :]), (mine.down_bias, whole.down_bias)]  # fmt: skip
        worst = max(worst, *((a.detach() - b.detach()).abs().max().item() for a, b in pairs))
    return worst


class Killer:
    """``--kill SPEC[,SPEC...]``, each ``RANK:STEP:POINT[+MS]``: this rank SIGKILLs itself there, once (first attempt
    of the job only). ``RANK`` is the launcher's rank of a worker the job started; ``RANK.K`` the K-th replacement
    started in its place (``--replace-dead``). ``STEP`` ``gN``: N steps after this rank first saw the grid grow back."""

    def __init__(self, specs: str, rank: int, arriving: bool) -> None:
        self.step_now = -1
        self.grown_at: int | None = None  # the step this rank resumed at when it first saw the grid grow back
        self.at: list[tuple[str, str, float | None]] = []  # (step, point, delay in ms)
        me = os.environ.get("HYPERGRID_MEMBER", "") if arriving else str(rank)  # (a replacement's: "3.1")
        if os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") != "0":
            return
        for spec in filter(None, specs.split(",")):
            who, step, point = spec.split(":")
            point, _, delay = point.partition("+")
            if who == me:
                self.at.append((step, point, float(delay) if delay else None))

    def grew(self, step: int) -> None:
        if self.grown_at is None:
            self.grown_at = step

    def _now(self, step: str) -> bool:
        if step.startswith("g"):
            return self.grown_at is not None and self.step_now == self.grown_at + int(step[1:])
        return self.step_now == int(step)

    def __call__(self, point: str) -> None:
        for at in self.at:
            if at[1] != point or not self._now(at[0]):
                continue
            self.at.remove(at)  # once
            if at[2] is None:
                os.kill(os.getpid(), signal.SIGKILL)
            threading.Timer(at[2] / 1000, os.kill, (os.getpid(), signal.SIGKILL)).start()
            return


def wait_to_join(grid: Any, snapshots: Any, arriving: bool, wake: bool = True) -> tuple[Any, Any] | None:
    """A spare (``standby``) or a process that arrived (``arrive``) waits until a shrink takes it in; its grid and
    the regrid (None: the job ended without it). One that arrives may be taken in as a spare: it waits on."""
    regrid = grid.arrive(snapshots=snapshots, wake_ranks=wake) if arriving else grid.standby(snapshots=snapshots)
    while regrid is not None and not regrid.grid.layout.contains(regrid.rank):
        regrid = regrid.grid.standby(snapshots=snapshots)
    return None if regrid is None else (regrid.grid, regrid)


def train(args: argparse.Namespace) -> dict[str, Any]:
    """The job: train, recover (and grow back with ``--regrow``), compare; this rank's outcome."""
    arriving = os.environ.get("HYPERGRID_ARRIVAL") == "1"  # started in place of a dead worker (--replace-dead)
    world = int(os.environ["WORLD_SIZE"]) if arriving else dist.get_world_size()
    first_rank = int(os.environ["RANK"]) if arriving else dist.get_rank()
    grid = hypergrid.HyperCommGrid(
        [args.tp, (world - args.spares) // args.tp],
        ["tp", "dp"],
        spares=args.spares,
        group_options={"timeout": datetime.timedelta(seconds=600)},
    )
    if not arriving:
        grid.create_pgs(["tp", "dp", ["tp", "dp"]])
    in_grid = not arriving and grid.is_current_rank_in_grid()
    model = Model(args.tp, grid.my_coord().tp if in_grid else 0)  # (one that joins later gets its shard's state)
    optimizer = torch.optim.Adam(model.parameters(), lr=LR)
    hook = Killer(args.kill, first_rank, arriving)
    policy = "spares_then_drop" if args.spares else "drop"
    outcome: dict[str, Any] = {"first_rank": first_rank, "failed_in": [], "resumed": [], "dead": [], "grew": 0}

    # -- the recipe of docs/elastic.md --------------------------------------------------------------------------
    snapshots = hypergrid.StepSnapshots(model, optimizer)  # the state at the start of the last two steps
    step, retired = 0, False
    if not in_grid:  # a spare, or a process that arrives: wait until a shrink takes it in (None: the job ended)
        joined = wait_to_join(grid, snapshots, arriving)
        if joined is None:
            return {**outcome, "spare": "released"}
        grid, regrid = joined
        step = regrid.step
        outcome.update(resumed=[step], dead=list(regrid.dead), grew=int(bool(regrid.arrived)))
        if regrid.arrived:
            hook.grew(step)
        if not args.quiet:
            me = grid.my_coord()
            print(f"rank {first_rank}: spare drafted as rank {dist.get_rank()} (tp {me.tp}, dp {me.dp}) in place of"
                  f" dead {list(regrid.dead)}; resuming at step {step} on {dict(zip(grid.dim_names, grid.shape))}",
                  flush=True)  # fmt: skip
    while step <= args.steps:  # step == steps: the finish line, crossed together
        try:
            snapshots.take(step)  # this step's start
            hook.step_now = step
            if step == args.steps:
                grid.barrier(["tp", "dp"])  # nobody leaves while another still recovers
            else:
                loss = train_step(grid, model, optimizer, step, hook)
                if dist.get_rank() == 0 and not args.quiet:
                    print(f"step {step}: loss {loss:.6f} on {dict(zip(grid.dim_names, grid.shape))}", flush=True)
                time.sleep(args.pause)
            step += 1
            hook("end")
        except hypergrid.RankFailure as failure:  # failure.dead: named by the world's roll call
            was = step
            outcome["failed_in"].append(was)
            regrid = grid.shrink(dead=failure.dead or None, dim="dp", policy=policy, snapshots=snapshots)
            if regrid.retired and args.regrow:  # its dp slice was removed: it waits to come back (--regrow)
                joined = wait_to_join(grid, snapshots, True, wake=False)  # (waking nobody: it was just there)
                if joined is None:
                    retired = True
                    break
                grid, regrid = joined
            elif regrid.retired:
                retired = True
                break  # this rank's dp slice was removed: it may exit
            grid, step = regrid.grid, regrid.step  # every survivor at this step, model and optimizer restored
            outcome["grew"] += int(bool(regrid.arrived))  # processes joined: the grid grew back
            if regrid.arrived:
                hook.grew(step)
            outcome["resumed"].append(step)
            outcome["dead"] = list(regrid.dead)
            if not args.quiet:
                print(f"rank {first_rank} (now {dist.get_rank()}): RankFailure in step {was}, dead {list(regrid.dead)};"
                      f" shrink took {sum(regrid.seconds.values()):.2f} s; resuming at step {step} on "
                      f"{dict(zip(grid.dim_names, grid.shape))}", flush=True)  # fmt: skip
    # -----------------------------------------------------------------------------------------------------------
    if retired:
        if not args.quiet:
            print(f"rank {first_rank}: retired (its dp slice was dropped)", flush=True)
        return {**outcome, "retired": True}
    grid.release_spares()
    me = grid.my_coord()
    digest = hashlib.sha256()
    for param in model.parameters():
        digest.update(param.detach().contiguous().numpy().tobytes())
    worst = compare(model, one_process(args.steps), args.tp, me.tp)
    return {**outcome, "rank": dist.get_rank(), "tp": me.tp, "dp": me.dp, "step": snapshots.step,
            "shape": dict(zip(grid.dim_names, grid.shape)), "weights_sha256": digest.hexdigest(),
            "max_abs_vs_one_process": worst, "world": dist.get_world_size()}  # fmt: skip


def parser() -> argparse.ArgumentParser:
    parse = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parse.add_argument("--tp", type=int, default=2)
    parse.add_argument("--steps", type=int, default=12)
    parse.add_argument("--spares", type=int, default=0)
    parse.add_argument("--pause", type=float, default=0.0, help="seconds each step waits (time to kill a rank)")
    parse.add_argument("--report", default="")
    parse.add_argument("--kill", default="", help="RANK:STEP:POINT[+MS][,...] (RANK.K: its K-th replacement)")
    parse.add_argument("--regrow", action="store_true", help="a retired rank waits to come back (grid.arrive)")
    parse.add_argument("--quiet", action="store_true")
    return parse


def main() -> int:
    args = parser().parse_args()
    if os.environ.get("HYPERGRID_ARRIVAL") == "1":  # started in place of a dead worker: it joins the running job
        print(f"rank {os.environ['RANK']} arrives to join: pid {os.getpid()}", flush=True)
    else:
        hypergrid.init_from_env(timeout_s=120)
        print(f"rank {dist.get_rank()} of {dist.get_world_size()}: pid {os.getpid()}", flush=True)
    outcome = train(args)
    if "rank" in outcome:
        print(f"rank {outcome['rank']} (tp {outcome['tp']}, dp {outcome['dp']}): step {outcome['step']}, "
              f"weights {outcome['weights_sha256'][:12]}, max |w - one process| "
              f"{outcome['max_abs_vs_one_process']:.1e}", flush=True)  # fmt: skip
    if args.report and "rank" in outcome:
        with open(args.report, "a") as out:
            out.write(json.dumps(outcome) + "\n")
    if dist.is_initialized():
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
