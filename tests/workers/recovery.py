"""Recovery under real failures (issue 23): spawned gloo ranks, production-like group timeouts, nobody names the dead.

Module-level functions so that ``spawn`` can import them. Every survivor
reports what it saw: the exception it caught (type, ``dead``, when), its
Regrid, and the result of a collective on the new grid. Times are wall-clock
(``time.time()``) so that they compare across processes: the victim writes the
moment of its death to the store before it kills itself.
"""

from __future__ import annotations

import datetime
import os
import signal
import subprocess
import sys
import time
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

import hypergrid.grid.recovery
from hypergrid import HyperCommGrid
from hypergrid.agreement.diagnosis import announce_key
from hypergrid.agreement.world import World
from hypergrid.errors import HyperGridError, RankFailure

#: Production-like: a collective waits this long before torch gives up on its own.
GROUP_TIMEOUT = datetime.timedelta(seconds=600)


def _grid(tp: int = 2) -> Any:
    grid = HyperCommGrid(
        [tp, dist.get_world_size() // tp],
        ["tp", "dp"],
        guard_timeout_s=60.0,
        group_options={"timeout": GROUP_TIMEOUT},
    )
    grid.create_pgs(["tp", "dp", ["dp", "tp"]])
    return grid


def _base() -> Any:
    """The job's first store (it outlives every world a shrink forms)."""
    return World.current().base_store


def _die(how: str) -> None:
    """Record the moment of death in the store, then die as ``how`` says."""
    _base().set(f"test/died/{dist.get_rank()}", repr(time.time()))
    if how == "sigkill":
        os.kill(os.getpid(), signal.SIGKILL)
    os._exit(17)


def _died_at(rank: int) -> float:
    return float(_base().get(f"test/died/{rank}").decode())


def _step(grid: Any) -> float:
    """One step of a tp x dp job: a tensor-parallel then a data-parallel reduction; the global sum of ones."""
    x = torch.ones(4)
    grid.all_reduce(x, "tp")
    grid.all_reduce(x, "dp")
    return float(x[0].item())


class KeyRecorder:
    """Every ``hypergrid/`` key this process writes through a store object, to check at the end that none is left;
    and every key hypergrid's own code writes (``outside``: those not under ``hypergrid/``, issue 53's one namespace).

    Patches the write methods of torch's store classes (the calls hypergrid makes from Python; torch's own
    C++ writes, its rendezvous keys, are not hypergrid's). A key is hypergrid's when the Python code that asked for
    the write is in the ``hypergrid`` package, past its pass-through store (`InterruptibleStore` writes what torch
    asks it to).
    """

    METHODS = ("set", "add", "append", "compare_set", "multi_set")
    PASS_THROUGH = "hypergrid.binding.interruptible"

    def __init__(self) -> None:
        self.written: list[tuple[Any, str]] = []
        self.outside: set[str] = set()
        for cls in (dist.TCPStore, dist.PrefixStore, dist.HashStore):
            for name in self.METHODS:
                original = getattr(cls, name)

                def record(store: Any, key: Any, *args: Any, _original: Any = original) -> Any:
                    mine = self._asked_by_hypergrid()
                    for one in key if isinstance(key, list) else [key]:
                        if str(one).startswith("hypergrid/"):
                            self.written.append((store, str(one)))
                        elif mine:
                            self.outside.add(str(one))
                    return _original(store, key, *args)

                setattr(cls, name, record)

    def _asked_by_hypergrid(self) -> bool:
        frame = sys._getframe(2)  # (above record: the caller of the store's method)
        while frame is not None and frame.f_globals.get("__name__") == self.PASS_THROUGH:
            frame = frame.f_back  # type: ignore[assignment]
        return frame is not None and str(frame.f_globals.get("__name__", "")).startswith("hypergrid.")

    def left(self, base: Any, busy: Any) -> list[str]:
        """The keys written that are still in their store; ``base`` (the main thread's connection to the job's
        store) looks up those written through ``busy``, the watcher's own connection, which is blocked in its wait."""
        return sorted({key for store, key in self.written if (base if store is busy else store).check([key])})


def sigkill_in_a_step(victim: int, steps: int = 3, at: int = 1) -> dict[str, Any]:
    """``victim`` SIGKILLs itself in step ``at``; the others catch RankFailure, shrink with no rank named, go on.

    At the end every survivor destroys its grid; every live rank then reports the ``hypergrid/`` keys it wrote
    that are still stored (none may be), and whether the guard announcements of every old rank are gone.
    """
    keys = KeyRecorder()
    grid = _grid()
    rank = dist.get_rank()
    old_store, base = c10d._get_default_store(), _base()
    out: dict[str, Any] = {"old_rank": rank}
    step = 0
    while step < steps:
        try:
            if step == at and rank == victim:
                _die("sigkill")
            time.sleep(0.2 if step == at else 0.0)  # the victim dies while the others are in their collectives
            _step(grid)
            step += 1
        except RankFailure as failure:
            caught = time.time()
            out.update(caught=type(failure).__name__, dead=failure.dead, cause=type(failure.__cause__).__name__)
            out["detect_s"] = caught - _died_at(victim)
            regrid = grid.shrink(dead=failure.dead or None, dim="dp")
            out["regrid"] = {"dead": list(regrid.dead), "retired": regrid.retired, "attempts": regrid.attempts}
            out["seconds"] = dict(regrid.seconds)
            if regrid.retired:
                return _left_behind(out, keys, old_store, base, None)
            grid = regrid.grid
            out["first"] = _step(grid)
            out["recovered_s"] = time.time() - _died_at(victim)
            step += 1
    out.update(world=dist.get_world_size(), shape=list(grid.shape), rank=dist.get_rank())
    grid.destroy()
    dist.barrier()
    if dist.get_rank() == 0:
        _base().set("test/done", "1")
    return _left_behind(out, keys, old_store, base, grid._core.registry.world._link)


def _left_behind(out: dict[str, Any], keys: KeyRecorder, old_store: Any, base: Any, busy: Any) -> dict[str, Any]:
    """Once every survivor destroyed its grid: the hypergrid keys still stored (none may be)."""
    base.wait(["test/done"])
    out["written"] = len({key for _, key in keys.written})
    out["outside"] = sorted(keys.outside)
    out["left"] = keys.left(base, busy)
    out["stored"] = sorted(key for key in base.list_keys() if key.startswith("hypergrid/"))  # torch's keys too
    out["announcements"] = [r for r in range(8) if old_store.check([announce_key(r)])]
    return out


#: Where ``die_in_shrink`` kills its second victim: a point of ``Recovery`` and what to patch there.
POINTS = ("before", "decider", "teardown", "reform", "recreate", "handshake", "step", "stop", "commit")


def die_in_shrink(first: int, second: int, point: str) -> dict[str, Any]:
    """``first`` dies in a step; ``second`` dies at ``point`` inside the survivors' shrink; the rest carry on.

    6 ranks, tp=2 x dp=3. Every survivor returns its Regrid (or the HyperGridError it got) and, when it is in
    the new grid, the sum of a collective over it.
    """
    grid = _grid()
    rank = dist.get_rank()
    base = _base()  # (a retired rank has no default group at its end)
    out: dict[str, Any] = {"old_rank": rank}
    if rank == second:
        _arm(point)
    try:
        if rank == first:
            _die("exit")
        time.sleep(0.3)
        _step(grid)
        out["no_failure"] = True
        return out
    except RankFailure as failure:
        out["caught_dead"] = failure.dead
    began = time.time()
    try:
        regrid = grid.shrink(dim="dp", timeout_s=6.0)
    except HyperGridError as error:
        out["error"] = f"{type(error).__name__}: {str(error).splitlines()[0]}"
        out["shrink_s"] = time.time() - began
        return out
    out["shrink_s"] = time.time() - began
    out["regrid"] = {"dead": list(regrid.dead), "retired": regrid.retired, "attempts": regrid.attempts}
    if not regrid.retired:
        out["world"] = dist.get_world_size()
        out["shape"] = list(regrid.grid.shape)
        out["sum"] = _step(regrid.grid)
        out["keys"] = list(map(str, regrid.grid.created_keys))
    if point == "stop" and base.add("test/survivors-done", 1) == 4:  # the stopped rank resumes after them all
        os.kill(int(base.get("test/stopped").decode()), signal.SIGCONT)
    return out


def _arm(point: str) -> None:
    """Make this rank die (``os._exit``) when its shrink reaches ``point``."""
    recovery = hypergrid.grid.recovery
    die = lambda *args, **kwargs: _die("exit")  # noqa: E731
    if point == "before":
        recovery.Recovery.agree = die  # type: ignore[method-assign]
    elif point == "decider":
        import hypergrid.agreement.membership as membership

        real = membership.MembershipRound.arrive

        def arrive_then_die(self: Any) -> bool:
            time.sleep(1.0)  # the last to arrive: the decider
            real(self)
            _die("exit")
            return False

        membership.MembershipRound.arrive = arrive_then_die  # type: ignore[method-assign]
    elif point == "teardown":
        real_abort = recovery.abort_groups

        def abort_then_die(*args: Any) -> None:
            real_abort(*args)
            _die("exit")

        recovery.abort_groups = abort_then_die  # type: ignore[attr-defined]
    elif point == "reform":
        recovery.reform_world = die  # type: ignore[attr-defined]
    elif point == "recreate":
        recovery.recreate = die  # type: ignore[attr-defined]
    elif point == "handshake":  # publishes its address for a family's group, dies before connecting to anyone
        real_recreate = recovery.recreate

        def recreate(*args: Any) -> None:
            c10d.ProcessGroupGloo = lambda store, *rest, **options: real_gloo(_DyingStore(store), *rest, **options)
            real_recreate(*args)

        real_gloo = c10d.ProcessGroupGloo
        recovery.recreate = recreate  # type: ignore[attr-defined]
    elif point == "step":  # dies where the others wait in the new world's first all-reduce
        recovery.Recovery.agree_step = die  # type: ignore[method-assign]
    elif point == "stop":  # stopped there instead (its connections stay open): resumed once every survivor is done
        # (`die_in_shrink`; 60 s at the latest, should a survivor never get there), it exits

        def stop(*args: Any) -> None:
            _base().set("test/stopped", str(os.getpid()))
            subprocess.Popen(["sh", "-c", f"sleep 60; kill -CONT {os.getpid()} 2>/dev/null"])
            os.kill(os.getpid(), signal.SIGSTOP)
            _die("exit")

        recovery.Recovery.agree_step = stop  # type: ignore[method-assign]
    elif point == "late":  # alive, but 3 s late into the new world (half of timeout_s, over torch's bound of 1.2 s)
        real_reform = recovery.reform_world

        def late_reform(*args: Any, **kwargs: Any) -> Any:
            recovery.reform_world = real_reform  # type: ignore[attr-defined]
            time.sleep(3.0)
            return real_reform(*args, **kwargs)

        recovery.reform_world = late_reform  # type: ignore[attr-defined]
    elif point == "commit":
        import hypergrid.agreement.barrier as barrier

        real_run = barrier.Barrier.run

        def run(self: Any) -> None:
            if self.prefix.startswith("hypergrid/elastic/") and self.prefix.endswith("/commit"):
                _die("exit")
            real_run(self)

        barrier.Barrier.run = run  # type: ignore[method-assign]


def stopped_and_resumed(victim: int) -> dict[str, Any]:
    """``victim`` is SIGSTOPped in a step; the others find it by the probe of their waits and recover without it.

    The new world's rank 0 then resumes the victim (SIGCONT), which must get an error from each grid call it
    makes, never a result.
    """
    grid = _grid()
    rank = dist.get_rank()
    out: dict[str, Any] = {"old_rank": rank}
    if rank == victim:
        _base().set("test/stopped", str(os.getpid()))
        os.kill(os.getpid(), signal.SIGSTOP)
        for attempt in ("all_reduce", "shrink", "create_pg"):  # resumed: the others went on without it
            try:
                if attempt == "all_reduce":
                    out["result"] = _step(grid)
                elif attempt == "shrink":
                    grid.shrink(timeout_s=5.0)
                    out["shrunk"] = True
                else:
                    grid.create_pg("tp", tag="late")
                    out["created"] = True
            except HyperGridError as error:
                out[attempt] = f"{type(error).__name__}: {str(error).splitlines()[0]}"
        return out
    time.sleep(0.3)
    try:
        _step(grid)
        out["no_failure"] = True
        return out
    except RankFailure as failure:
        out["dead"] = failure.dead
    regrid = grid.shrink(dim="dp", timeout_s=10.0)
    out["regrid"] = {"dead": list(regrid.dead), "retired": regrid.retired}
    if not regrid.retired:
        out["sums"] = [_step(regrid.grid) for _ in range(2)]
        if regrid.rank == 0:
            os.kill(int(_base().get("test/stopped").decode()), signal.SIGCONT)
        out["sums"].append(_step(regrid.grid))
    return out


def stopped_in_a_commit(victim: int) -> dict[str, Any]:
    """``victim`` is SIGSTOPped in the commit of a guarded creation; the others fail the creation naming it.

    A survivor then resumes it (SIGCONT): its ``create_pg`` must raise, never return a group, so that no two
    ranks leave the creation with different registries.
    """
    import hypergrid.agreement.guard as guard

    grid = HyperCommGrid([2, dist.get_world_size() // 2], ["tp", "dp"], guard_timeout_s=8.0)
    base = _base()
    rank = dist.get_rank()
    if rank == victim:
        real = guard.Barrier.run

        def stop_then_run(self: Any) -> None:
            base.set("test/stopped", str(os.getpid()))
            os.kill(os.getpid(), signal.SIGSTOP)
            real(self)

        guard.Barrier.run = stop_then_run  # type: ignore[method-assign]
    began = time.time()
    try:
        group = grid.create_pg("dp")
        out: dict[str, Any] = {"created": group is not None}
    except HyperGridError as error:
        out = {"error": type(error).__name__, "dead": getattr(error, "dead", None)}
    out["seconds"] = time.time() - began
    if rank != victim:
        if rank == 0:
            os.kill(int(base.get("test/stopped").decode()), signal.SIGCONT)
        base.wait(["test/victim-done"])
    else:
        base.set("test/victim-done", "1")
    return out


def slow_cleaner(victim: int, delay_s: float) -> dict[str, Any]:
    """``victim`` SIGKILLs itself in a step; the survivors shrink, and whoever deletes the old worlds' keys after
    the commit does so ``delay_s`` late, while the others already run a creation's guard round on the new world.

    Each survivor reports the sum of a real all-reduce over every dim of the new grid (its group created behind
    that guard round) and whether it was the late deleter.
    """
    real, late = hypergrid.grid.recovery.forget_keys, [False]

    def forget_late(store: Any, keys: Any) -> int:
        if keys:
            late[0] = True
            time.sleep(delay_s)
        return real(store, keys)

    hypergrid.grid.recovery.forget_keys = forget_late
    grid = HyperCommGrid(
        [2, dist.get_world_size() // 2], ["tp", "dp"], guard_timeout_s=12.0, group_options={"timeout": GROUP_TIMEOUT}
    )
    grid.create_pg("dp")
    dist.barrier()
    if dist.get_rank() == victim:
        _die("sigkill")
    try:
        _step(grid)
        return {"error": "a step went through with a dead rank"}
    except RankFailure as failure:
        regrid = grid.shrink(dead=failure.dead or None)
    if regrid.retired:
        return {"retired": True, "late": late[0]}
    size = dist.get_world_size()
    x = torch.tensor([float(dist.get_rank())])
    regrid.grid.all_reduce(x, ["dp", "tp"])  # a new family: a guard round over the whole new world
    regrid.grid.destroy()
    return {"retired": False, "late": late[0], "sum": float(x.item()), "expected": float(size * (size - 1) // 2)}


class _DyingStore(dist.Store):
    """A store that passes its writes and waits on, and ends the process at the first read (of a peer's address)."""

    def __init__(self, inner: Any) -> None:
        super().__init__()
        self.inner = inner

    def set(self, key: str, value: Any) -> None:
        self.inner.set(key, value)

    def get(self, key: str) -> bytes:
        _die("exit")
        raise AssertionError("unreachable")

    def wait(self, keys: list[str], timeout: Any = None) -> None:
        self.inner.wait(keys) if timeout is None else self.inner.wait(keys, timeout)

    def add(self, key: str, value: int) -> int:
        return int(self.inner.add(key, value))

    def check(self, keys: list[str]) -> bool:
        return bool(self.inner.check(keys))
