"""Every wait hears the verdict; the stopped are fenced (issue 31 items 1 and 4): spawned gloo workers.

Module-level functions so that ``spawn`` can import them. Production-like
timeouts (guard rounds 300 s, groups 600 s): a wait that ends within seconds
heard the roll call's verdict, nothing else could end it. Each function is one
spawned world that lives through several failures, each absorbed by a
``shrink``; every survivor checks a real reduction on the grid it ends with.
"""

from __future__ import annotations

import datetime
import json
import os
import signal
import sys
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from hypergrid import Bridge, HyperCommGrid, HyperGridError, RankFailure
from hypergrid.agreement import diagnosis
from hypergrid.agreement.liveness import ended_key, wake_key
from hypergrid.agreement.watcher import Watcher
from hypergrid.agreement.world import World

#: Production-like bounds: no wait of these tests may end by them.
GUARD_TIMEOUT_S = 300.0
GROUP_TIMEOUT = datetime.timedelta(seconds=600)


def _grid(shape: list[int], names: list[str], offset: int = 0, spares: int = 0) -> HyperCommGrid:
    return HyperCommGrid(
        shape, names, offset, spares=spares, guard_timeout_s=GUARD_TIMEOUT_S, group_options={"timeout": GROUP_TIMEOUT}
    )


def _store() -> Any:
    """The job's store at its root (the test's own keys live there, whatever the world)."""
    return World.current().base_store


def _meet(name: str, ranks: list[int]) -> None:
    """A rendezvous on the store (never a collective: a failed world's connections are severed)."""
    store = _store()
    store.set(f"test/{name}/{dist.get_rank()}", "1")
    store.wait([f"test/{name}/{rank}" for rank in ranks], datetime.timedelta(seconds=60))


def _error_of(call: Callable[[], Any]) -> str | None:
    try:
        call()
    except HyperGridError as error:
        return type(error).__name__
    return None


def _reduced(grid: Any, dims: list[str]) -> float:
    """All-reduce ones over each of ``dims`` in turn: the product of their sizes, if every member took part."""
    x = torch.ones(3)
    for dim in dims:
        grid.all_reduce(x, dim)
    return float(x[0].item())


def _stop_self(name: str) -> None:
    """Note when, then SIGSTOP this process (a survivor SIGCONTs it once the others shrank past it)."""
    store = _store()
    store.set(f"test/{name}/pid", str(os.getpid()))
    store.set(f"test/{name}/at", repr(time.time()))
    os.kill(os.getpid(), signal.SIGSTOP)


def _learn_late(delay_s: float) -> None:
    """This rank's watcher learns that the others went on without it ``delay_s`` late: once resumed, the main
    thread is inside its next wait by then (the order that left a point-to-point wait blocked until the group's
    timeout, before fencing severed the rank's connections)."""
    real = Watcher._left_behind

    def late(watcher: Watcher, store: Any) -> bool:
        time.sleep(delay_s)
        return real(watcher, store)

    Watcher._left_behind = late  # type: ignore[method-assign]


def _resume(name: str) -> None:
    os.kill(int(_store().get(f"test/{name}/pid")), signal.SIGCONT)


def _since(name: str) -> float:
    return time.time() - float(_store().get(f"test/{name}/at"))


def _failure(failure: RankFailure, since: str, where: str) -> dict[str, Any]:
    return {"where": where, "dead": failure.dead, "seconds": _since(since), "type": type(failure).__name__}


def verdicts_in_guard_rounds() -> dict[str, Any]:
    """4 ranks, then 3: a verdict ends the guard rounds of every rank waiting there, twice.

    Round 1: rank 3 exits on an uncaught error (its interpreter's exit handler runs with the error) while ranks
    0-2 wait in a lazy ``create_pg``'s guard round; nobody else reports anything. Round 2 (world of 3): rank 2
    is SIGKILLed while rank 0 waits in a ``create_pgs`` round and rank 1 shrinks (its roll call names the dead).
    Every survivor shrinks and checks a reduction on the new grid; at the end the survivors destroy their grid
    and report the ``hypergrid/`` keys still stored.
    """
    grid = _grid([1, 4], ["tp", "dp"])
    grid.create_pg("dp")
    out: dict[str, Any] = {"old_rank": dist.get_rank(), "first": _reduced(grid, ["dp"])}
    _meet("round1", [0, 1, 2, 3])
    if dist.get_rank() == 3:
        time.sleep(0.5)  # the others wait in the round by then
        _store().set("test/gone/at", repr(time.time()))
        try:
            raise RuntimeError("the training step failed")
        except RuntimeError as error:
            sys.last_value = error  # what the interpreter sets for an uncaught error, before its exit handlers
        World.current()._at_exit()  # the exit handler
        os._exit(1)
    try:
        grid.create_pg("tp-dp")
        out["round1"] = {"error": "created with a rank gone"}
        return out
    except RankFailure as failure:
        out["round1"] = _failure(failure, "gone", "create_pg")
    grid = _shrunk(grid, out, "after1")
    _meet("round2", [0, 1, 2])
    rank = dist.get_rank()
    if rank == 2:
        time.sleep(0.5)
        _store().set("test/killed/at", repr(time.time()))
        os.kill(os.getpid(), signal.SIGKILL)
    if rank == 1:
        time.sleep(1.0)  # rank 2 is dead: this survivor's shrink runs the roll call that names it
    else:
        try:
            grid.create_pgs(["tp", "tp-dp"])
            out["round2"] = {"error": "created with a rank gone"}
            return out
        except RankFailure as failure:
            out["round2"] = _failure(failure, "killed", "create_pgs")
    grid = _shrunk(grid, out, "after2")
    grid.destroy()
    _meet("end", [0, 1])
    out["keys"] = sorted(key for key in _store().list_keys() if key.startswith("hypergrid/"))
    return out


