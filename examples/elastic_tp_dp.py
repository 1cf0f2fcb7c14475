"""Train tp x dp through a SIGKILL under ``python -m hypergrid.run``: every survivor resumes at one agreed step.

    python -m hypergrid.run --standalone --nproc-per-node 4 [--replace-dead] examples/elastic_tp_dp.py \\
        [--tp 2] [--steps 12] [--spares 0] [--pause 0] [--report FILE] [--kill RANK:STEP:POINT[+MS][,...]] [--regrow]

A model of two tensor-parallel MLP blocks (column- then row-parallel over
``tp``: the autograd mappings ``copy_to`` and ``reduce_from``), the global batch
of 840 samples split over ``dp``, gradients averaged over ``dp`` with
``grid.average_gradients``, Adam, run by `hypergrid.ElasticLoop`: the script
gives the grid, a set-up (this rank's shard and its optimizer) and a step; the
loop creates the families, keeps every step's start, and when a rank dies
(in set-up, in a step, at the finish line) shrinks along ``dp``, drafts a spare
(``--spares K``: the last K ranks wait) or drops the dead rank's slice, brings
every rank to the agreed step with the agreed state and carries on.

Kill a worker from another shell: every rank prints its pid first; slow the
steps down so that there is time, and SIGKILL one of them while it trains::

    python -m hypergrid.run --standalone --nproc-per-node 4 examples/elastic_tp_dp.py --steps 40 --pause 0.25
    # rank 3 of 4: pid 12345 ...           (in another shell:)
    kill -9 12345

``--kill RANK:STEP:POINT[+MS]`` makes rank RANK SIGKILL itself at POINT of
step STEP (first attempt of the job only), MS milliseconds later when given (a
timer thread: the death lands inside whatever runs then). Several specs, comma-separated,
kill several times; ``RANK.K`` names the K-th replacement started in place of rank RANK, and a STEP
``gN`` is N steps after the rank first saw the grid grow back, and ``s`` is the set-up, whose points are
``start`` (before the loop creates the families: ``+MS`` lands inside their creation) and ``setup`` (inside the
set-up function, before it builds the model). Points, in a step's
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

**Growing back** (the launcher's ``--replace-dead``): a rank whose dp slice
``"drop"`` removed does not exit; it waits to come back. The launcher starts a
new worker in place of the dead one (``HYPERGRID_ARRIVAL=1``: the loop joins the
running job instead of initializing); its arrival wakes the others, the loop
takes both in, and the job ends on its original shape, every replica at the
agreed step (``--regrow`` makes a dropped rank wait under any launcher)::

    python -m hypergrid.run --standalone --nproc-per-node 6 --replace-dead examples/elastic_tp_dp.py \\
        --steps 40 --pause 0.2 --kill 3:4:average
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
        if step == "s":  # set-up: before the first step
            return self.step_now < 0
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


def train(args: argparse.Namespace) -> dict[str, Any]:
    """The job on `hypergrid.ElasticLoop`: train, recover (and grow back under ``--replace-dead``), compare; this
    rank's outcome."""
    arriving = os.environ.get("HYPERGRID_ARRIVAL") == "1"  # started in place of a dead worker (--replace-dead)
    first_rank = int(os.environ["RANK"]) if arriving else dist.get_rank()
    hook = Killer(args.kill, first_rank, arriving)

    def setup(grid: Any) -> tuple[Model, Any]:  # this rank's shard (a drafted spare's gets a replica's values)
        hook("setup")
        model = Model(args.tp, grid.my_coord().tp)
        return model, torch.optim.Adam(model.parameters(), lr=LR)

    def step(grid: Any, state: tuple[Model, Any], step: int) -> float:
        hook.step_now = step
        loss = train_step(grid, *state, step, hook)
        if dist.get_rank() == 0 and not args.quiet:
            print(f"step {step}: loss {loss:.6f} on {dict(zip(grid.dim_names, grid.shape))}", flush=True)
        time.sleep(args.pause)
        hook("end")
        return loss

    def changed(change: Any) -> None:
        if change.arrived:
            hook.grew(change.step)

    loop = hypergrid.ElasticLoop(
        [args.tp, -1],
        ["tp", "dp"],
        steps=args.steps,
        spares=args.spares,
        families=["tp", "dp"],
        grid_options={"group_options": {"timeout": datetime.timedelta(seconds=600)}},
        regrow=True if args.regrow else None,
        on_change=changed,
        verbose=not args.quiet,
    )
    hook("start")
    result = loop.run(setup, step)
    history = result.history
    outcome: dict[str, Any] = {
        "first_rank": first_rank,
        "resumed": [change.step for change in history],
        "dead": list(history[-1].dead) if history else [],
        "grew": sum(1 for change in history if change.arrived),
    }
    if result.released:
        return {**outcome, "spare": "released"}
    if result.retired:
        return {**outcome, "retired": True}
    model = result.state[0]
    digest = hashlib.sha256()
    for param in model.parameters():
        digest.update(param.detach().contiguous().numpy().tobytes())
    worst = compare(model, one_process(args.steps), args.tp, result.coord.tp)
    return {**outcome, "rank": result.rank, "tp": result.coord.tp, "dp": result.coord.dp, "step": result.step,
            "shape": result.shape, "weights_sha256": digest.hexdigest(), "max_abs_vs_one_process": worst,
            "world": result.world, "replicas_equal": result.replicas_equal}  # fmt: skip


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
    if os.environ.get("HYPERGRID_ARRIVAL") != "1":  # (one started in place of a dead worker joins the running job)
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
