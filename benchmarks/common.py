"""Helpers shared by the benchmarks (and the tests that run them): argument parsing, bandwidth arithmetic, output,
progress, a free port."""

from __future__ import annotations

import json
import pathlib
import re
import socket
import statistics
import sys
import time
from collections.abc import Sequence
from typing import Any, TextIO

ROOT = pathlib.Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

_UNITS = {"": 1, "B": 1, "K": 1024, "M": 1024**2, "G": 1024**3}
_STARTED = time.monotonic()  # when this process first imported the benchmarks' helpers

#: nccl-tests' bus-bandwidth factors: busbw = algbw * factor(n), n = group size.
BUS_FACTORS = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
}


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (for a store or a rendezvous that a child process hosts).

    Examples:
        >>> 0 < free_port() < 65536
        True
    """
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def parse_bytes(text: str) -> int:
    """``"1K"`` -> 1024, ``"64M"`` -> 67108864 (binary units, as nccl-tests).

    Examples:
        >>> parse_bytes("64M"), parse_bytes("8"), parse_bytes("1k")
        (67108864, 8, 1024)
    """
    match = re.fullmatch(r"\s*(\d+)\s*([BKMG]?)\s*", text.upper())
    if not match or int(match.group(1)) < 1:
        raise ValueError(f"expected a positive size such as 1K, 64M or 4096, got {text!r}")
    return int(match.group(1)) * _UNITS[match.group(2)]


def size_sweep(minbytes: int, maxbytes: int, stepfactor: int) -> list[int]:
    """Sizes from ``minbytes`` up to ``maxbytes``, multiplied by ``stepfactor`` each step.

    Examples:
        >>> size_sweep(1024, 8192, 2)
        [1024, 2048, 4096, 8192]
    """
    if minbytes > maxbytes:
        raise ValueError(f"minbytes {minbytes} is larger than maxbytes {maxbytes}")
    if stepfactor < 2:
        raise ValueError(f"stepfactor must be at least 2, got {stepfactor}")
    sizes = []
    size = minbytes
    while size <= maxbytes:
        sizes.append(size)
        size *= stepfactor
    return sizes


def bandwidths(op: str, size_bytes: int, seconds: float, group_size: int) -> tuple[float, float]:
    """``(algbw, busbw)`` in GB/s (1 GB = 1e9 bytes), the nccl-tests way.

    Examples:
        >>> algbw, busbw = bandwidths("all_reduce", 10**9, 1.0, 8)
        >>> algbw, busbw
        (1.0, 1.75)
    """
    algbw = size_bytes / seconds / 1e9
    return algbw, algbw * BUS_FACTORS[op](group_size)


def median(values: Sequence[float]) -> float:
    return float(statistics.median(values))


def write_json(path: pathlib.Path, records: list[dict[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(records, indent=1) + "\n")


def human_bytes(size: int) -> str:
    """``1024`` -> ``"1K"``.

    Examples:
        >>> human_bytes(1024), human_bytes(3 * 1024**2), human_bytes(100)
        ('1K', '3M', '100')
    """
    for unit in ("G", "M", "K"):
        if size % _UNITS[unit] == 0:
            return f"{size // _UNITS[unit]}{unit}"
    return str(size)


def progress(message: str, file: TextIO | None = None) -> None:
    """Print ``[elapsed] message`` to stderr at once: a long benchmark's progress, kept out of its stdout report.

    Args:
        message: what the benchmark is doing now, e.g. ``"family 3/15 (dp-tp)"``.
        file: where to print; standard error (as it is at the time of the call) by default.

    Examples:
        >>> progress("family 3/15 (dp-tp)", file=sys.stdout)  # doctest: +ELLIPSIS
        [...s] family 3/15 (dp-tp)
    """
    elapsed = time.monotonic() - _STARTED
    print(f"[{elapsed:7.1f}s] {message}", file=sys.stderr if file is None else file, flush=True)


def sync(device: Any) -> None:
    """Wait for the device's queued work (a no-op on the CPU), so that a timer measures the work itself."""
    if device.type == "cuda":
        import torch

        torch.cuda.synchronize(device)
