"""Train through a SIGKILL nobody names: a tensor-parallel MLP on tp=2 x dp=4, 8 local CPU processes.

    python examples/elastic_train.py [--steps 8] [--kill-rank 5] [--kill-step 3]

A two-layer MLP, column-parallel then row-parallel over ``tp`` (the autograd
mappings ``copy_to`` and ``reduce_from``), the global batch of 24 samples split
over ``dp``, gradients averaged over ``dp`` with ``grid.average_gradients``,
plain SGD. The groups' timeout is 600 s, as in production. At step
``--kill-step`` rank ``--kill-rank`` SIGKILLs itself. Nobody names it: its
tensor-parallel partner sees the failure in its collective, the world's roll
call (every rank's watcher) names the dead rank within about half a second,
and every survivor's collectives end with ``RankFailure(dead=[5])``. The
survivors call ``grid.shrink(dead=failure.dead or None)`` (``policy="drop"``:
the dead rank's dp slice goes, dp 4 -> 3, its tp partner retires), restore the
weights from the start of the failed step and finish on the new grid with the
same global batch. Rank 0 prints every step's loss and the recovery, from the
SIGKILL to the first step that completed on the new grid; at the end it checks
the weights against the same training in one process.
"""

from __future__ import annotations

import argparse
import datetime
import os
import signal
import sys
import time

import torch
import torch.distributed as dist

import hypergrid
from hypergrid.autograd import copy_to, reduce_from

FEATURES, HIDDEN, BATCH, LR = 6, 8, 24, 0.1


def global_batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The same global batch on every rank, whatever the grid: the data loader's job."""
    generator = torch.Generator().manual_seed(step)
    x = torch.randn(BATCH, FEATURES, generator=generator, dtype=torch.float64)
    return x, torch.sin(x.sum(dim=1, keepdim=True))


def initial_weights() -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(1234)
    w1 = torch.randn(FEATURES, HIDDEN, generator=generator, dtype=torch.float64) / FEATURES**0.5
    return w1, torch.randn(HIDDEN, 1, generator=generator, dtype=torch.float64) / HIDDEN**0.5


def step_loss(
    x: torch.Tensor, y: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, grid: object = None
) -> torch.Tensor:
    """The model: column-parallel ``w1`` then row-parallel ``w2`` over tp (no grid: the whole model in one process)."""
    if grid is not None:
        x = copy_to(x, grid, "tp")  # type: ignore[arg-type]
    partial = torch.relu(x @ w1) @ w2
    prediction = partial if grid is None else reduce_from(partial, grid, "tp")  # type: ignore[arg-type]
    return ((prediction - y) ** 2).mean()


def reference(steps: int) -> torch.Tensor:
    """The same training in one process: the weights every survivor must end with."""
    w1, w2 = (w.clone().requires_grad_() for w in initial_weights())
    for step in range(steps):
        x, y = global_batch(step)
        step_loss(x, y, w1, w2).backward()
        with torch.no_grad():
            for w in (w1, w2):
                w -= LR * w.grad  # type: ignore[operator]
                w.grad = None
    return torch.cat([w1.detach().flatten(), w2.detach().flatten()])


def train_step(grid: hypergrid.HyperCommGrid, params: list[torch.Tensor], step: int) -> float:
    """One step on ``grid``: this rank's columns of w1 / rows of w2 (tp) and sample rows (dp); the loss."""
    me = grid.my_coord()
    x, y = global_batch(step)
    rows = BATCH // grid.group_size("dp")
    x, y = x[me.dp * rows : (me.dp + 1) * rows], y[me.dp * rows : (me.dp + 1) * rows]
    loss = step_loss(x, y, *params, grid=grid)
    loss.backward()
    grid.average_gradients(params, "dp")  # each replica's mean over its rows -> the global batch's mean
    with torch.no_grad():
        for param in params:
            param -= LR * param.grad  # type: ignore[operator]
            param.grad = None
    total = loss.detach().reshape(1)
    grid.all_reduce(total, "dp")
    return total.item() / grid.group_size("dp")


def shard(grid: hypergrid.HyperCommGrid) -> list[torch.Tensor]:
    """This rank's tensor-parallel shard of the initial weights."""
    w1, w2 = initial_weights()
    tp, width = grid.my_coord().tp, HIDDEN // grid.group_size("tp")
    columns = slice(tp * width, (tp + 1) * width)
    return [w1[:, columns].clone().requires_grad_(), w2[columns, :].clone().requires_grad_()]


def worker(steps: int, kill_rank: int, kill_step: int) -> None:
    grid = hypergrid.HyperCommGrid(
        [2, 4], ["tp", "dp"], group_options={"timeout": datetime.timedelta(seconds=600)}, guard_timeout_s=60
    )
    grid.create_pgs(["tp", "dp"])
    params = shard(grid)
    store = dist.distributed_c10d._get_default_store()  # for the timing only: the first world's store outlives it
    step, killed_at = 0, None
    while step < steps:
        saved = [param.detach().clone() for param in params]
        try:
            if step == kill_step and dist.get_rank() == kill_rank and grid.shape[1] == 4:  # once, in the first world
                store.set("example/killed", repr(time.time()))
                os.kill(os.getpid(), signal.SIGKILL)
            loss = train_step(grid, params, step)
            if killed_at is not None and dist.get_rank() == 0:
                print(
                    f"recovered: the first step on the new grid ended {time.time() - killed_at:.2f} s after the SIGKILL"
                )
                killed_at = None
            if dist.get_rank() == 0:
                print(f"step {step}: loss {loss:.6f} on {grid.group_size('dp')} dp replicas", flush=True)
            step += 1
        except hypergrid.RankFailure as failure:
            caught = time.time()
            regrid = grid.shrink(dead=failure.dead or None, dim="dp", policy="drop")
            if regrid.retired:
                return
            grid = regrid.grid
            params = [value.requires_grad_() for value in saved]  # redo the failed step from its start
            if regrid.rank == 0:
                killed_at = float(store.get("example/killed").decode())
                phases = ", ".join(f"{name} {seconds * 1e3:.0f} ms" for name, seconds in regrid.seconds.items())
                print(
                    f"rank {failure.dead} died in step {step} (SIGKILL, nobody named it): every survivor's collective "
                    f"raised RankFailure(dead={failure.dead}) {caught - killed_at:.2f} s after it; shrunk to "
                    f"{dict(zip(grid.dim_names, grid.shape))} on {dist.get_world_size()} ranks ({phases}); "
                    f"redoing step {step}",
                    flush=True,
                )
    mine = torch.cat([param.detach().flatten() for param in params])
    gathered = [torch.empty_like(mine) for _ in range(grid.group_size("tp"))]
    dist.all_gather(gathered, mine, group=grid.pg("tp"))
    if dist.get_rank() == 0:
        halves = [piece.split([FEATURES * HIDDEN // 2, HIDDEN // 2]) for piece in gathered]
        w1 = torch.cat([half[0].reshape(FEATURES, -1) for half in halves], dim=1)
        w2 = torch.cat([half[1] for half in halves])
        same = torch.allclose(torch.cat([w1.flatten(), w2.flatten()]), reference(steps), rtol=1e-12, atol=1e-12)
        print(f"the survivors' weights equal one process's after {steps} steps: {same}", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--kill-rank", type=int, default=5)
    parser.add_argument("--kill-step", type=int, default=3)
    args = parser.parse_args()
    began = time.perf_counter()
    hypergrid.spawn(worker, 8, (args.steps, args.kill_rank, args.kill_step), timeout_s=180, allow_deaths=True)
    print(f"done in {time.perf_counter() - began:.1f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
