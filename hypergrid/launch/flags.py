"""``hypergrid.run``'s command line, checked flag by flag: a bad value is one line that names the flag and the value.

torchrun leaves the values to the code that uses them (``--nproc-per-node abc`` ends in a ``ValueError``
traceback, ``--nnodes 0`` and ``--max-restarts -3`` in an ``AssertionError`` one, argparse's own errors print the
whole usage block). `check_flags` looks at every value before anything starts, with torch's own parsers where
torch has one, and raises ``InvalidArgumentError`` with one line; `OneLineParser` makes argparse's errors one line
too. The launcher turns both into exit code 2 (docs/launcher.md, "Flags").
"""

from __future__ import annotations

import argparse
import math
import os
import re
import signal
from collections.abc import Callable
from typing import Any, NoReturn

from hypergrid.errors import InvalidArgumentError
from hypergrid.values import first_line, shown

__all__ = ["NPROC_WORDS", "OneLineParser", "check_flags", "flag_error"]

#: ``--nproc-per-node`` words torchrun turns into a count (one worker per CPU, GPU, XPU or accelerator).
NPROC_WORDS = ("cpu", "gpu", "xpu", "auto")
_PROG = "hypergrid.run"
_NNODES = re.compile(r"^\s*(\d+)\s*(?::\s*(\d+)\s*)?$")
_ENDPOINT = re.compile(r"^(?P<host>\[[^\]]+\]|[^:]+)(?::(?P<port>[^:]*))?$")


def flag_error(flag: str, value: object, expected: str) -> InvalidArgumentError:
    """The error for one flag: ``hypergrid.run: --flag VALUE; expected ...``.

    Examples:
        >>> str(flag_error("--nnodes", "0", "N or MIN:MAX with 1 <= MIN <= MAX"))
        "hypergrid.run: --nnodes '0'; expected N or MIN:MAX with 1 <= MIN <= MAX"
    """
    return InvalidArgumentError(f"{_PROG}: {flag} {shown(value)}; expected {expected}")


