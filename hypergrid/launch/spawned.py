"""The worker side of ``spawn``: how a worker is started, tied to its launcher, and what it reports.

``spawn`` starts its workers from a forkserver that imported torch and the grid once (`PRELOAD`), or a fresh
interpreter each: why, what it costs and what a forked worker inherits are in docs/api.md ("How workers start").
Each worker takes the launcher's environment at the call (`worker`), its stdout and stderr (`LauncherStreams`),
and ends with the launcher (`tie_to_launcher`: docs/design/launcher.md, "Workers end with their agent").
"""

from __future__ import annotations

import datetime
import os
import pickle
import sys
import traceback
from collections.abc import Callable, Sequence
from multiprocessing import reduction
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed import TCPStore  # type: ignore[attr-defined]  # public, not re-exported in stubs

from hypergrid.errors import FencedError
from hypergrid.launch.orphans import tie_to_parent
from hypergrid.launch.sockets import opened, snapshot, track
from hypergrid.launch.stacks import enable_stack_dumps
from hypergrid.validation import check_choice

__all__ = [
    "START_METHODS",
    "LauncherStreams",
    "adopt_streams",
    "pickled",
    "start_context",
    "tie_to_launcher",
    "worker",
]

#: Where the launcher hosts the store.
HOST = "127.0.0.1"
# What a worker's message says: it raised, it returned (pickled bytes follow), its value cannot be pickled, or it was
# fenced (the others declared it dead and went on without it: it raised FencedError).
FAILED, RETURNED, UNPICKLABLE, FENCED = "failed", "returned", "unpicklable", "fenced"

#: How ``spawn`` may start its workers, in order of preference: ``None`` picks the first this platform has.
START_METHODS = ("forkserver", "spawn")
#: What the forkserver imports once, so that no worker forked from it imports them again: torch's ``_dynamo`` too,
#: which a process's first optimizer imports (1.3 s of CPU each: 4 s of a 6-worker job's first step on 2 cores),
#: and hypergrid's grid (a missing module is skipped: multiprocessing ignores its ImportError).
PRELOAD = ("torch", "torch.distributed", "torch.multiprocessing", "torch._dynamo", "hypergrid", "hypergrid.grid")


def start_context(start_method: str | None) -> Any:
    """The multiprocessing context that starts ``spawn``'s workers.

    Raises:
        InvalidArgumentError: not one of ``START_METHODS`` this platform has.

    Examples:
        >>> start_context("spawn").get_start_method()
        'spawn'
        >>> start_context("fork")
        Traceback (most recent call last):
          ...
        hypergrid.errors.InvalidArgumentError: spawn: start_method='fork': expected one of 'forkserver', 'spawn'
    """
    available = [method for method in START_METHODS if method in mp.get_all_start_methods()]
    chosen = check_choice("spawn", "start_method", available[0] if start_method is None else start_method, available)
    context = mp.get_context(chosen)
    if chosen == "forkserver":
        context.set_forkserver_preload(list(PRELOAD))  # read once, when this process's server starts
    return context


class LauncherStreams:
    """The launcher's stdout and stderr as they are at the call, for a worker forked from the server.

    A forked worker inherits the server's file descriptors 1 and 2, which are the launcher's at its *first* ``spawn`` (a
    test's capture, a log file since reopened); a fresh interpreter inherits the launcher's at its own start. Pickled
    into the worker's arguments, this hands the launcher's current ones over as multiprocessing hands a connection over
    (``reduction.DupFd``); ``adopt_streams`` puts them in place.
    """

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return _received, tuple((fd, reduction.DupFd(fd)) for fd in (1, 2) if _is_open(fd))


def _is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True


def _received(*streams: tuple[int, Any]) -> list[tuple[int, int]]:
    """In the worker: (the launcher's descriptor number, this worker's copy of it) for each stream handed over."""
    return [(target, wrapped.detach()) for target, wrapped in streams]


def adopt_streams(streams: list[tuple[int, int]] | None) -> None:
    """Make the launcher's stdout and stderr this worker's (``LauncherStreams``; None: inherited already)."""
    for target, fd in streams or []:
        if fd != target:
            os.dup2(fd, target)
            os.close(fd)


