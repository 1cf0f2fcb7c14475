"""World hygiene (issue 44): what a job leaves behind when it ends, fails or recovers: exit codes, stderr, keys.

Module-level functions: the targets of ``torch.multiprocessing`` processes
(``env://`` with rank 0 hosting the store) and of ``hypergrid.spawn``. Each
process sends its stderr (file descriptor 2, so torch's C++ warnings too) to
``<out>/rank<r>.err`` first thing, and writes what it saw to
``<out>/rank<r>.json``: the test reads both, for every rank.
"""

from __future__ import annotations

import datetime
import json
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

from hypergrid import HyperCommGrid
from hypergrid.errors import HyperGridError, RankFailure

#: Production-like: a collective waits this long before torch gives up on its own.
GROUP_TIMEOUT = datetime.timedelta(seconds=600)
#: The prefix of every key hypergrid writes to the job's store.
OURS = "hypergrid/"


def stderr_to(path: str | Path) -> None:
    """Send this process's file descriptor 2 (Python's and torch's C++ stderr) to ``path``."""
    fd = os.open(str(path), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, 2)
    os.close(fd)


def _env(rank: int, size: int, port: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(size))


def _write(out: str, rank: int, seen: dict[str, Any]) -> None:
    path = Path(out, f"rank{rank}.json")
    path.with_suffix(".tmp").write_text(json.dumps(seen, indent=1))
    path.with_suffix(".tmp").rename(path)


def _error(error: BaseException) -> dict[str, Any]:
    cause = error.__cause__
    return {
        "type": type(error).__name__,
        "hypergrid": isinstance(error, HyperGridError),
        "message": str(error),
        "cause": None if cause is None else type(cause).__name__,
        "at": time.time(),
    }


def _step(grid: Any, size: int) -> float:
    """A tp then a dp reduction of ones over the whole grid: ``size`` if every rank took part."""
    x = torch.ones(4)
    grid.all_reduce(x, "tp")
    grid.all_reduce(x, "dp")
    total = float(x[0].item())
    if total != size:
        raise AssertionError(f"a step summed {total}, not {size}")
    return total


# -- 1. the store host's SIGKILL ------------------------------------------------------------------------------------


