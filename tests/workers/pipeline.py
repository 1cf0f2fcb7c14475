"""A pp x tp x dp job on `hypergrid.ElasticLoop` in spawned gloo processes: two pipeline stages, each one of
examples/elastic_tp_dp.py's tensor-parallel MLP blocks, activations and their gradients exchanged along ``pp``
(``grid.exchange``), gradients averaged along ``dp``. Its one-process replay is the example's two-block model."""

from __future__ import annotations

import hashlib
from typing import Any

import torch
import torch.distributed as dist

import hypergrid
from tests.workers import resume


def train(tp: int, spares: int, steps: int, kill: str) -> dict[str, Any]:
    """Run the pipeline on the spawned world (``kill``: the example's ``--kill`` specs); this rank's outcome."""
    example = resume.example()
    first_rank = dist.get_rank()
    hook = example.Killer(kill, first_rank, False)

    def setup(grid: Any) -> tuple[Any, Any]:
        me = grid.my_coord()
        block = example.Block(tp, me.tp, 11 + me.pp)  # stage pp holds the example model's block pp
        return block, torch.optim.Adam(block.parameters(), lr=example.LR)

    def step(grid: Any, state: tuple[Any, Any], step: int) -> None:
        block, optimizer = state
        hook.step_now = step
        hook("begin")
        me, dp = grid.my_coord(), grid.group_size("dp")
        x, y = example.global_batch(step)
        rows = slice(me.dp * example.BATCH // dp, (me.dp + 1) * example.BATCH // dp)
        if me.pp == 0:
            hidden = block(x[rows], grid, hook)
            grid.exchange("pp", send_next=hidden.detach())
            grad = torch.empty_like(hidden)
            grid.exchange("pp", recv_next=grad)
            hidden.backward(grad)
        else:
            hidden = torch.empty(rows.stop - rows.start, example.FEATURES, dtype=torch.float64)
            grid.exchange("pp", recv_prev=hidden)
            hidden.requires_grad_()
            ((block(hidden, grid, hook) - y[rows]) ** 2).mean().backward()
            hook("backward")
            grid.exchange("pp", send_prev=hidden.grad)
        hook("average")
        grid.average_gradients(block, "dp")
        optimizer.step()
        optimizer.zero_grad()

    loop = hypergrid.ElasticLoop([tp, 2, -1], ["tp", "pp", "dp"], steps=steps, spares=spares, verbose=False)
    result = loop.run(setup, step)
    if not result.finished:
        return {"first_rank": first_rank, "retired": result.retired, "released": result.released}
    block = result.state[0]
    whole = example.one_process(steps).blocks[result.coord.pp]
    width = example.HIDDEN // tp
    columns = slice(result.coord.tp * width, (result.coord.tp + 1) * width)
    pairs = [(block.up, whole.up[:, columns]), (block.up_bias, whole.up_bias[columns]),
             (block.down, whole.down[columns, :]), (block.down_bias, whole.down_bias)]  # fmt: skip
    digest = hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in block.parameters())).hexdigest()
    return {"first_rank": first_rank, "rank": result.rank, "coord": tuple(result.coord), "shape": result.shape,
            "step": result.step, "equal": result.replicas_equal, "digest": digest,
            "max_abs": max((a.detach() - b.detach()).abs().max().item() for a, b in pairs),
            "dead": [list(change.dead) for change in result.history]}  # fmt: skip
