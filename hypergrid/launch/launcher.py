"""``python -m hypergrid.run``: torchrun's command line, run by an agent that keeps the survivors running.

The command line is torchrun's own parser (``torch.distributed.run``), plus ``--min-healthy`` and
``--exit-barrier-timeout``; the launch is torchrun's too (its launch config, rendezvous handler and worker spec),
with ``MinHealthyAgent`` in place of ``LocalElasticAgent``. Exit codes: 0 succeeded, 1 failed, 2 a bad command
line (``hypergrid.launch.flags``), 128 + N stopped by signal N; docs/launcher.md ("Exit codes and the summary")
says when each.
"""

from __future__ import annotations

import argparse
import os
import sys
import uuid
from collections.abc import Callable, Sequence
from typing import Any

import torch.distributed.elastic.rendezvous.registry as rdzv_registry
from torch.distributed import DistNetworkError
from torch.distributed.elastic import events
from torch.distributed.elastic.agent.server.api import WorkerSpec
from torch.distributed.elastic.metrics import initialize_metrics
from torch.distributed.elastic.metrics.api import MetricsConfig
from torch.distributed.elastic.multiprocessing import SignalException
from torch.distributed.elastic.rendezvous import RendezvousParameters
from torch.distributed.launcher.api import LaunchConfig, _get_addr_and_port
from torch.distributed.run import config_from_args, get_args_parser, parse_min_max_nnodes

from hypergrid.errors import InvalidArgumentError
from hypergrid.launch import orphans
from hypergrid.launch.agent import MinHealthyAgent, report
from hypergrid.launch.answerer import NodeWatchFactory
from hypergrid.launch.flags import OneLineParser, check_flags, flag_error
from hypergrid.launch.replacements import REPLACING_ENV
from hypergrid.timing import FOREVER_S
from hypergrid.values import described, first_line

__all__ = ["configure", "launch", "main", "parser"]

_USAGE, _FAILED, _SUCCEEDED = 2, 1, 0
#: ``--max-replacements``' default: workers one agent may start in place of dead ones, per round.
DEFAULT_MAX_REPLACEMENTS = 3


def parser() -> argparse.ArgumentParser:
    """torchrun's argument parser with hypergrid.run's flags added.

    Examples:
        >>> args = parser().parse_args(["--standalone", "--nproc-per-node", "4", "train.py", "--lr", "0.1"])
        >>> args.min_healthy, args.nproc_per_node, args.training_script, args.training_script_args
        (1, '4', 'train.py', ['--lr', '0.1'])
    """
    result = OneLineParser(
        prog="python -m hypergrid.run",
        description="torchrun whose agent keeps the surviving workers running when one dies: it restarts "
        "(or stops) them only when fewer than --min-healthy workers of the job are healthy. "
        "Every torchrun flag works as under torchrun. See docs/launcher.md.",
        parents=[get_args_parser()],
        conflict_handler="resolve",  # torchrun's -h/--help gives way to ours
        allow_abbrev=False,  # a misspelled flag (--nproc-per-nod) is refused, never taken for another
    )
    ours = result.add_argument_group("hypergrid.run")
    ours.add_argument(
        "--min-healthy",
        "--min_healthy",
        type=int,
        default=1,
        help="the job-wide minimum of healthy workers (not failed: running or exited 0); below it every "
        "worker is restarted (--max-restarts allowing) or stopped and the run fails. Default: 1 (the "
        "workers decide: a grid that cannot shrink raises on every survivor, and they exit non-zero)",
    )
    ours.add_argument(
        "--exit-barrier-timeout",
        "--exit_barrier_timeout",
        type=float,
        default=FOREVER_S,
        help="seconds an agent whose workers have all exited waits for the other agents' workers (it may host "
        f"the store they use). Default: {FOREVER_S:g} (a day)",
    )
    ours.add_argument(
        "--replace-dead",
        "--replace_dead",
        action="store_true",
        help="start a new worker in place of each one that dies (its rank reused, HYPERGRID_ARRIVAL=1 in its "
        "environment: the script calls grid.arrive and the grid grows back); see docs/elastic.md",
    )
    ours.add_argument(
        "--max-replacements",
        "--max_replacements",
        type=int,
        default=None,
        help=f"with --replace-dead: how many workers this node's agent starts in place of dead ones (per round). "
        f"Default: {DEFAULT_MAX_REPLACEMENTS}",
    )
    ours.add_argument(
        "--worker-watchers",
        "--worker_watchers",
        action="store_true",
        help="each worker answers the roll call for itself (a watcher thread and a store connection each), as under "
        "torchrun; by default this node's agent answers for all of its workers; see docs/launcher.md",
    )
    return result