def tie_to_launcher(launcher: int) -> None:
    """End this worker when ``launcher`` (the process that called ``spawn``) dies, however it was started.

    Started by ``spawn``, its parent is the launcher: the kernel's parent-death signal (``tie_to_parent``). Forked by
    the launcher's forkserver, its parent is the server: the signal ties it to the server, and this worker closes its
    copy of the server's keep-alive pipe, so that the server ends with the launcher (its pipe then closes, however the
    launcher died) and this worker with the server.
    """
    keep_alive = _server_keep_alive()
    if keep_alive is None:
        tie_to_parent(launcher)
        return
    tie_to_parent(os.getppid())  # the server: alive, since this worker still holds its pipe open
    os.close(keep_alive)
    sys.modules["multiprocessing.forkserver"]._forkserver._forkserver_alive_fd = None  # closed: never used again


def _server_keep_alive() -> int | None:
    """This process's copy of its forkserver's keep-alive pipe (a worker forked by one), else None.

    multiprocessing hands each forked worker the pipe so that the worker could use the same server (a private attribute,
    the same from Python 3.7 to 3.13); a worker that starts processes of its own starts a server of its own anyway,
    since it never started that one.
    """
    module = sys.modules.get("multiprocessing.forkserver")  # imported in every process a server forked
    server = getattr(module, "_forkserver", None)
    keep_alive = getattr(server, "_forkserver_alive_fd", None)
    return keep_alive if isinstance(keep_alive, int) else None


def worker(
    launcher: int,
    environment: dict[str, str],
    streams: list[tuple[int, int]] | None,
    rank: int,
    nprocs: int,
    port: int,
    backend: str,
    waits_s: float,
    fn: Callable[..., Any],
    args: Sequence[Any],
    results: Any,
    stack_dir: str,
) -> None:
    """One rank of ``spawn``: tied to its launcher, with its environment and streams, joined to the group; runs ``fn``.

    What ``fn`` returned (pickled here), or the traceback of what it raised, goes on ``results``. ``waits_s``: the
    timeout of its collectives and store waits, longer than ``spawn``'s own limit (``spawn`` says by how much).
    """
    tie_to_launcher(launcher)  # a SIGKILLed parent leaves no worker behind
    adopt_streams(streams)  # the launcher's stdout and stderr at the call
    os.environ.clear()  # the launcher's environment at the call (a forkserver's is the one it started with)
    os.environ.update(environment)
    os.environ.update(
        RANK=str(rank),
        WORLD_SIZE=str(nprocs),
        LOCAL_RANK=str(rank),
        LOCAL_WORLD_SIZE=str(nprocs),
        MASTER_ADDR=HOST,
        MASTER_PORT=str(port),
    )
    try:
        enable_stack_dumps(stack_dir, rank)
        timeout = datetime.timedelta(seconds=waits_s)
        store = TCPStore(HOST, port, is_master=False, timeout=timeout)
        device_id = None
        if backend == "nccl":
            device_id = torch.device("cuda", rank % torch.cuda.device_count())
            torch.cuda.set_device(device_id)
        before = snapshot()
        dist.init_process_group(
            backend, store=store, rank=rank, world_size=nprocs, timeout=timeout, device_id=device_id
        )
        track(dist.group.WORLD, opened(before))  # severed if the world fails (a gloo abort)
        # Every rank's connections are up before any runs ``fn``: a rank that returned at once and exited would close
        # its side under a peer still in gloo's connectFullMesh ("Connection closed by peer": once in a make test).
        dist.barrier()
        value = fn(*args)
    except FencedError:
        results.put((rank, FENCED, traceback.format_exc()))
    except BaseException:
        results.put((rank, FAILED, traceback.format_exc()))
    else:
        results.put(pickled(rank, value))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def pickled(rank: int, value: Any) -> tuple[int, str, Any]:
    """The worker's message: its value as pickled bytes, or why it cannot be pickled.

    Pickled here, while the worker lives: a tensor put on the queue as it is would travel as shared memory that the
    parent may still be mapping when the worker exits.
    """
    try:
        return rank, RETURNED, pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as error:
        return rank, UNPICKLABLE, f"{type(error).__name__}: {error}"