def _shrunk(grid: Any, out: dict[str, Any], name: str) -> Any:
    """Shrink along ``dp``; record under ``name`` who died, the new world's size and a real reduction on it."""
    regrid = grid.shrink(dim="dp", timeout_s=30.0)
    out[name] = {"dead": list(regrid.dead), "world": dist.get_world_size(), "sum": _reduced(regrid.grid, ["dp"])}
    return regrid.grid


def _exchange(grid: Any) -> torch.Tensor:
    """One pipeline step along ``pp`` (first stage sends, last receives)."""
    received = torch.zeros(4)
    sent = torch.full((4,), float(grid.layout.coords_of(dist.get_rank())[1] + 1))  # the sender's dp slice, plus 1
    grid.exchange("pp", send_next=sent, recv_prev=received)
    return received


def stopped_p2p_senders() -> dict[str, Any]:
    """6 ranks, then 4, then 2: a SIGSTOPped sender in ``exchange``, then in a ``Bridge``, each stopped through the
    others' whole shrink and resumed after it.

    Round 1: a ``[2, 3]`` pp x dp grid; rank 0 (a first stage) stops before its step's send; rank 1 waits for it
    in ``exchange``, the only wait on it (the others wait on the store). The survivors shrink past it (``dp``
    slice 0 dropped: rank 1 retires, and stays alive), check a reduction, then resume rank 0, whose next calls
    must raise ``FencedError``: its watcher learns it was left behind 2 s late, so its first call (a backward
    receive from rank 1, which never sends) is already blocked then (the shrink closed rank 1's side of their
    connection; `fenced_inside_a_receive` has a peer that never does). Round 2, in the world of 4: a ``Bridge``
    dp2 (0, 1) -> dp2 (2, 3); after one transfer rank 0
    stops before the next; the others wait for it in the bridge; the same again. The last survivors destroy
    their grid and report the ``hypergrid/`` keys still stored.
    """
    grid = _grid([2, 3], ["pp", "dp"])
    grid.create_pgs(["pp", "dp"])
    rank = dist.get_rank()
    out: dict[str, Any] = {"old_rank": rank, "first": float(_exchange(grid)[0].item())}
    _meet("p2p", list(range(6)))
    if rank == 0:
        _learn_late(2.0)
        _stop_self("stopped1")
        backward = torch.zeros(4)  # its first call receives from rank 1, which never sends: only a severing ends it
        out["resumed"] = [
            _error_of(lambda: grid.exchange("pp", recv_next=backward)),
            _error_of(lambda: grid.all_reduce(torch.ones(1), "dp")),
        ]
        _store().set("test/stopped1/done", "1")
        return out
    time.sleep(0.3)  # rank 0 is stopped by then
    if rank == 1:  # the only rank waiting on rank 0, in a point-to-point receive: its own probe must find it
        try:
            _exchange(grid)
            out["round1"] = {"error": "a step went through with a stopped rank"}
            return out
        except RankFailure as failure:
            out["round1"] = _failure(failure, "stopped1", "exchange")
        _store().set("test/stopped1/seen", "1")
    else:  # their step needs no rank 0: they wait on the store (no probe of theirs) until rank 1 raised
        _exchange(grid)
        _store().wait(["test/stopped1/seen"], datetime.timedelta(seconds=60))
    grid = _shrink_past(grid, "stopped1", out, "after1")
    return out if grid is None else _bridge_round(grid, out)