def replacements_of(args: argparse.Namespace) -> int:
    """How many replacements this node's agent may start: 0 without ``--replace-dead``.

    Raises:
        InvalidArgumentError: ``--max-replacements`` without ``--replace-dead``, or below 1.

    Examples:
        >>> replacements_of(parser().parse_args(["--replace-dead", "--no-python", "train"]))
        3
        >>> replacements_of(parser().parse_args(["--no-python", "train"]))
        0
    """
    if args.max_replacements is not None and not args.replace_dead:
        raise flag_error("--max-replacements", args.max_replacements, "to come with --replace-dead")
    if not args.replace_dead:
        return 0
    count = DEFAULT_MAX_REPLACEMENTS if args.max_replacements is None else args.max_replacements
    if count < 1:
        raise flag_error("--max-replacements", count, "an int >= 1")
    return int(count)


def configure(args: argparse.Namespace) -> tuple[LaunchConfig, str, list[str]]:
    """torchrun's launch config from parsed arguments, with torchrun's defaults for ``--standalone``.

    Raises:
        InvalidArgumentError: a flag's value is bad (``hypergrid.launch.flags.check_flags``), or
            ``--min-healthy`` is below 1 or above the smallest world the job may have
            (``--nnodes`` minimum x ``--nproc-per-node``).

    Examples:
        >>> import tempfile
        >>> script = tempfile.NamedTemporaryFile(suffix=".py")
        >>> args = parser().parse_args(["--standalone", "--nproc-per-node", "2", script.name])
        >>> config, program, argv = configure(args)
        >>> config.rdzv_backend, config.min_nodes, config.nproc_per_node, argv[-1] == script.name
        ('c10d', 1, 2, True)
    """
    check_flags(args)
    replacements_of(args)
    if args.standalone or (args.rdzv_backend == "static" and not args.rdzv_endpoint and args.master_port is None):
        _, max_nodes = parse_min_max_nnodes(args.nnodes)
        if args.standalone or max_nodes == 1:  # torchrun's rule: one node needs no rendezvous server
            args.rdzv_backend, args.rdzv_endpoint, args.rdzv_id = "c10d", "localhost:0", str(uuid.uuid4())
    if args.master_port is None:
        args.master_port = 29500
    config, entrypoint, command_args = config_from_args(args)
    if not isinstance(entrypoint, str):  # --run-path: torchrun runs the script in its own process
        raise InvalidArgumentError("hypergrid.run: --run-path is not supported; it runs workers as processes")
    smallest = config.min_nodes * config.nproc_per_node
    if config.nproc_per_node < 1:  # a word torch counted: no device of that kind here
        raise flag_error("--nproc-per-node", args.nproc_per_node, f"a positive int (it counts {config.nproc_per_node})")
    if not 1 <= args.min_healthy <= smallest:
        raise flag_error(
            "--min-healthy",
            args.min_healthy,
            f"1..{smallest} (the smallest world this job may have: --nnodes minimum {config.min_nodes} x "
            f"--nproc-per-node {config.nproc_per_node})",
        )
    return config, entrypoint, [str(arg) for arg in command_args]


