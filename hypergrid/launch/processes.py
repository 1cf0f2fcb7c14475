"""Start a small local process group: spawned workers on one host, or ``torchrun``'s env.

``spawn`` runs a function on ``nprocs`` new processes joined in one process group, with a hard timeout (its
docstring says the rest). The rendezvous store is hosted by the parent on ``127.0.0.1`` with a port chosen by the
OS, so concurrent launches never race for a port; a worker ends with the parent (``hypergrid.launch.orphans``) and
dumps its stack on ``SIGUSR1`` (``hypergrid.launch.stacks``).

``init_from_env`` is the ``torchrun`` path (``env://``): NCCL bound to the
local GPU when CUDA is present, gloo otherwise.
"""

from __future__ import annotations

import datetime
import os
import pickle
import queue as queue_module
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed import TCPStore  # type: ignore[attr-defined]  # public, not re-exported in stubs

from hypergrid.errors import BackendError, WorkerError, public
from hypergrid.launch.envstore import env_store
from hypergrid.launch.errorfile import record_uncaught_exceptions
from hypergrid.launch.memberlog import mark_formation
from hypergrid.launch.sockets import opened, snapshot, track
from hypergrid.launch.spawned import FENCED, HOST, RETURNED, UNPICKLABLE, LauncherStreams, start_context, worker
from hypergrid.launch.stacks import enable_stack_dumps, request_stack_dumps
from hypergrid.timing import Timing
from hypergrid.validation import check_bool, check_choice, check_int, check_str, refuse
from hypergrid.values import check_timeout, first_line

__all__ = ["default_device", "init_from_env", "spawn"]

#: The most workers ``spawn`` starts: local processes on one host (a larger number is refused, not attempted).
MAX_SPAWN = 1024
#: A backend argument as torch spells one: a name or ``device:backend`` pairs.
_BACKEND_TEXT = r"[A-Za-z0-9_]+(:[A-Za-z0-9_]+)?(,[A-Za-z0-9_]+:[A-Za-z0-9_]+)*"


@dataclass(frozen=True)
class WorkerDeath:
    """In ``spawn``'s results (with ``allow_deaths``): this rank died without reporting, or was fenced.

    ``fenced``: the ``FencedError`` the rank raised (the others declared it dead and went on without it, as a
    launcher would replace it), else None.
    """

    rank: int
    exitcode: int | None
    fenced: str | None = None


def default_device() -> torch.device:
    """The device collectives should use: the local GPU under NCCL, else the CPU.

    Examples:
        >>> default_device().type in ("cpu", "cuda")
        True
    """
    if dist.is_initialized() and dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


