"""Worker functions: every grid operation after a peer's death (spawned gloo processes, module level).

Rank `VICTIM` leaves (``os._exit``) once every grid's groups exist; each
survivor then runs every operation, each on a grid of its own (so one
operation's failure leaves nothing behind for the next), and reports what it
saw: the exception's class, its ``__cause__``'s class, and the seconds it took.
"""

from __future__ import annotations

import datetime
import os
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from hypergrid import HyperCommGrid, autograd

#: The rank that dies; the world is 4 ranks on a one-dim grid ``x`` (an open pipeline for ``exchange``).
VICTIM = 3
WORLD = 4
#: Each group's timeout: a survivor whose neighbour failed first waits at most this long.
GROUP_TIMEOUT_S = 2.0


def _model() -> torch.nn.Module:
    model = torch.nn.Linear(3, 2)
    model(torch.ones(1, 3)).sum().backward()
    return model


def _backward(output: torch.Tensor) -> None:
    output.sum().backward()


def operations(rank: int) -> dict[str, tuple[Callable[[HyperCommGrid], Any], dict[str, Any]]]:
    """Each operation after the death, as ``rank`` runs it, with the grid settings it needs (its family is ``x``)."""
    x = torch.arange(4.0) + rank
    leaf = torch.ones(4, requires_grad=True)
    per_node = {"ranks_per_node": 2}
    return {
        "all_reduce": (lambda g: g.all_reduce(x.clone(), "x"), {}),
        "all_reduce async wait": (lambda g: g.all_reduce(x.clone(), "x", async_op=True).wait(), {}),
        "all_gather": (lambda g: g.all_gather(x, "x"), {}),
        "reduce_scatter": (lambda g: g.reduce_scatter(x.clone(), "x"), {}),
        "broadcast": (lambda g: g.broadcast(x.clone(), "x", group_src=VICTIM), {}),
        "broadcast async wait": (lambda g: g.broadcast(x.clone(), "x", group_src=VICTIM, async_op=True).wait(), {}),
        "barrier": (lambda g: g.barrier("x"), {}),
        "barrier async wait": (lambda g: g.barrier("x", async_op=True).wait(), {}),
        "hierarchical_all_reduce": (lambda g: g.hierarchical_all_reduce(x.clone(), "x", **per_node), {}),
        "average_gradients": (lambda g: g.average_gradients(_model(), "x"), {}),
        "exchange": (lambda g: g.exchange("x", send_next=x, recv_prev=torch.empty(4), send_prev=x), {}),
        "copy_to backward": (lambda g: _backward(autograd.copy_to(leaf, g, "x")), {}),
        "reduce_from": (lambda g: autograd.reduce_from(leaf, g, "x"), {}),
        "scatter_to backward": (lambda g: _backward(autograd.scatter_to(leaf, g, "x")), {}),
        "gather_from": (lambda g: autograd.gather_from(leaf, g, "x"), {}),
        "reduce_scatter_to": (lambda g: autograd.reduce_scatter_to(leaf, g, "x"), {}),
        "gather_from_sequence": (lambda g: autograd.gather_from_sequence(leaf, g, "x"), {}),
        "checked all_reduce": (lambda g: g.all_reduce(x.clone(), "x"), {"check_collectives": True}),
        "checked average_gradients": (lambda g: g.average_gradients(_model(), "x"), {"check_collectives": True}),
        "checked exchange": (
            lambda g: g.exchange("x", send_next=x, recv_prev=torch.empty(4)),
            {"check_collectives": True},
        ),
    }


def _grid(settings: dict[str, Any]) -> HyperCommGrid:
    options = {"timeout": datetime.timedelta(seconds=GROUP_TIMEOUT_S)}
    grid = HyperCommGrid([WORLD], ["x"], group_options=options, guard_timeout_s=60, **settings)
    grid.pg("x")
    grid.pg("x", within="node", ranks_per_node=2)
    grid.pg("x", across="node", ranks_per_node=2)
    return grid


def after_a_death() -> dict[str, dict[str, Any]]:
    """Every operation on a survivor after `VICTIM` left; the victim never returns."""
    ops = operations(dist.get_rank())
    grids = {name: _grid(settings) for name, (_, settings) in ops.items()}
    dist.barrier()
    if dist.get_rank() == VICTIM:
        os._exit(3)
    time.sleep(0.5)  # let the victim's sockets close
    seen: dict[str, dict[str, Any]] = {}
    for name, (run, _) in ops.items():
        start = time.monotonic()
        try:
            run(grids[name])
            outcome: dict[str, Any] = {"error": None, "cause": None}
        except BaseException as error:  # the test checks exactly what came out
            cause = error.__cause__
            outcome = {"error": type(error).__name__, "cause": None if cause is None else type(cause).__name__}
            outcome["message"] = str(error).splitlines()[0] if str(error) else ""
        outcome["seconds"] = time.monotonic() - start
        seen[name] = outcome
    return seen
