"""``python -m hypergrid plan``: rank the orders of a grid's dims on a cluster, fastest first.

    python -m hypergrid plan --sizes tp=8,dp=16 --topology h100_8x
        --traffic "tp:all_reduce:64M:200,dp:all_reduce:1G:1" [--split] [--top K]
        [--json PATH] [--png PATH]
    python -m hypergrid plan --sizes tp=8,pp=4,dp=16
        --model hidden=8192,layers=80,seq_len=4096,micro_batch=1,params=70e9

``--traffic`` entries are ``dims:op:bytes[:calls]`` (dims a name or a key like
``dp-cp``; bytes with K/M/G binary units or a plain number such as ``1e9``);
``--model`` takes `llm_step_traffic`'s figures instead. ``--topology`` is a
preset name or a JSON file ``{"tiers": [{"name", "size", "bandwidth", "latency"}, ...]}``.
"""

from __future__ import annotations

import json
import pathlib
import re
from collections.abc import Sequence
from typing import Any

from hypergrid.cli.arguments import OneLineParser, check_output, parse_int, require_module, write_text, writing
from hypergrid.errors import HyperGridError, InvalidArgumentError
from hypergrid.topology import PRESETS, Plan, Tier, Topology, Traffic, llm_step_traffic, plan
from hypergrid.values import first_line, shown

__all__ = ["parse_bytes", "parse_sizes", "parse_traffic", "parse_model", "load_topology", "render_plans", "main"]

_UNITS = {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4}
_MODEL_INTS = ("hidden", "layers", "seq_len", "micro_batch", "dtype_bytes", "microbatches", "experts", "topk")


def parse_bytes(text: str) -> float:
    """``"64M"`` -> 67108864 (binary units), ``"1e9"`` -> 1e9.

    Examples:
        >>> parse_bytes("64M"), parse_bytes("1e9"), parse_bytes("512")
        (67108864.0, 1000000000.0, 512.0)
    """
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([KMGT]?)B?\s*", text.upper())
    if not match:
        raise InvalidArgumentError(f"expected a size such as 64M, 1G or 1e9, got {shown(text)}")
    return float(match.group(1)) * _UNITS[match.group(2)]


def _pairs(text: str, what: str) -> dict[str, str]:
    pairs = {}
    for item in text.split(","):
        name, sep, value = item.partition("=")
        if not sep or not name.strip() or not value.strip():
            raise InvalidArgumentError(f"{what} must be name=value pairs separated by ',', got {shown(text)}")
        if name.strip() in pairs:
            raise InvalidArgumentError(f"{what} names {name.strip()!r} twice in {shown(text)}")
        pairs[name.strip()] = value.strip()
    return pairs


def parse_sizes(text: str) -> dict[str, int]:
    """``"tp=8,dp=16"`` -> ``{"tp": 8, "dp": 16}`` (order kept).

    Examples:
        >>> parse_sizes("tp=8,dp=16")
        {'tp': 8, 'dp': 16}
    """
    return {
        name: parse_int(value, f"--sizes: size of {shown(name)}", 1) for name, value in _pairs(text, "--sizes").items()
    }


def parse_traffic(text: str) -> list[Traffic]:
    """``"tp:all_reduce:64M:200,dp:all_reduce:1G"`` -> `Traffic` entries (calls default 1).

    Examples:
        >>> [(t.key, t.op, t.bytes, t.calls) for t in parse_traffic("dp-cp:all_gather:1K:3")]
        [('dp-cp', 'all_gather', 1024.0, 3)]
    """
    entries = []
    for item in text.split(","):
        fields = item.strip().split(":")
        if len(fields) not in (3, 4) or not fields[0]:
            raise InvalidArgumentError(f"--traffic entries are dims:op:bytes[:calls], got {shown(item)}")
        calls = parse_int(fields[3], f"--traffic: calls in {shown(item)}") if len(fields) == 4 else 1
        entries.append(Traffic(fields[0], fields[1], parse_bytes(fields[2]), calls))
    return entries


def parse_model(text: str, sizes: dict[str, int]) -> list[Traffic]:
    """``"hidden=4096,layers=32,..."`` -> `llm_step_traffic` (``params`` takes ``7e9``).

    Examples:
        >>> [t.key for t in parse_model("hidden=1024,layers=2,seq_len=8,micro_batch=1,params=1e6", {"tp": 2})]
        ['tp']
    """
    figures: dict[str, Any] = {}
    for name, value in _pairs(text, "--model").items():
        if name not in (*_MODEL_INTS, "params"):
            raise InvalidArgumentError(f"--model: unknown figure {shown(name)}; expected {[*_MODEL_INTS, 'params']}")
        if name != "params":
            figures[name] = parse_int(value, f"--model: {name}")
            continue
        try:
            figures[name] = float(value)
        except ValueError:
            raise InvalidArgumentError(f"--model: {name} must be a number, got {shown(value)}") from None
    missing = [n for n in ("hidden", "layers", "seq_len", "micro_batch", "params") if n not in figures]
    if missing:
        raise InvalidArgumentError(f"--model needs {missing}")
    return llm_step_traffic(sizes, **figures)


def load_topology(text: str) -> Topology:
    """A preset name, or the path of a JSON file ``{"tiers": [...]}`` (as `Topology.to_dict` writes).

    Examples:
        >>> load_topology("gb200_nvl72").unit_ranks
        (72,)
    """
    if text in PRESETS or not text.endswith(".json"):
        return Topology.preset(text)
    try:
        data = json.loads(pathlib.Path(text).read_text())
        return Topology([Tier(**tier) for tier in data["tiers"]])
    except (OSError, ValueError, KeyError, TypeError, RecursionError) as error:
        if isinstance(error, HyperGridError):
            raise
        said = first_line(error)
        raise InvalidArgumentError(f"--topology {shown(text)}: not a readable topology JSON ({said})") from None