def store_host_killed(rank: int, size: int, port: int, out: str, tp: int, kill_at: int) -> None:
    """``env://``, rank 0 hosting the store; every rank loops steps over a tp x dp grid; rank 0 SIGKILLs itself
    in step ``kill_at``. A survivor records each error its next calls raise (up to 3), then returns (a normal exit).
    """
    stderr_to(Path(out, f"rank{rank}.err"))
    _env(rank, size, port)
    dist.init_process_group("gloo", init_method="env://", timeout=GROUP_TIMEOUT)
    grid = HyperCommGrid([tp, size // tp], ["tp", "dp"], guard_timeout_s=60.0, group_options={"timeout": GROUP_TIMEOUT})
    grid.create_pgs(["tp", "dp"])
    seen: dict[str, Any] = {"errors": [], "steps": 0}
    step = 0
    while step < kill_at + 1000:
        try:
            if step == kill_at and rank == 0:
                Path(out, "killed").write_text(repr(time.time()))
                os.kill(os.getpid(), signal.SIGKILL)
            _step(grid, size)
            seen["steps"] += 1
            step += 1
            continue
        except HyperGridError as error:
            seen["errors"].append(_error(error))
            if not isinstance(error, RankFailure):
                break  # StoreLostError (or anything else that is not a peer's death): the job is over
        except Exception as error:  # torch's raw error: recorded, and the job is over
            seen["errors"].append(_error(error))
            break
        try:  # what a training loop does with a RankFailure: shrink
            grid = grid.shrink(dim="dp", timeout_s=10.0).grid
            seen["shrunk"] = True
            break
        except Exception as error:
            seen["errors"].append(_error(error))
            break
    _write(out, rank, seen)


# -- 2. a normal exit ---------------------------------------------------------------------------------------------


def normal_exit(rank: int, size: int, port: int, out: str, mode: str, host_first: bool, destroy: bool) -> None:
    """``env://``, rank 0 hosting the store: create a group over every rank, check an all_reduce, end, exit.

    ``mode``: ``"grid"`` (a ``HyperCommGrid`` and its ``create_pgs``) or ``"plain"`` (torch's ``new_group``, the
    control). ``destroy``: the grid's ``destroy()`` (grid mode) and ``destroy_process_group()``, else neither.
    ``host_first``: rank 0 (the store's host) exits first, the others 1 s later; else rank 0 exits 1 s after them.
    """
    stderr_to(Path(out, f"rank{rank}.err"))
    _env(rank, size, port)
    dist.init_process_group("gloo", init_method="env://", timeout=GROUP_TIMEOUT)
    x = torch.ones(2) * (rank + 1)
    grid = None
    if mode == "grid":
        grid = HyperCommGrid([size], ["dp"], guard_timeout_s=60.0)
        grid.create_pgs(["dp"])
        grid.all_reduce(x, "dp")
    else:
        dist.all_reduce(x, group=dist.new_group(list(range(size))))
    seen = {"sum": float(x[0].item()), "expected": float(size * (size + 1) // 2)}
    dist.barrier()
    if destroy:
        if grid is not None:
            grid.destroy()
        dist.destroy_process_group()
    _write(out, rank, seen)
    if (rank == 0) != host_first:
        time.sleep(1.0)


# -- 3. a roll call and a recovery under hypergrid.spawn ----------------------------------------------------------


def killed_then_recovered(out: str) -> dict[str, Any]:
    """The last rank SIGKILLs itself in a step; the others catch RankFailure, shrink, run a checked step, destroy."""
    rank, size = dist.get_rank(), dist.get_world_size()
    stderr_to(Path(out, f"rank{rank}.err"))
    grid = HyperCommGrid([1, size], ["tp", "dp"], guard_timeout_s=60.0, group_options={"timeout": GROUP_TIMEOUT})
    grid.create_pgs(["tp", "dp"])
    _step(grid, size)
    try:
        if rank == size - 1:
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(0.2)  # the victim dies while the others are in their collectives
        _step(grid, size)
        return {"error": "a step went through with a dead rank"}
    except RankFailure as failure:
        seen: dict[str, Any] = {"caught": type(failure).__name__, "dead": failure.dead, "message": str(failure)}
    regrid = grid.shrink(dead=seen["dead"] or None, dim="dp", timeout_s=30.0)
    seen["retired"] = regrid.retired
    if not regrid.retired:
        seen["first"] = _step(regrid.grid, size - 1)
        seen["world"] = dist.get_world_size()
        regrid.grid.destroy()
    return seen


# -- 4. keys left in the job's store ------------------------------------------------------------------------------


def _root_store() -> Any:
    """The job's TCPStore itself, under every prefix (the default group's, and any a shrink adds)."""
    store = c10d._get_default_store()
    while isinstance(store, dist.PrefixStore):
        store = store.underlying_store
    return store


def _store_barrier(store: Any, name: str, members: int) -> None:
    """Wait until ``members`` processes got here, through ``store`` alone (no process group)."""
    if store.add(f"test/barrier/{name}", 1) == members:
        store.set(f"test/barrier/{name}/done", "1")
    store.wait([f"test/barrier/{name}/done"], datetime.timedelta(seconds=60))


def _ours(store: Any) -> list[str]:
    """Every key of the job's store written by hypergrid (``hypergrid/``, under whatever prefix torch adds)."""
    return sorted(key for key in store.list_keys() if OURS in key)


def _ours_once_settled(store: Any, within_s: float = 15.0) -> list[str]:
    """`_ours` once it is empty, or as it is after ``within_s``: a roll call the watchers still conclude (the one a
    late rank's guard opened, answered by threads beside the main one) is deleted by its last reader, which may come
    after every rank's ``destroy`` returned; a key left for good still shows."""
    deadline = time.monotonic() + within_s
    while (left := _ours(store)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


def _attempt(call: Any) -> dict[str, Any]:
    began = time.time()
    try:
        call()
    except Exception as error:  # what was raised is the result
        return _error(error) | {"seconds": time.time() - began}
    return {"type": None, "seconds": time.time() - began}


def keys_after(case: str) -> dict[str, Any]:
    """4 ranks make a tp2 x dp2 grid and its families under ``case``, destroy it on every live rank, meet at a
    store barrier; rank 0 then lists every ``hypergrid/`` key left in the job's store, and checks that the listing
    sees a key of its own written through the default group's store.

    ``case``: ``"normal"`` (every creation succeeds, a checked all_reduce), ``"late"`` (rank 3 comes to
    ``create_pgs`` 6 s late, past the others' 3 s guard timeout) or ``"decider"`` (rank 3 comes last, 1 s late,
    and SIGKILLs itself as it would publish the round's verdict).
    """
    rank, size = dist.get_rank(), dist.get_world_size()
    root = _root_store()
    grid = HyperCommGrid([2, size // 2], ["tp", "dp"], guard_timeout_s=60.0 if case == "normal" else 3.0)
    seen: dict[str, Any] = {}
    if case == "decider" and rank == 3:
        from hypergrid.agreement import protocol

        def die(self: Any) -> Any:
            os.kill(os.getpid(), signal.SIGKILL)

        protocol.Round.decide = die  # type: ignore[method-assign]
    if rank == 3 and case != "normal":
        time.sleep(6.0 if case == "late" else 1.0)
    seen["create"] = _attempt(lambda: grid.create_pgs(["tp", "dp"]))
    if case == "normal":
        x = torch.ones(2)
        grid.all_reduce(x, ["tp", "dp"])
        seen["sum"] = float(x[0].item())
    seen["destroy"] = _attempt(grid.destroy)
    live = size - 1 if case == "decider" else size
    _store_barrier(root, "destroyed", live)
    if rank == 0:
        seen["left"] = _ours_once_settled(root)
        probe = "hypergrid/test/probe"  # the listing sees a key under the default group's prefix, as ours are
        c10d._get_default_store().set(probe, "1")
        seen["probe_listed"] = [key for key in _ours(root) if key.endswith(probe)]
        c10d._get_default_store().delete_key(probe)
    _store_barrier(root, "listed", live)
    return seen


# -- 5. a rank stopped inside its own shrink ----------------------------------------------------------------------


def _stop_soon(delay_s: float) -> None:
    """SIGSTOP this process ``delay_s`` from now (from a thread: the main thread is inside a call by then)."""

    def stop() -> None:
        time.sleep(delay_s)
        os.kill(os.getpid(), signal.SIGSTOP)

    threading.Thread(target=stop, name="test-stopper", daemon=True).start()


def stopped_in_shrink(stopped: int, shrink_timeout_s: float | None) -> dict[str, Any]:
    """The last rank SIGKILLs itself in a step; the survivors catch RankFailure and shrink. ``stopped`` goes into
    its shrink first (the others 1 s later) and is SIGSTOPped 0.2 s into it, while it waits there for them. The
    others must shrink without it and run a checked step on the new grid; the new rank 0 then resumes it
    (SIGCONT), and it must be told it is out (``FencedError``). ``shrink_timeout_s``: shrink's ``timeout_s``
    (``None``: its default). Errors are returned, never raised.
    """
    rank, size = dist.get_rank(), dist.get_world_size()
    root = _root_store()
    root.set(f"test/pid/{rank}", str(os.getpid()))
    grid = HyperCommGrid([1, size], ["tp", "dp"], guard_timeout_s=60.0, group_options={"timeout": GROUP_TIMEOUT})
    grid.create_pgs(["tp", "dp"])
    _step(grid, size)
    seen: dict[str, Any] = {"old_rank": rank}
    try:
        if rank == size - 1:
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(0.2)  # the victim dies while the others are in their collectives
        _step(grid, size)
        return seen | {"error": "a step went through with a dead rank"}
    except RankFailure as failure:
        seen.update(caught=type(failure).__name__, dead=failure.dead)
    if rank == stopped:
        _stop_soon(0.2)
    else:
        time.sleep(1.0)  # the stopped rank is first into shrink: stopped while it waits there for the others
    began = time.time()
    try:
        regrid = grid.shrink(dead=seen["dead"] or None, dim="dp", timeout_s=shrink_timeout_s)
    except Exception as error:  # a result, whatever it is
        return seen | {"shrink": _error(error), "shrink_s": time.time() - began}
    seen.update(shrink={"type": None, "dead": list(regrid.dead), "retired": regrid.retired})
    seen["shrink_s"] = time.time() - began
    if regrid.retired:
        return seen
    try:
        seen["first"] = _step(regrid.grid, dist.get_world_size())
        seen["world"] = dist.get_world_size()
    except Exception as error:
        return seen | {"step": _error(error)}
    if regrid.rank == 0:
        seen["resumed_at"] = time.time()
        os.kill(int(root.get(f"test/pid/{stopped}").decode()), signal.SIGCONT)
    regrid.grid.destroy()
    return seen