class OneLineParser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose errors are one line on stderr (no usage block), exit code 2."""

    def error(self, message: str) -> NoReturn:
        """Print ``error: hypergrid.run: message`` and exit 2 (argparse's message names the flag and the value)."""
        self.exit(2, f"error: {_PROG}: {message} (see --help)\n")


def _nnodes(value: str) -> None:
    match = _NNODES.match(value)
    low, high = (int(match[1]), int(match[2] or match[1])) if match else (0, 0)
    if not 1 <= low <= high:
        raise flag_error("--nnodes", value, "N or MIN:MAX, whole numbers with 1 <= MIN <= MAX")


def _nproc_per_node(value: str) -> None:
    word = value.strip()
    if word.isdigit() and int(word) >= 1:
        return
    if word in NPROC_WORDS:
        if word == "gpu" and not _available("cuda"):
            raise flag_error("--nproc-per-node", value, "a positive int ('gpu' needs CUDA, which is not available)")
        if word == "xpu" and not _available("xpu"):
            raise flag_error("--nproc-per-node", value, "a positive int ('xpu' needs an XPU, which is not available)")
        return
    raise flag_error("--nproc-per-node", value, f"a positive int or one of {', '.join(NPROC_WORDS)}")


def _available(device: str) -> bool:
    import torch

    module = getattr(torch, device, None)
    return bool(module is not None and module.is_available())


def _endpoint(flag: str, value: str) -> None:
    if not value:
        return
    match = _ENDPOINT.match(value.strip())
    port = match["port"] if match else None
    if match is None or (port is not None and not (port.isdigit() and 0 <= int(port) <= 65535)):
        raise flag_error(flag, value, "HOST or HOST:PORT with a port in 0..65535")


def _by_torch(flag: str, value: object, parse: Callable[[], object], expected: str) -> None:
    """Run one of torch's own parsers on ``value``; its failure, whatever the exception, becomes the flag's."""
    try:
        parse()
    except KeyError:  # a name torch does not know: its message is the name again
        raise flag_error(flag, value, expected) from None
    except Exception as error:
        raise flag_error(flag, value, f"{expected} ({first_line(error)})") from None


def _signals(value: str) -> None:
    names = [name.strip() for name in value.split(",")]
    unknown = [name for name in names if name not in signal.Signals.__members__]
    if unknown or not names:
        raise flag_error("--signals-to-handle", value, "signal names separated by commas, e.g. SIGTERM,SIGINT")


def _positive(seconds: float) -> bool:
    return math.isfinite(seconds) and seconds > 0


def _ints(flag: str, value: str, low: int) -> None:
    items = [item.strip() for item in value.split(",")]
    if not all(item.isdigit() and int(item) >= low for item in items):
        raise flag_error(flag, value, f"ints >= {low} separated by commas, e.g. 0,1")


def _torch_checks(args: argparse.Namespace) -> None:
    """The flags torch parses with a function of its own: the same function, its error on one line."""
    from torch.distributed.elastic.events.handlers import get_logging_handler
    from torch.distributed.elastic.multiprocessing import Std
    from torch.distributed.elastic.rendezvous.utils import _parse_rendezvous_config
    from torch.distributed.run import _get_logs_specs_class

    conf = "KEY=VALUE pairs separated by commas, e.g. join_timeout=600"
    _by_torch("--rdzv-conf", args.rdzv_conf, lambda: _parse_rendezvous_config(args.rdzv_conf), conf)
    std = "0-3, or LOCAL_RANK:0-3 pairs separated by commas"
    _by_torch("--redirects", args.redirects, lambda: Std.from_str(args.redirects), std)
    _by_torch("--tee", args.tee, lambda: Std.from_str(args.tee), std)
    if args.logs_specs is not None:
        specs = "the name of a 'torchrun.logs_specs' entry point"
        _by_torch("--logs-specs", args.logs_specs, lambda: _get_logs_specs_class(args.logs_specs), specs)
    handler = "one of console, dynamic_rendezvous, null"
    _by_torch(
        "--event-log-handler", args.event_log_handler, lambda: get_logging_handler(args.event_log_handler), handler
    )


def check_flags(args: argparse.Namespace) -> None:
    """Check every flag of a parsed ``hypergrid.run`` command line; ``InvalidArgumentError`` names the first bad one.

    ``--min-healthy`` is checked by ``hypergrid.launch.launcher.configure``
    (its range depends on ``--nnodes`` and ``--nproc-per-node``).

    Examples:
        >>> from hypergrid.launch.launcher import parser
        >>> check_flags(parser().parse_args(["--nproc-per-node", "4", "--no-python", "train"]))  # nothing to say
        >>> check_flags(parser().parse_args(["--max-restarts", "-3", "--no-python", "train"]))
        Traceback (most recent call last):
        ...
        hypergrid.errors.InvalidArgumentError: hypergrid.run: --max-restarts -3; expected an int >= 0
    """
    _nnodes(args.nnodes)
    _nproc_per_node(args.nproc_per_node)
    _endpoint("--rdzv-endpoint", args.rdzv_endpoint)
    if not args.rdzv_backend.strip():
        raise flag_error("--rdzv-backend", args.rdzv_backend, "a rendezvous backend, e.g. c10d or static")
    if not args.rdzv_id.strip():
        raise flag_error("--rdzv-id", args.rdzv_id, "a job id (any non-empty string)")
    numbers: list[tuple[str, Any, bool, str]] = [
        ("--max-restarts", args.max_restarts, args.max_restarts >= 0, "an int >= 0"),
        ("--monitor-interval", args.monitor_interval, _positive(args.monitor_interval), "a positive number of seconds"),
        ("--node-rank", args.node_rank, args.node_rank >= 0, "an int >= 0"),
        ("--master-port", args.master_port, args.master_port is None or 1 <= args.master_port <= 65535,
         "a port in 1..65535"),
        ("--shutdown-timeout", args.shutdown_timeout, args.shutdown_timeout is None or args.shutdown_timeout > 0,
         "a positive number of seconds"),
        ("--exit-barrier-timeout", args.exit_barrier_timeout, _positive(args.exit_barrier_timeout),
         "a positive number of seconds"),
    ]  # fmt: skip
    for flag, value, good, expected in numbers:
        if not good:
            raise flag_error(flag, value, expected)
    for flag, text in (("--role", args.role), ("--master-addr", args.master_addr)):
        if not text.strip():
            raise flag_error(flag, text, "a non-empty string")
    if args.local_addr is not None and not args.local_addr.strip():
        raise flag_error("--local-addr", args.local_addr, "a host name or address")
    if args.log_dir is not None and (not args.log_dir.strip() or os.path.isfile(args.log_dir)):
        raise flag_error("--log-dir", args.log_dir, "a directory (an existing file is not one)")
    if args.local_ranks_filter:
        _ints("--local-ranks-filter", args.local_ranks_filter, 0)
    _signals(args.signals_to_handle)
    _torch_checks(args)
    _script(args)


def _script(args: argparse.Namespace) -> None:
    """The training script: a file that exists, unless it is a module (``-m``) or a program (``--no-python``)."""
    script = args.training_script
    if args.module or args.no_python:
        if not script.strip():
            raise flag_error("training_script", script, "a module or program name")
        return
    if not os.path.isfile(script):
        raise flag_error("training_script", script, "the path of a Python script (no such file)")