def render_plans(plans: Sequence[Plan], topology: Topology, sizes: dict[str, int]) -> str:
    """The table: one line per plan, best first: seconds per step in all, and each family's share (seconds).

    Plans that cost the same are named below the table: each family's groups
    sit on the same tiers in their orders, so the model cannot tell them apart
    (typically a dim with no traffic, which may go anywhere among the others).
    """
    keys = list(dict.fromkeys(key for p in plans for key in p.families))
    tiers = "; ".join(
        f"{t.name}: {'x' + str(t.size) if t.size else 'outer'}, {t.bandwidth / 1e9:g} GB/s, {t.latency * 1e6:g} us"
        for t in topology.tiers
    )
    width = max([len("order (innermost first)"), *(len(",".join(p.order)) for p in plans)])
    columns = [f"{k} (s)" for k in keys]
    lines = [
        f"sizes {sizes} on tiers [{tiers}]: {len(plans)} plans, best first; seconds of communication per step",
        f"{'#':>3}  {'order (innermost first)':<{width}}  {'seconds':>10}  "
        + "  ".join(f"{c:>{max(10, len(c))}}" for c in columns),
    ]
    for index, p in enumerate(plans, 1):
        cells = "  ".join(f"{p.families.get(k, 0.0):>{max(10, len(c))}.4g}" for k, c in zip(keys, columns))
        lines.append(f"{index:>3}  {','.join(p.order):<{width}}  {p.seconds:>10.4g}  {cells}")
    idle = [dim for dim in sizes if not any(dim in key.split("-") for key in keys)]
    ties: dict[float, list[int]] = {}
    for index, p in enumerate(plans, 1):
        ties.setdefault(p.seconds, []).append(index)
    for seconds, numbers in ties.items():
        if len(numbers) > 1:
            why = f" ({', '.join(idle)} carr{'y' if len(idle) > 1 else 'ies'} no traffic)" if idle else ""
            lines.append(
                f"plans {', '.join(map(str, numbers))} tie at {seconds:.4g} s: every family's groups sit on the "
                f"same tiers in these orders{why}; any of them is as good"
            )
    return "\n".join(lines)


def plot_plans(plans: Sequence[Plan], path: pathlib.Path, title: str) -> None:
    """A stacked bar chart: one bar per plan (best left), one colour per family (needs matplotlib)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = list(dict.fromkeys(key for p in plans for key in p.families))
    figure, axes = plt.subplots(figsize=(max(6.0, 0.6 * len(plans) + 3), 4.5))
    labels = ["\n".join(p.order) for p in plans]
    bottom = [0.0] * len(plans)
    for index, key in enumerate(keys):
        heights = [p.families.get(key, 0.0) * 1e3 for p in plans]
        axes.bar(labels, heights, bottom=bottom, label=key, color=f"C{index % 10}")
        bottom = [b + h for b, h in zip(bottom, heights)]
    axes.set_ylabel("milliseconds per step")
    axes.set_xlabel("order, innermost on top")
    axes.set_title(title)
    axes.legend(title="family")
    axes.grid(True, axis="y", alpha=0.3)
    try:
        with writing(path, "--png"):
            figure.savefig(path, dpi=110, bbox_inches="tight")
    finally:
        plt.close(figure)


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``plan``; exit status 0, or 2 with one line on stderr for a bad argument or an unwritable output."""
    parser = OneLineParser(prog="python -m hypergrid plan", description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", required=True, help="dims and sizes, e.g. tp=8,dp=16")
    parser.add_argument("--topology", default="h100_8x", help=f"a preset {sorted(PRESETS)} or a JSON file")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--traffic", help="dims:op:bytes[:calls] entries separated by ','")
    source.add_argument("--model", help="llm_step_traffic figures: hidden=,layers=,seq_len=,micro_batch=,params=,...")
    parser.add_argument("--split", action="store_true", help="also split each dim into <dim>_intra x <dim>_inter")
    parser.add_argument("--top", help="keep the K best plans only (table, JSON and chart)")
    parser.add_argument("--json", type=pathlib.Path, help="write {'plans': [...]} here ('-' for stdout)")
    parser.add_argument("--png", type=pathlib.Path, help="write a stacked bar chart here (needs matplotlib)")
    args = parser.parse_args(argv)
    try:
        sizes = parse_sizes(args.sizes)
        topology = load_topology(args.topology)
        traffic = parse_traffic(args.traffic) if args.traffic is not None else parse_model(args.model, sizes)
        top = None if args.top is None else parse_int(args.top, "--top", 1)
        if args.json is not None and str(args.json) != "-":
            check_output(args.json, "--json")
        if args.png is not None:
            check_output(args.png, "--png")
            require_module("matplotlib", "--png")
        plans = plan(sizes, traffic, topology, split=args.split)[:top]
        data = {"sizes": sizes, "topology": topology.to_dict(), "plans": [p.to_dict() for p in plans]}
        if str(args.json) == "-":
            print(json.dumps(data, indent=1))
        else:
            print(render_plans(plans, topology, sizes))
            if args.json:
                write_text(args.json, json.dumps(data, indent=1) + "\n", "--json")
        if args.png:
            plot_plans(plans, args.png, f"{args.sizes} on {args.topology}")
    except HyperGridError as error:
        parser.error(str(error))
    return 0
