"""Gradient averaging, the row of ``allreduce.py``: ``grid.average_gradients`` against an all-reduce per parameter.

Both average the same gradients of a model of many small parameters over one
family, interleaved iteration by iteration (alternating which goes first) in
the same run; each result is the median over ranks of each rank's median time,
and the two results are compared element by element (``wrong``).
"""

from __future__ import annotations

import time
from typing import Any

import torch
import torch.distributed as dist

from benchmarks.common import median, sync
from hypergrid import HyperCommGrid

__all__ = ["format_gradients", "measure_gradients"]


def measure_gradients(grid: HyperCommGrid, config: dict[str, Any], device: torch.device) -> dict[str, Any]:
    """``average_gradients`` (bucketed) against an all-reduce per parameter, same parameters, interleaved."""
    family = ["dp"] if "dp" in grid.dim_names else list(grid.dim_names)
    group = grid.pg(family)
    generator = torch.Generator().manual_seed(0)
    sizes = torch.randint(16, 1025, (config["grad_params"],), generator=generator).tolist()
    params = [torch.zeros(size, device=device, requires_grad=True) for size in sizes]
    fresh = [torch.full((size,), float(dist.get_rank() + 1), device=device) for size in sizes]
    members = dist.get_world_size(group)

    def bucketed() -> None:
        grid.average_gradients(params, family)

    def per_parameter() -> None:
        for param in params:
            assert param.grad is not None
            dist.all_reduce(param.grad, group=group)
            param.grad.div_(members)

    runs = {"bucketed": bucketed, "per_parameter": per_parameter}
    results: dict[str, list[torch.Tensor]] = {}
    samples: dict[str, list[float]] = {name: [] for name in runs}
    for iteration in range(config["warmup"] + config["iters"]):
        for name in list(runs) if iteration % 2 == 0 else list(reversed(runs)):
            for param, values in zip(params, fresh):
                param.grad = values.clone()
            sync(device)
            dist.barrier(group=group)
            start = time.perf_counter()
            runs[name]()
            sync(device)
            if iteration >= config["warmup"]:
                samples[name].append(time.perf_counter() - start)
            results[name] = [param.grad.clone() for param in params if param.grad is not None]
    wrong = sum(int((a != b).sum()) for a, b in zip(results["bucketed"], results["per_parameter"]))
    mine = torch.tensor([median(samples["bucketed"]), median(samples["per_parameter"]), wrong], dtype=torch.float64)
    everyone = [torch.zeros_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(everyone, mine.to(device))
    table = torch.stack([t.cpu() for t in everyone])
    return {
        "family": grid.layout.key(family),
        "group_size": members,
        "params": len(params),
        "bytes": sum(sizes) * 4,
        "bucketed_us": median(table[:, 0].tolist()) * 1e6,
        "per_parameter_us": median(table[:, 1].tolist()) * 1e6,
        "wrong": int(table[:, 2].sum()),
    }


def format_gradients(result: dict[str, Any]) -> str:
    """The row as text: both median times and their ratio."""
    ratio = result["per_parameter_us"] / result["bucketed_us"]
    lines = [
        f"# average_gradients over {result['family']} ({result['group_size']} ranks), {result['params']} parameters, "
        f"{result['bytes'] / 1024:.0f} KiB of gradients",
        f"bucketed       {result['bucketed_us']:>10.1f} us (median)",
        f"per-parameter  {result['per_parameter_us']:>10.1f} us (median)",
        f"# per-parameter / bucketed: {ratio:.2f}, #wrong {result['wrong']}",
    ]
    return "\n".join(lines)
