"""Collective bandwidth per family of a grid, the nccl-tests way, side by side with plain new_group.

    python benchmarks/allreduce.py --shape 2,2,2 --dims tp,cp,dp [--families all | "tp;cp,dp"]
        [--minbytes 1K --maxbytes 64M --stepfactor 2] [--iters 20 --warmup 5] [--dtype float32]
        [--op all_reduce|reduce_scatter|all_gather] [--backend gloo|nccl] [--json PATH] [--plot PATH]
        [--grad-params 100] [--checked]

Without torchrun (no RANK in the environment) it starts prod(shape) local gloo
processes itself. Under torchrun it joins through env:// and uses NCCL with CUDA
tensors when GPUs are present (or --backend says so).

For each family, every group of the family runs the collective at the same time
(as NCCL_TESTS_SPLIT does); bandwidth is reported per group. Each row: the size
(of the whole array, as nccl-tests), the element count, the mean over ranks of
the time per iteration, the median over ranks of each rank's median iteration,
algbw = size / time, busbw = algbw x factor (all_reduce 2(n-1)/n, reduce_scatter
and all_gather (n-1)/n, n = group size) and #wrong, the elements that fail the
data check. The same groups built with plain ``dist.new_group`` are measured in
the same run ("raw" rows); the summary gives the ratio hypergrid / raw busbw.

Then gradient averaging over ``dp`` (the whole grid when there is no ``dp``)
for a model of ``--grad-params`` small parameters (default 100, 0 skips it):
``grid.average_gradients`` (flat buckets, one all-reduce each) against one
all-reduce and a divide per parameter, interleaved in the same run; the line
gives each one's median time (the median over ranks of each rank's median) and
the ratio per-parameter / bucketed, and checks that both give the same gradients.

``--checked`` adds "unchecked" and "checked" rows, both through the grid's own
method (``check_collectives`` off / on), and their ratio (benchmarks/checked_collectives.py).
"""

from __future__ import annotations

import argparse
import math
import os
import pathlib
import sys
import time
from typing import Any

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

import torch
import torch.distributed as dist

from benchmarks.checked_collectives import IMPLS, format_checked
from benchmarks.common import bandwidths, human_bytes, median, parse_bytes, progress, size_sweep, sync, write_json
from benchmarks.gradient_averaging import format_gradients, measure_gradients
from hypergrid import DimsError, GridLayout, HyperCommGrid, init_from_env, spawn
from hypergrid.launch import default_device

DTYPES = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float64": torch.float64,
    "int32": torch.int32,
}
OPS = ("all_reduce", "reduce_scatter", "all_gather")
FIELDS = (
    "family",
    "size_bytes",
    "count",
    "group_size",
    "time_us",
    "time_us_median",
    "algbw_gbps",
    "busbw_gbps",
    "wrong",
    "impl",
)


def parse_families(text: str, layout: GridLayout) -> list[tuple[str, ...]] | None:
    """``"all"`` -> None (every family); ``"tp;cp,dp"`` -> ``[("tp",), ("dp", "cp")]`` (canonical).

    A family is names separated by ``,`` or a key such as ``dp-cp``; families are separated by ``;``.
    """
    if text.strip() == "all":
        return None
    try:
        return [
            layout.canonical_dims([d.strip() for d in part.split(",")] if "," in part else part.strip())
            for part in text.split(";")
        ]
    except DimsError as error:
        raise ValueError(f"--families {text!r}: {error}") from None