def launch(
    config: LaunchConfig,
    entrypoint: str,
    args: Sequence[str],
    *,
    min_healthy: int = 1,
    exit_barrier_timeout_s: float = FOREVER_S,
    on_death: Callable[[Any, str, list[str], int, str], object] | None = None,
    replace_dead: int = 0,
    node_watch: NodeWatchFactory | None = None,
) -> int:
    """Run ``entrypoint args`` on this node's workers under ``MinHealthyAgent``; the exit code.

    ``on_death``: the agent's announcer of a worker's death (``MinHealthyAgent``'s). ``replace_dead``: how many
    workers the agent may start in place of dead ones (`replacements_of`). ``node_watch``: what answers the roll
    call for this node's workers (``MinHealthyAgent``'s).

    torchrun's ``launch_agent``, with our agent: the same rendezvous handler, worker spec, metrics and events. Prints
    the summary (``MinHealthyAgent.summary``) on stderr before returning.

    Raises:
        InvalidArgumentError: the rendezvous backend does not share the agents' store with the
            workers (``use_agent_store`` False, e.g. ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``):
            worker rank 0 would host the store and take it with it when it dies.
    """
    if not config.run_id:
        config.run_id = str(uuid.uuid4().int)
    parameters = RendezvousParameters(
        backend=config.rdzv_backend,
        endpoint=config.rdzv_endpoint,
        run_id=config.run_id,
        min_nodes=config.min_nodes,
        max_nodes=config.max_nodes,
        local_addr=config.local_addr,
        **config.rdzv_configs,
    )
    try:
        master_addr, master_port = _get_addr_and_port(parameters)
        os.environ["TORCHELASTIC_SIGNALS_TO_HANDLE"] = config.signals_to_handle
        handler = rdzv_registry.get_rendezvous_handler(parameters)
    except ValueError as error:  # an unknown backend, an endpoint or config it cannot use
        raise flag_error(
            "--rdzv-backend",
            config.rdzv_backend,
            f"a rendezvous backend that accepts this --rdzv-endpoint and --rdzv-conf ({first_line(error)})",
        ) from None
    if not handler.use_agent_store:
        handler.shutdown()
        raise InvalidArgumentError(
            f"hypergrid.run: the rendezvous backend {config.rdzv_backend!r} does not share its store with the "
            "workers (use_agent_store is False; is TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 set?), so worker rank 0 "
            "would host the store and take it with it when it dies; use --rdzv-backend c10d or static"
        )
    command = orphans.wrap([entrypoint, *args])  # each worker ends with this agent, even a SIGKILLed one
    spec = WorkerSpec(
        role=config.role,
        local_world_size=config.nproc_per_node,
        entrypoint=command[0],
        args=tuple(command[1:]),
        rdzv_handler=handler,
        max_restarts=config.max_restarts,
        monitor_interval=config.monitor_interval,
        master_addr=master_addr,
        master_port=master_port,
        local_addr=config.local_addr,
        event_log_handler=config.event_log_handler,
        numa_options=config.numa_options,
        duplicate_stdout_filters=config.duplicate_stdout_filters,
        duplicate_stderr_filters=config.duplicate_stderr_filters,
        virtual_local_rank=config.virtual_local_rank,
    )
    if replace_dead:  # the workers inherit it: a retired rank may wait for the replacements (the elastic loop)
        os.environ[REPLACING_ENV] = str(replace_dead)
    agent = MinHealthyAgent(
        spec,
        config.logs_specs,  # type: ignore[arg-type]  # LaunchConfig fills it in __post_init__
        min_healthy=min_healthy,
        exit_barrier_timeout_s=exit_barrier_timeout_s,
        start_method=config.start_method,
        log_line_prefix_template=config.log_line_prefix_template,
        shutdown_timeout=config.shutdown_timeout or 30,
        on_death=on_death,
        replace_dead=replace_dead,
        node_watch=node_watch,
    )
    initialize_metrics(MetricsConfig(config.metrics_cfg))
    close_rendezvous, code = True, _FAILED
    try:
        result = agent.run()
        events.record(agent.get_event_succeeded(), config.event_log_handler)
        code = _FAILED if result is not None and result.is_failed() else _SUCCEEDED
    except SignalException as stop:
        # torchrun leaves the rendezvous open when its agent is signalled, so the job may carry on elsewhere
        close_rendezvous, code = False, 128 + int(stop.sigval)
        events.record(agent.get_event_failed(), config.event_log_handler)
        agent.record_stop(f"stopped: the launcher got {stop.sigval.name}")
    except DistNetworkError as error:  # the job's store is gone (its host died): nothing to close, nobody to tell
        close_rendezvous = False  # (closing it waits out torch's connect timeout, 30 s, and its retry)
        events.record(agent.get_event_failed(), config.event_log_handler)
        agent.record_stop(f"failed: the job's store is gone ({described(error)})")
    except Exception as error:
        events.record(agent.get_event_failed(), config.event_log_handler)
        agent.record_stop(f"failed: the agent raised {described(error)}")
    finally:
        if close_rendezvous:
            handler.shutdown()
    report(agent.summary())
    return code


def main(
    argv: Sequence[str] | None = None,
    on_death: Callable[[Any, str, list[str], int, str], object] | None = None,
    node_watch: NodeWatchFactory | None = None,
) -> int:
    """``python -m hypergrid.run [torchrun's flags] [--min-healthy N] SCRIPT [ARGS...]``; the exit code.

    A bad command line is one line on stderr naming the flag and its value, exit code 2. ``on_death``: what the
    agent runs the moment a worker fails (``hypergrid.run`` passes the survivors' roll call); ``node_watch``: what
    answers the roll call for the node's workers (``hypergrid.run`` passes ``NodeWatch``; ``--worker-watchers``
    leaves it out).
    """
    try:
        args = parser().parse_args(sys.argv[1:] if argv is None else list(argv))
    except SystemExit as stop:  # argparse: --help (0) or its one-line error (2)
        return stop.code if isinstance(stop.code, int) else _USAGE
    try:
        config, entrypoint, command_args = configure(args)
        return launch(
            config,
            entrypoint,
            command_args,
            min_healthy=args.min_healthy,
            exit_barrier_timeout_s=args.exit_barrier_timeout,
            on_death=on_death,
            replace_dead=replacements_of(args),
            node_watch=None if args.worker_watchers else node_watch,
        )
    except InvalidArgumentError as error:
        print(f"error: {error}", file=sys.stderr)
        return _USAGE
    except Exception as error:  # the launch could not start (e.g. the rendezvous endpoint is unreachable)
        report(f"failed before any worker started: {described(error)}")
        return _FAILED