def _shrink_past(grid: Any, name: str, out: dict[str, Any], key: str) -> Any:
    """Shrink past the stopped rank ``name``, check a reduction, then resume it and wait for its calls.

    The new grid, or None on a retired rank.
    """
    base = _store()  # a retired rank has no default group left to find it through
    regrid = grid.shrink(dim="dp", timeout_s=30.0)
    out[key] = {"dead": list(regrid.dead), "retired": regrid.retired}
    if regrid.retired:  # alive and connected until the stopped rank is done: its send to here blocks, never fails
        base.wait([f"test/{name}/done"], datetime.timedelta(seconds=60))
        return None
    out[key].update(world=dist.get_world_size(), sum=_reduced(regrid.grid, ["dp", "pp"]))
    if dist.get_rank() == 0:
        _resume(name)
    _store().wait([f"test/{name}/done"], datetime.timedelta(seconds=60))
    return regrid.grid


def _bridge_round(grid: Any, out: dict[str, Any]) -> dict[str, Any]:
    """Round 2 of `stopped_p2p_senders`, on the world of 4."""
    rank = dist.get_rank()
    bridge = Bridge(_grid([2], ["dp"]), _grid([2], ["dp"], 2))
    activation = torch.full((2, 3), float(rank))
    bridge.send_forward(activation) if rank < 2 else bridge.recv_forward()
    _meet("bridge", [0, 1, 2, 3])
    if rank == 0:
        _stop_self("stopped2")
        resumed = [_error_of(lambda: bridge.send_forward(activation)), _error_of(lambda: _reduced(grid, ["pp"]))]
        out["resumed2"] = resumed
        _store().set("test/stopped2/done", "1")
        return out
    time.sleep(0.3)
    try:
        received = bridge.send_forward(activation) if rank < 2 else bridge.recv_forward()
        out["round2"] = {"error": "a transfer went through with a stopped sender", "got": received}
        return out
    except RankFailure as failure:
        out["round2"] = _failure(failure, "stopped2", "bridge")
    bridge.destroy()
    grid = _shrink_past(grid, "stopped2", out, "after2")
    if grid is None:
        return out
    grid.destroy()
    _meet("end", [0, 1])
    out["keys"] = sorted(key for key in _store().list_keys() if key.startswith("hypergrid/"))
    return out


def stopped_spare() -> dict[str, Any]:
    """4 ranks: dp3 and a spare in ``standby``; the spare is SIGSTOPped, the others shrink past it (their roll call
    finds it gone), then resume it: its ``standby`` raises ``FencedError``."""
    grid = _grid([3], ["dp"], spares=1)
    grid.create_pg("dp")
    rank = dist.get_rank()
    _store().set(f"test/spare/pid/{rank}", str(os.getpid()))
    _meet("standby", [0, 1, 2, 3])
    if rank == 3:
        return {"standby": _error_of(grid.standby)}
    if rank == 0:
        time.sleep(0.5)  # the spare waits in standby by then
        os.kill(int(_store().get("test/spare/pid/3")), signal.SIGSTOP)
    _meet("stopped", [0, 1, 2])
    regrid = grid.shrink(dim="dp", policy="spares_then_drop", timeout_s=30.0)
    out = {"dead": list(regrid.dead), "world": dist.get_world_size(), "sum": _reduced(regrid.grid, ["dp"])}
    if dist.get_rank() == 0:
        os.kill(int(_store().get("test/spare/pid/3")), signal.SIGCONT)
    return out


def fenced_inside_a_receive() -> dict[str, Any]:
    """3 ranks along ``pp``; rank 1 waits in a receive from rank 0, which is alive, connected and never sends.

    Rank 2 then writes what the others' shrink writes for a rank they left behind (the world's end naming rank
    1) and wakes rank 1's watcher (its block's): rank 1 is fenced while it blocks, and its receive must end with
    ``FencedError`` (its peers never close their connections here, as a hung or cut-off peer would not).
    """
    grid = _grid([3], ["pp"])
    grid.create_pg("pp")
    rank, store = dist.get_rank(), _store()
    out: dict[str, Any] = {"rank": rank}
    if rank == 1:
        store.set("test/fence/waiting", "1")
        began = time.monotonic()
        out["error"] = _error_of(lambda: grid.exchange("pp", recv_prev=torch.zeros(2)))
        out["seconds"] = time.monotonic() - began
        store.set("test/fence/done", "1")
        return out
    store.wait(["test/fence/waiting"], datetime.timedelta(seconds=60))
    if rank == 2:
        time.sleep(0.5)  # rank 1 is inside its receive by then
        store.set(ended_key(0), json.dumps([1]))
        diagnosis.read(store, wake_key(0, 0, 1))  # wakes the watchers of ranks 0 to 2 (one block): 1 is named
    store.wait(["test/fence/done"], datetime.timedelta(seconds=60))
    return out