class _Collective:
    """One collective over one group, with its buffers and its data check."""

    def __init__(self, op: str, size: int, dtype: torch.dtype, group: Any, device: torch.device) -> None:
        self.op, self.group = op, group
        self.n = dist.get_world_size(group)
        me = dist.get_rank(group)
        element = torch.tensor([], dtype=dtype).element_size()
        count = size // element
        if op != "all_reduce":
            count -= count % self.n  # the array splits evenly over the group
        self.count = max(count, self.n if op != "all_reduce" else 1)
        self.size = self.count * element
        value = me + 1
        if op == "all_reduce":
            self.send = torch.full((self.count,), value, dtype=dtype, device=device)
            self.recv = self.send
            self.expected = torch.full_like(self.send, self.n * (self.n + 1) // 2)
        elif op == "reduce_scatter":
            self.send = torch.full((self.count,), value, dtype=dtype, device=device)
            self.recv = torch.empty(self.count // self.n, dtype=dtype, device=device)
            self.expected = torch.full_like(self.recv, self.n * (self.n + 1) // 2)
        else:
            self.send = torch.full((self.count // self.n,), value, dtype=dtype, device=device)
            self.recv = torch.empty(self.count, dtype=dtype, device=device)
            chunks = torch.arange(1, self.n + 1, device=device).repeat_interleave(self.count // self.n)
            self.expected = chunks.to(dtype)
        self.fresh = self.send.clone()

    def run(self) -> None:
        if self.op == "all_reduce":
            dist.all_reduce(self.send, group=self.group)
        elif self.op == "reduce_scatter":
            dist.reduce_scatter_tensor(self.recv, self.send, group=self.group)
        else:
            dist.all_gather_into_tensor(self.recv, self.send, group=self.group)

    def wrong(self) -> int:
        """Run once on fresh data and count the elements that differ from the expected result."""
        self.send.copy_(self.fresh)
        self.run()
        return int((self.recv != self.expected).sum().item())


class _GridCollective(_Collective):
    """The same collective through a grid's method (``grid.all_reduce`` ...), checked or not."""

    def __init__(self, op: str, size: int, dtype: torch.dtype, grid: HyperCommGrid, family: Any, device: Any) -> None:
        super().__init__(op, size, dtype, grid.pg(family), device)
        self.grid, self.family = grid, family

    def run(self) -> None:
        if self.op == "all_reduce":
            self.grid.all_reduce(self.send, self.family)
        else:
            self.recv.copy_(getattr(self.grid, self.op)(self.send, self.family))


def measure(config: dict[str, Any]) -> dict[str, Any]:
    """On every rank: the sweep over families (``rows``) and the gradient averaging (``gradients``), equal on all."""
    config = _agree(config)
    grid = HyperCommGrid(config["shape"], config["dims"], backend=config["backend"])
    through_grid = {  # --checked: the same calls through grids with check_collectives off and on
        impl: HyperCommGrid(config["shape"], config["dims"], backend=config["backend"], check_collectives=on)
        for impl, on in IMPLS.items()
        if config.get("checked")
    }
    layout = grid.layout
    device = default_device()
    rank, world = dist.get_rank(), dist.get_world_size()
    if world != grid.size:
        raise ValueError(f"the benchmark needs a world of exactly {grid.size} ranks for {config['shape']}, got {world}")
    families = config["families"] or layout.all_families()
    dtype = DTYPES[config["dtype"]]
    rows: list[dict[str, Any]] = []
    verbose = rank == 0 and config["progress"]
    for index, family in enumerate(families, 1):
        key = layout.key(family)
        if verbose:
            progress(f"family {index}/{len(families)} {key}: {len(config['sizes'])} sizes, hypergrid and raw groups")
        groups = {"hypergrid": grid.create_pg(family)}
        raw = None
        for ranks in layout.rank_enum(key):  # the baseline: plain new_group, every rank, every group
            created = dist.new_group(ranks, backend=config["backend"])
            if rank in ranks:
                raw = created
        groups["raw"] = raw
        for size in config["sizes"]:
            collectives = {impl: _Collective(config["op"], size, dtype, g, device) for impl, g in groups.items()}
            for impl, other in through_grid.items():
                collectives[impl] = _GridCollective(config["op"], size, dtype, other, family, device)
            for collective in collectives.values():
                for _ in range(config["warmup"]):
                    collective.run()
            sync(device)
            dist.barrier()
            # Interleaved, alternating which goes first: both see the same machine conditions.
            samples: dict[str, list[float]] = {impl: [] for impl in collectives}
            for iteration in range(config["iters"]):
                order = list(collectives) if iteration % 2 == 0 else list(reversed(collectives))
                for impl in order:
                    start = time.perf_counter()
                    collectives[impl].run()
                    sync(device)
                    samples[impl].append(time.perf_counter() - start)
            for impl, collective in collectives.items():
                row = _row(key, impl, collective, samples[impl], config["op"], device, world)
                rows.append(row)
                if verbose:
                    progress(format_row(row, config))
        if raw is not None:
            dist.destroy_process_group(raw)
    gradients = measure_gradients(grid, config, device) if config["grad_params"] else None
    for other in through_grid.values():
        other.destroy()
    grid.destroy()
    return {"rows": rows, "gradients": gradients}


def _row(
    key: str, impl: str, collective: _Collective, samples: list[float], op: str, device: torch.device, world: int
) -> dict[str, Any]:
    """One table row: this rank's timings and data check, combined over all ranks."""
    stats = [sum(samples) / len(samples), median(samples), collective.wrong()]
    mine = torch.tensor(stats, dtype=torch.float64, device=device)
    everyone = [torch.zeros_like(mine) for _ in range(world)]
    dist.all_gather(everyone, mine)
    table = torch.stack([t.cpu() for t in everyone])
    mean_s = float(table[:, 0].mean())
    algbw, busbw = bandwidths(op, collective.size, mean_s, collective.n)
    return {
        "family": key,
        "size_bytes": collective.size,
        "count": collective.count,
        "group_size": collective.n,
        "time_us": mean_s * 1e6,
        "time_us_median": median(table[:, 1].tolist()) * 1e6,
        "algbw_gbps": algbw,
        "busbw_gbps": busbw,
        "wrong": int(table[:, 2].sum()),
        "impl": impl,
    }


def _agree(config: dict[str, Any]) -> dict[str, Any]:
    """Every rank runs rank 0's configuration: fixed iteration counts agreed by all."""
    box = [config]
    dist.broadcast_object_list(box, src=0)
    return box[0]  # type: ignore[no-any-return]


def header(config: dict[str, Any]) -> str:
    return (
        f"# {config['op']} per family, grid {config['shape']} over {config['dims']}, dtype {config['dtype']}, "
        f"iters {config['iters']}, warmup {config['warmup']}\n"
        f"{'family':<10} {'impl':<9} {'size(B)':>10} {'count':>10} {'type':<8} {'redop':<5} | "
        f"{'time(us)':>10} {'median(us)':>10} {'algbw':>7} {'busbw':>7} {'#wrong':>6}"
    )


def format_row(row: dict[str, Any], config: dict[str, Any]) -> str:
    redop = "sum" if config["op"] != "all_gather" else "none"
    return (
        f"{row['family']:<10} {row['impl']:<9} {row['size_bytes']:>10} {row['count']:>10} {config['dtype']:<8} "
        f"{redop:<5} | {row['time_us']:>10.1f} {row['time_us_median']:>10.1f} {row['algbw_gbps']:>7.3f} "
        f"{row['busbw_gbps']:>7.3f} {row['wrong']:>6}"
    )


def summary(rows: list[dict[str, Any]], at_bytes: int) -> list[tuple[str, int, float, float, float, float]]:
    """Per family, at the largest measured size up to ``at_bytes``: hypergrid and raw busbw, their ratio
    (from mean times, as busbw is defined: also on one rank, where busbw is 0) and the same ratio from median times
    (robust to CPU tails)."""
    out = []
    for family in dict.fromkeys(row["family"] for row in rows):
        sizes = [r["size_bytes"] for r in rows if r["family"] == family and r["size_bytes"] <= at_bytes]
        if not sizes:
            continue
        size = max(sizes)
        at = {r["impl"]: r for r in rows if r["family"] == family and r["size_bytes"] == size}
        ours, raw = at["hypergrid"], at["raw"]
        ratio_mean, ratio_median = raw["time_us"] / ours["time_us"], raw["time_us_median"] / ours["time_us_median"]
        out.append((family, size, ours["busbw_gbps"], raw["busbw_gbps"], ratio_mean, ratio_median))
    return out


def plot(rows: list[dict[str, Any]], path: pathlib.Path, title: str) -> None:
    """busbw vs size, one line per family (solid: hypergrid, dotted: raw new_group)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(8, 5))
    for index, family in enumerate(dict.fromkeys(row["family"] for row in rows)):
        color = f"C{index % 10}"
        for impl, style in (("hypergrid", "-"), ("raw", ":")):
            mine = [r for r in rows if r["family"] == family and r["impl"] == impl]
            label = family if impl == "hypergrid" else None
            axes.plot([r["size_bytes"] for r in mine], [r["busbw_gbps"] for r in mine], style, color=color, label=label)
    axes.set_xscale("log", base=2)
    axes.set_xlabel("size (bytes)")
    axes.set_ylabel("busbw (GB/s)")
    axes.set_title(title)
    axes.grid(True, alpha=0.3)
    axes.legend(title="family (dotted: raw new_group)", fontsize=8)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(figure)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="2,2,2", help="dim sizes, innermost first (default 2,2,2)")
    parser.add_argument("--dims", default="tp,cp,dp", help="dim names, innermost first (default tp,cp,dp)")
    parser.add_argument("--families", default="all", help='"all" or families separated by ";" (e.g. "tp;cp,dp")')
    parser.add_argument("--minbytes", default="1K")
    parser.add_argument("--maxbytes", default="64M")
    parser.add_argument("--stepfactor", type=int, default=2)
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--dtype", default="float32", choices=sorted(DTYPES))
    parser.add_argument("--op", default="all_reduce", choices=OPS)
    parser.add_argument("--backend", choices=("gloo", "nccl"), help="default: nccl under torchrun with GPUs, else gloo")
    parser.add_argument("--json", type=pathlib.Path, help="write one record per row here")
    parser.add_argument("--plot", type=pathlib.Path, help="write a PNG of busbw vs size here (needs matplotlib)")
    parser.add_argument("--summary-at", default="16M", help="size for the hypergrid/raw ratio (default 16M)")
    parser.add_argument("--timeout", type=float, default=3600.0, help="hard limit in seconds for local runs")
    parser.add_argument("--quiet", action="store_true", help="no progress lines")
    parser.add_argument(
        "--grad-params", type=int, default=100, help="parameters of the gradient-averaging model (default 100, 0: skip)"
    )
    parser.add_argument("--checked", action="store_true", help="also time grid calls with check_collectives on/off")
    return parser


def config_from_args(args: argparse.Namespace, parser: argparse.ArgumentParser) -> dict[str, Any]:
    try:
        shape = [int(size) for size in args.shape.split(",")]
        dims = [dim.strip() for dim in args.dims.split(",")]
        HyperCommGrid(shape, dims)  # validates shape and names before anything starts
        sizes = size_sweep(parse_bytes(args.minbytes), parse_bytes(args.maxbytes), args.stepfactor)
        families = parse_families(args.families, GridLayout(shape, dims))
        parse_bytes(args.summary_at)
    except ValueError as error:
        parser.error(str(error))
    if args.iters < 1 or args.warmup < 0 or args.grad_params < 0:
        parser.error(
            "--iters must be >= 1, --warmup and --grad-params >= 0, "
            f"got {args.iters}, {args.warmup}, {args.grad_params}"
        )
    return {
        "shape": shape,
        "dims": dims,
        "families": families,
        "sizes": sizes,
        "iters": args.iters,
        "warmup": args.warmup,
        "dtype": args.dtype,
        "op": args.op,
        "backend": args.backend,
        "progress": not args.quiet,
        "grad_params": args.grad_params,
        "checked": args.checked,
    }


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    config = config_from_args(args, parser)
    if "RANK" in os.environ:
        init_from_env(args.backend)
        config["backend"] = args.backend or dist.get_backend()
        try:
            measured = measure(config)
            if dist.get_rank() != 0:
                return 0
        finally:
            dist.destroy_process_group()
    else:
        if args.backend == "nccl":
            parser.error("--backend nccl needs torchrun (one process per GPU)")
        config["backend"] = "gloo"
        if config["progress"]:
            progress(f"starting {math.prod(config['shape'])} local gloo processes")
        measured = spawn(measure, math.prod(config["shape"]), (config,), timeout_s=args.timeout)[0]
    rows, gradients = measured["rows"], measured["gradients"]
    print(header(config))
    for row in rows:
        print(format_row(row, config))
    at = parse_bytes(args.summary_at)
    print(f"\n# hypergrid / raw new_group busbw at the largest size <= {human_bytes(at)}")
    results = summary(rows, at)
    for family, size, ours, raw, ratio, ratio_median in results:
        print(
            f"{family:<10} {human_bytes(size):>6}  hypergrid {ours:7.3f}  raw {raw:7.3f}  "
            f"ratio {ratio:5.3f}  (from medians {ratio_median:5.3f})"
        )
    if results:
        print(
            f"# median over families: ratio {median([r[4] for r in results]):.3f}, "
            f"from medians {median([r[5] for r in results]):.3f}"
        )
    if format_checked(rows):
        print("\n" + format_checked(rows))
    wrong = sum(row["wrong"] for row in rows)
    if gradients is not None:
        print("\n" + format_gradients(gradients))
        wrong += gradients["wrong"]
    print(f"# total #wrong: {wrong}")
    if args.json:
        write_json(args.json, rows)
    if args.plot:
        plot(rows, args.plot, f"{config['op']} busbw, grid {config['shape']} {config['dims']} ({config['backend']})")
    return 0 if wrong == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