@public
def init_from_env(backend: str | None = None, timeout_s: float = 600.0) -> torch.device:
    """Initialize torch.distributed from ``torchrun``'s environment (``env://``).

    Chooses NCCL and binds the process to ``cuda:LOCAL_RANK`` (``device_id``, so
    communicators are created eagerly and ``split_group`` can be used) when CUDA
    is available, gloo otherwise.

    When ``HYPERGRID_STACK_DIR`` is set, the process also dumps its Python
    stack to ``$HYPERGRID_STACK_DIR/rank{RANK}.stack`` on ``SIGUSR1``
    (``enable_stack_dumps``); ``read_stack_dumps`` turns the dumps of a hung
    job into one report.

    The store is torch's ``env://`` rendezvous store. After a torchelastic
    restart (``TORCHELASTIC_RESTART_COUNT`` > 0) the default group's keys go
    under a prefix of that restart's own: the agent's store outlives the
    workers, and the keys a killed worker group left (a guard round cut
    short) would otherwise meet the restarted group's identical rounds.

    Under ``hypergrid.run`` it marks, in the round's log, when it begins forming the first world and when that
    world formed (docs/launcher.md, "A death before the first world formed").

    Under a torchelastic launcher (``TORCHELASTIC_ERROR_FILE`` set), an uncaught
    exception is also written to the worker's error file, as torch's ``@record``
    does, so ``hypergrid.run``'s summary names it (``record_uncaught_exceptions``).

    Returns:
        The device that collectives should use.

    Raises:
        BackendError: not a backend's name, or NCCL asked for without CUDA.
        InvalidArgumentError: a bad ``timeout_s``.
    """
    if backend is not None:
        check_str("init_from_env", "backend", backend, _BACKEND_TEXT, "None or a backend such as 'gloo' or 'nccl'")
    timeout = datetime.timedelta(seconds=check_timeout(timeout_s, "timeout_s"))
    enable_stack_dumps()
    record_uncaught_exceptions()  # under a launcher, its summary can say what this rank raised
    chosen = backend or ("nccl" if torch.cuda.is_available() else "gloo")
    if chosen == "nccl" and not torch.cuda.is_available():
        raise BackendError("backend 'nccl' needs CUDA devices, and torch.cuda.is_available() is False")
    store, rank, world_size = env_store(timeout)
    mark_formation("forming", store)
    if chosen == "nccl":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
        dist.init_process_group(
            "nccl", store=store, rank=rank, world_size=world_size, timeout=timeout, device_id=device
        )
        mark_formation("formed", store)  # (under hypergrid.run: a death before every worker got here ends the round)
        return device
    before = snapshot()
    dist.init_process_group(chosen, store=store, rank=rank, world_size=world_size, timeout=timeout)
    track(dist.group.WORLD, opened(before))  # severed if the world fails (a gloo abort)
    mark_formation("formed", store)
    return torch.device("cpu")


def _stop(processes: list[Any]) -> None:
    processes = [process for process in processes if process.pid is not None]  # started ones only
    for process in processes:
        if process.is_alive():
            process.terminate()
    for process in processes:
        process.join(timeout=5)
        if process.is_alive():
            process.kill()
            process.join()


