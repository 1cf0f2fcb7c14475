"""Train through a rank's death: tp=2 x dp=4 on 8 local CPU processes, one killed mid-run, the rest shrink.

    python examples/elastic_train.py [--steps 8] [--kill-rank 5] [--kill-step 3]

A linear model whose 16 weights are split over ``tp`` (8 per rank) is fitted by
full-batch gradient descent, the global batch of 24 samples split over
``dp``. At step ``--kill-step`` rank ``--kill-rank`` exits with ``os._exit``.
The survivors catch ``hypergrid.RankFailure`` from the grid's collective,
call ``grid.shrink`` (``policy="drop"``: the dead rank's dp slice goes, dp 4 ->
3, its tensor-parallel partner retires), restore the weights from the start of
the failed step and finish on the new grid with the same global batch. Rank 0
prints the loss of every step and the recovery time.
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys
import time

import torch
import torch.distributed as dist

import hypergrid

FEATURES, BATCH, LR = 16, 24, 0.05


def global_batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The same global batch on every rank, whatever the grid: the data loader's job."""
    generator = torch.Generator().manual_seed(step)
    x = torch.randn(BATCH, FEATURES, generator=generator)
    return x, x @ torch.linspace(-1.0, 1.0, FEATURES)


def train_step(grid: hypergrid.HyperCommGrid, w: torch.Tensor, step: int) -> tuple[torch.Tensor, float]:
    """One step: this rank's weight columns (tp) and sample rows (dp); returns the new weights and the loss."""
    me = grid.my_coord()
    tp, dp = me.tp, me.dp
    x, y = global_batch(step)
    cols = slice(tp * w.numel(), (tp + 1) * w.numel())
    rows_per_rank = BATCH // grid.group_size("dp")
    rows = slice(dp * rows_per_rank, (dp + 1) * rows_per_rank)
    prediction = x[rows, cols] @ w
    grid.all_reduce(prediction, "tp")  # the full prediction of my rows
    error = prediction - y[rows]
    gradient = 2 / BATCH * x[rows, cols].T @ error
    loss = (error.square().sum() / BATCH).reshape(1)
    grid.all_reduce(gradient, "dp")
    grid.all_reduce(loss, "dp")
    return w - LR * gradient, loss.item()


def worker(steps: int, kill_rank: int, kill_step: int) -> None:
    grid = hypergrid.HyperCommGrid(
        [2, 4], ["tp", "dp"], group_options={"timeout": datetime.timedelta(seconds=3)}, guard_timeout_s=30
    )
    grid.create_pgs(["tp", "dp"])
    w = torch.zeros(FEATURES // 2)
    step, shrunk = 0, False
    while step < steps:
        start = w
        try:
            if step == kill_step and not shrunk and dist.get_rank() == kill_rank:
                os._exit(1)
            w, loss = train_step(grid, w, step)
            if dist.get_rank() == 0:
                print(f"step {step}: loss {loss:.4f} on {grid.shape[1]} dp replicas", flush=True)
            step += 1
        except hypergrid.RankFailure as failure:
            began = time.perf_counter()
            regrid = grid.shrink(dead=failure.dead or None, dim="dp", policy="drop", timeout_s=5)
            if regrid.retired:
                return
            grid, w, shrunk = regrid.grid, start, True
            if regrid.rank == 0:
                phases = ", ".join(f"{name} {seconds * 1e3:.0f} ms" for name, seconds in regrid.seconds.items())
                shape = dict(zip(grid.dim_names, grid.shape))
                print(
                    f"rank(s) {list(regrid.dead)} died in step {step}: shrunk to {shape} on "
                    f"{dist.get_world_size()} ranks in {time.perf_counter() - began:.2f} s ({phases}); "
                    f"redoing step {step}",
                    flush=True,
                )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--kill-rank", type=int, default=5)
    parser.add_argument("--kill-step", type=int, default=3)
    args = parser.parse_args()
    began = time.perf_counter()
    hypergrid.spawn(worker, 8, (args.steps, args.kill_rank, args.kill_step), timeout_s=120, allow_deaths=True)
    print(f"done in {time.perf_counter() - began:.1f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
