"""The main job: build a grid, create every family, all-reduce in each, check, report.

Without ``torchrun`` (no ``RANK`` in the environment) it starts ``prod(shape)``
local gloo processes itself. Under ``torchrun`` it joins the job through
``env://`` and uses NCCL with CUDA tensors when GPUs are present::

    python -m hypergrid demo                                   # 8 local CPU processes
    torchrun --nproc-per-node 8 -m hypergrid demo              # 8 GPUs, NCCL
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import torch
import torch.distributed as dist

from hypergrid.binding.failures import communicate
from hypergrid.cli.arguments import OneLineParser, parse_seconds
from hypergrid.cli.show import parse_grid_arguments
from hypergrid.errors import HyperGridError, InvalidArgumentError
from hypergrid.grid import HyperCommGrid
from hypergrid.launch import default_device, init_from_env, spawn
from hypergrid.launch.processes import MAX_SPAWN
from hypergrid.values import check_timeout, shown

__all__ = ["FamilyReport", "format_table", "main", "run_families"]


@dataclass(frozen=True)
class FamilyReport:
    """What the demo measured for one family, agreed over all ranks."""

    key: str
    num_groups: int
    group_size: int
    wrong_ranks: int
    same_object_any_order: bool
    create_ms: float
    allreduce_ms: float
    first_group: tuple[int, ...]

    @property
    def ok(self) -> bool:
        """All ranks got their group's sum and ``get_pg`` agreed in every order."""
        return self.wrong_ranks == 0 and self.same_object_any_order


def run_families(shape: Sequence[int], dim_names: Sequence[str]) -> list[dict[str, object]]:
    """On every rank: create each family of the grid, all-reduce rank ids, check.

    Must run inside an initialized process group of exactly ``prod(shape)``
    ranks. Returns the same reports (as dicts) on every rank.
    """
    grid = HyperCommGrid(shape, dim_names)
    layout = grid.layout
    if dist.get_world_size() != grid.size:
        raise InvalidArgumentError(
            f"the demo needs a world of exactly {grid.size} ranks for shape {list(shape)}, got {dist.get_world_size()}"
        )
    rank = dist.get_rank()
    device = default_device()
    reports = []
    for family in layout.all_families():
        communicate(None, "demo: barrier", dist.barrier)
        start = time.perf_counter()
        group = grid.create_pg(family)
        created = time.perf_counter()
        value = torch.tensor([rank], dtype=torch.int64, device=device)
        communicate(None, f"demo: all_reduce over {layout.key(family)!r}", dist.all_reduce, value, group=group)
        reduced = time.perf_counter()
        wrong = int(value.item() != sum(layout.group_ranks(family, rank)))
        # get_pg is a lookup in any order: reversed names must give the same object.
        same = grid.get_pg(list(reversed(family))) is group and grid.get_pg(layout.key(family)) is group
        stats = torch.tensor(
            [wrong, int(not same), (created - start) * 1e6, (reduced - created) * 1e6],
            dtype=torch.float64,
            device=device,
        )
        totals = stats[:2].clone()
        slowest = stats[2:].clone()
        communicate(None, "demo: all_reduce of the checks", dist.all_reduce, totals)
        communicate(None, "demo: all_reduce of the times", dist.all_reduce, slowest, op=dist.ReduceOp.MAX)
        reports.append(
            FamilyReport(
                key=layout.key(family),
                num_groups=layout.num_groups(family),
                group_size=layout.group_size(family),
                wrong_ranks=int(totals[0].item()),
                same_object_any_order=totals[1].item() == 0,
                create_ms=slowest[0].item() / 1e3,
                allreduce_ms=slowest[1].item() / 1e3,
                first_group=tuple(layout.group_ranks(family, layout.rank_offset)),
            )
        )
    grid.destroy()
    return [asdict(report) for report in reports]


def format_table(shape: Sequence[int], dim_names: Sequence[str], rows: Sequence[FamilyReport]) -> str:
    """The demo's report as a fixed-width table (times are the slowest rank's).

    Examples:
        >>> row = FamilyReport("dp-tp", 2, 4, 0, True, 12.5, 0.75, (0, 1, 4, 5))
        >>> print(format_table([2, 2, 2], ["tp", "cp", "dp"], [row]))  # doctest: +NORMALIZE_WHITESPACE
        grid [2, 2, 2] over ['tp', 'cp', 'dp'] (8 ranks)
        family     groups  size  check  create(ms)  allreduce(ms)  first group
        dp-tp           2     4  ok          12.50           0.75  [0, 1, 4, 5]
        1 of 1 families correct
    """
    lines = [
        f"grid {list(shape)} over {list(dim_names)} ({math.prod(shape)} ranks)",
        f"{'family':<10} {'groups':>6} {'size':>5}  {'check':<5} {'create(ms)':>11} {'allreduce(ms)':>14}  first group",
    ]
    for row in rows:
        check = "ok" if row.ok else f"FAIL ({row.wrong_ranks} wrong)"
        lines.append(
            f"{row.key:<10} {row.num_groups:>6} {row.group_size:>5}  "
            f"{check:<5} {row.create_ms:>11.2f} {row.allreduce_ms:>14.2f}  {list(row.first_group)}"
        )
    good = sum(row.ok for row in rows)
    lines.append(f"{good} of {len(rows)} families correct")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the demo; return 0 when every family checks out, 1 otherwise."""
    parser = OneLineParser(prog="python -m hypergrid demo", description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="2,2,2", help="dim sizes, innermost first (default 2,2,2)")
    parser.add_argument("--dims", default="tp,cp,dp", help="dim names, innermost first (default tp,cp,dp)")
    parser.add_argument("--timeout", default="300", help="hard limit in seconds (default 300)")
    args = parser.parse_args(argv)
    try:  # every argument before any process starts
        layout = parse_grid_arguments(args.shape, args.dims)
        timeout_s = check_timeout(parse_seconds(args.timeout, "--timeout"), "--timeout")
        if "RANK" not in os.environ and layout.size > MAX_SPAWN:
            raise InvalidArgumentError(
                f"--shape {shown(args.shape)} needs {layout.size:,} local processes; the demo starts at most "
                f"{MAX_SPAWN} (run it under torchrun for more)"
            )
    except HyperGridError as error:
        parser.error(str(error))
    shape, dim_names = list(layout.shape), list(layout.dim_names)
    if "RANK" in os.environ:
        init_from_env(timeout_s=timeout_s)
        try:
            raw = run_families(shape, dim_names)
            if dist.get_rank() != 0:
                return 0
        finally:
            dist.destroy_process_group()
    else:
        raw = spawn(run_families, math.prod(shape), (shape, dim_names), timeout_s=timeout_s)[0]
    rows = [FamilyReport(**row) for row in raw]  # type: ignore[arg-type]
    print(format_table(shape, dim_names, rows))
    return 0 if all(row.ok for row in rows) else 1