@public
def spawn(
    fn: Callable[..., Any],
    nprocs: int,
    args: Sequence[Any] = (),
    *,
    backend: str = "gloo",
    timeout_s: float = 120.0,
    allow_deaths: bool = False,
    start_method: str | None = None,
) -> list[Any]:
    """Run ``fn(*args)`` on ``nprocs`` new processes joined in one process group.

    Each worker has torch.distributed initialized (``rank`` = its index, store
    hosted by the parent on 127.0.0.1) and ``RANK``, ``WORLD_SIZE``,
    ``LOCAL_RANK`` and ``LOCAL_WORLD_SIZE`` set. ``fn`` must be importable
    (a module-level function) and return something picklable: the worker
    pickles it before exiting, so tensors of any size and number come back
    (CUDA tensors on their device).

    Args:
        fn: the function each worker runs.
        nprocs: number of workers (the world size).
        args: positional arguments for ``fn``.
        backend: ``"gloo"`` (CPU) or ``"nccl"`` (one GPU per worker).
        timeout_s: hard limit for the whole run, in seconds, counted from
            the call. The workers' collectives and store waits time out
            10 x ``HYPERGRID_LIVENESS_S`` later (5 s: `hypergrid.timing.Timing.stop_s`), so that a hang is
            ended by this limit, which names every running rank with its stack, not by one rank's
            timeout racing it (equal, a deadlocked pair's send timed out in gloo first once workers started
            fast enough). After one worker failed, the others' exit codes get ``HYPERGRID_LIVENESS_S`` to
            land before the report.
        allow_deaths: for fault-injection tests: a worker that dies without
            reporting, or raises ``FencedError`` (the others declared it dead),
            yields a ``WorkerDeath`` in the results instead of stopping the
            run, so the other ranks' outcomes can be inspected.
        start_method: ``"forkserver"`` (the default where the platform has
            it: Linux, macOS) forks each worker from one server process
            that imported torch and hypergrid once, at this process's first
            ``spawn``: a fresh interpreter spends over a second of CPU per
            worker importing torch. ``"spawn"`` (the default elsewhere)
            starts a fresh interpreter per worker. Either way a worker gets
            this process's environment, stdout and stderr as at the call, and a script's
            ``__main__`` is run again (it needs its ``__name__`` guard); NCCL
            works under both (the server never initializes CUDA). A forked
            worker ends with ``os._exit`` after ``fn`` and
            ``destroy_process_group``: its ``atexit`` handlers do not run.
            Choose ``"spawn"`` when ``fn`` relies on them, or when what torch
            reads at its import must come from this call's environment
            (``hypergrid.launch.spawned``).

    Returns:
        ``fn``'s return value from every rank, indexed by rank.

    Raises:
        WorkerError: a worker raised (its rank and traceback are in the message),
            returned a value that cannot be pickled (pickle's error is quoted),
            died without a word (its exit code; unless ``allow_deaths``), or the
            run passed ``timeout_s`` (the ranks that had not finished are named,
            each with its current Python stack). No worker is left running.
        InvalidArgumentError: a ``start_method`` this platform does not
            have (one of ``"forkserver"``, ``"spawn"``), or a bad
            ``HYPERGRID_LIVENESS_S`` or ``HYPERGRID_PROBE_S``.

    Examples:
        >>> spawn(dist.get_world_size, 2)
        [2, 2]
        >>> spawn(dist.get_world_size, 2, start_method="spawn")
        [2, 2]
    """
    _check_function(fn)
    check_int("spawn", "nprocs", nprocs, 1, MAX_SPAWN)
    if not isinstance(args, (tuple, list)):
        raise refuse("spawn", "args", args, "a tuple or list of fn's positional arguments")
    backend = check_choice("spawn", "backend", backend, ["gloo", "nccl"], BackendError)
    if backend == "nccl" and not torch.cuda.is_available():
        raise BackendError("backend 'nccl' needs CUDA devices, and torch.cuda.is_available() is False")
    timeout_s = check_timeout(timeout_s, "timeout_s")
    allow_deaths = check_bool("spawn", "allow_deaths", allow_deaths)
    timing = Timing.from_env()  # this call's environment, as its workers get it
    context = start_context(start_method)
    store = TCPStore(HOST, 0, is_master=True, wait_for_workers=False, timeout=datetime.timedelta(seconds=timeout_s))
    streams = LauncherStreams() if context.get_start_method() == "forkserver" else None
    results = context.Queue()
    stack_dir = tempfile.mkdtemp(prefix="hypergrid-stacks-")
    processes = [
        context.Process(
            target=worker,
            args=(
                os.getpid(),
                dict(os.environ),
                streams,
                rank,
                nprocs,
                store.port,
                backend,
                timeout_s + timing.stop_s,
                fn,
                tuple(args),
                results,
                stack_dir,
            ),
            name=f"hypergrid-rank{rank}",
        )
        for rank in range(nprocs)
    ]
    deadline = time.monotonic() + timeout_s  # (before any worker starts: it outlasts each of their timeouts)
    try:
        for process in processes:
            process.start()
        values = _collect(processes, results, timeout_s, deadline, allow_deaths, stack_dir, timing.liveness_s)
    finally:
        _stop(processes)
        shutil.rmtree(stack_dir, ignore_errors=True)
    return [values[rank] for rank in range(nprocs)]


def _check_function(fn: object) -> None:
    """``fn`` must be a callable the workers can import: pickled by reference (a module-level function)."""
    if not callable(fn):
        raise refuse("spawn", "fn", fn, "a module-level function")
    try:
        pickle.dumps(fn, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as error:  # a lambda, a local function, a bound method of an unpicklable object
        expected = f"a module-level function the workers can import ({first_line(error)})"
        raise refuse("spawn", "fn", fn, expected) from None


def _collect(
    processes: list[Any],
    results: Any,
    timeout_s: float,
    deadline: float,
    allow_deaths: bool,
    stack_dir: str,
    settle_s: float,
) -> dict[int, Any]:
    """Gather every worker's value; raise on the first failure, silent death or ``deadline`` (``timeout_s`` in all).

    ``settle_s``: how long an exit code may take to land after a worker failed, or its message after it exited.
    """
    nprocs = len(processes)
    values: dict[int, Any] = {}
    exited_at: dict[int, float] = {}  # ranks seen exited without a message, and when
    while len(values) < nprocs:
        try:
            rank, outcome, value = results.get(timeout=0.2)
        except queue_module.Empty:
            for gone in _silent_deaths(processes, values, exited_at, settle_s):
                if not allow_deaths:
                    raise WorkerError(_describe_deaths([gone], processes), rank=gone) from None
                values[gone] = WorkerDeath(gone, processes[gone].exitcode)
            if time.monotonic() > deadline and len(values) < nprocs:
                raise _timed_out(processes, values, timeout_s, stack_dir) from None
            continue
        if outcome == RETURNED:
            values[rank] = _unpickled(rank, nprocs, value)
            continue
        if outcome == FENCED and allow_deaths:  # as good as dead to the others: their results stand
            said = str(value).strip().splitlines()
            values[rank] = WorkerDeath(rank, None, said[-1] if said else "FencedError")
            continue
        if outcome == UNPICKLABLE:
            raise WorkerError(
                f"rank {rank} of {nprocs} returned a value that cannot be pickled, so spawn cannot hand it back: "
                f"{value} (return plain data: tensors, numbers, lists, dicts, instances of importable classes)",
                rank=rank,
                remote_traceback=value,
            )
        # A peer's crash is often why this rank failed: let its exit code land, name it first.
        time.sleep(settle_s)
        dead = [r for r, p in enumerate(processes) if r not in values and r != rank and p.exitcode not in (None, 0)]
        cause = f"{_describe_deaths(dead, processes)}; then " if dead else ""
        raise WorkerError(
            f"{cause}rank {rank} of {nprocs} failed:\n{value}",
            rank=dead[0] if dead else rank,
            remote_traceback=value,
        )
    return values


def _unpickled(rank: int, nprocs: int, payload: bytes) -> Any:
    try:
        return pickle.loads(payload)
    except Exception as error:
        raise WorkerError(
            f"rank {rank} of {nprocs} returned a value this process cannot unpickle: "
            f"{type(error).__name__}: {error} (is its class importable here?)",
            rank=rank,
        ) from error


def _timed_out(processes: list[Any], values: dict[int, Any], timeout_s: float, stack_dir: str) -> WorkerError:
    """The timeout's error: the ranks still running, each with its Python stack."""
    nprocs = len(processes)
    missing = [r for r in range(nprocs) if r not in values]
    running = {r: processes[r].pid for r in missing if processes[r].is_alive()}
    stacks = request_stack_dumps(running, stack_dir) if running else ""
    where = f"; where the running ranks are (most recent call last):\n{stacks}" if stacks else ""
    return WorkerError(f"timed out after {timeout_s:g} s waiting for rank(s) {missing} of {nprocs}{where}")


def _silent_deaths(
    processes: list[Any], values: dict[int, Any], exited_at: dict[int, float], settle_s: float
) -> list[int]:
    """Ranks whose process exited without sending anything, past a grace period (``settle_s``).

    A worker's message is written before it exits, but may still be in the pipe
    when the exit is seen: only a rank exited for longer than the grace period
    without a message is dead.
    """
    now = time.monotonic()
    dead = []
    for rank, process in enumerate(processes):
        if rank in values or process.exitcode is None:
            continue
        if now - exited_at.setdefault(rank, now) > settle_s:
            dead.append(rank)
    return dead


def _describe_deaths(dead: list[int], processes: list[Any]) -> str:
    codes = [processes[rank].exitcode for rank in dead]
    if len(dead) == 1:
        return f"rank {dead[0]} of {len(processes)} died with exit code {codes[0]} before reporting"
    return f"ranks {dead} of {len(processes)} died with exit codes {codes} before reporting"
