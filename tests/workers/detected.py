"""A worker under ``python -m hypergrid.run`` whose last rank dies where no operation of the others fails (issue 46).

    python -m hypergrid.run --standalone --nproc-per-node N tests/workers/detected.py PLACE OUT

``PLACE``: ``create`` (the last rank dies instead of joining the others' ``create_pg``: they wait in its guard
round, where nothing fails), ``step`` (it dies in a step's all-reduce), ``shrink`` (rank N-2 dies in a step; the
last rank dies as the survivors' shrink forms its world: it enters torch's ``init_process_group`` no more, the
others wait there), ``stop`` (the last rank SIGSTOPs itself instead of joining the ``create_pg``: not dead to the
agent; the probe's roll call finds it; once resumed it writes what it raised), ``agent`` (two nodes: node 1's
first worker SIGKILLs its agent, and node 1's workers die with it, while node 0's wait in a ``create_pg`` for them),
``hostlost`` (two nodes: node 0's first worker SIGKILLs its agent, the store's host, while every worker waits in a
``create_pg``; node 1's workers write what they raised, then let it through) or ``agentstop`` (two nodes: node 1's
first worker SIGSTOPs its agent and writes its pid to ``OUT/agent``; node 1's second worker dies in a step's
all-reduce; the test resumes the agent).
Every rank builds a ``[N]`` dp grid with production timeouts (groups 600 s, guard 300 s, ``HYPERGRID_PROBE_S`` as
the launcher's environment says); the victim writes the time of its death to ``OUT/killed``. Each survivor writes
``OUT/rank<R>.json``: what it raised and when (``shrink``: when its shrink returned, and the dead it names), and the
sum of an all-reduce on the grid its shrink made. ``HYPERGRID_DETECT_BACKEND=nccl``: NCCL, each rank on the GPU
of its ``RANK`` (``make gpu-check``'s ``death`` step, through benchmarks/detection.py).
"""

from __future__ import annotations

import datetime
import json
import os
import pathlib
import signal
import sys
import time
from typing import Any

import torch
import torch.distributed as dist

import hypergrid
from hypergrid.grid import recovery


def die(out: pathlib.Path, name: str = "killed") -> None:
    """Write the time, then SIGKILL this process."""
    (out / name).write_text(repr(time.time()))
    os.kill(os.getpid(), signal.SIGKILL)


def die_with_agent(out: pathlib.Path) -> None:
    """Its first worker SIGKILLs the agent (its parent); every worker of the node dies with it."""
    if os.environ.get("LOCAL_RANK") == "0":
        time.sleep(0.5)  # the other node's workers wait in their create_pg by now
        (out / "killed").write_text(repr(time.time()))
        os.kill(os.getppid(), signal.SIGKILL)
    time.sleep(60)  # the parent-death signal ends this
    os._exit(3)


def stop_agent(out: pathlib.Path) -> None:
    """On node 1: its first worker SIGSTOPs the agent (its parent), which then answers for nobody and relays nothing;
    its second worker dies 0.5 s later in a step."""
    if os.environ.get("LOCAL_RANK") == "0":
        (out / "agent").write_text(str(os.getppid()))
        os.kill(os.getppid(), signal.SIGSTOP)
    else:
        time.sleep(0.5)  # the others are inside the all-reduce by now
        die(out)


def stop_and_resume(grid: hypergrid.HyperCommGrid, out: pathlib.Path) -> int:
    """``stop``: the last rank SIGSTOPs itself (the agent sees no exit); once the test resumed it, what it raised."""
    time.sleep(0.5)
    (out / "pid").write_text(str(os.getpid()))
    (out / "killed").write_text(repr(time.time()))  # (stopped: what the survivors time their failure from)
    os.kill(os.getpid(), signal.SIGSTOP)
    seen: dict[str, object] = {"rank": dist.get_rank(), "resumed": True}
    try:
        grid.create_pg("dp", tag="late")
        seen["error"] = "no failure"
    except hypergrid.HyperGridError as error:
        seen.update(raised=type(error).__name__, said=str(error)[:400])
    (out / f"rank{dist.get_rank()}.json").write_text(json.dumps(seen))
    return 0


def die_forming(*args: Any, **kwargs: Any) -> None:
    """`recovery.reform_world`, patched in the last rank: the others are inside torch's wait for it by now."""
    time.sleep(0.5)
    die(pathlib.Path(sys.argv[2]))


def main() -> int:
    place, out = sys.argv[1], pathlib.Path(sys.argv[2])
    device = torch.device("cpu")
    if os.environ.get("HYPERGRID_DETECT_BACKEND", "gloo") == "nccl":
        device = torch.device("cuda", int(os.environ["RANK"]) % torch.cuda.device_count())  # (one host: two "nodes")
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", init_method="env://", device_id=device)
    else:
        dist.init_process_group("gloo", init_method="env://")
    rank, size = dist.get_rank(), dist.get_world_size()
    grid = hypergrid.HyperCommGrid([size], ["dp"], group_options={"timeout": datetime.timedelta(seconds=600)})
    grid.create_pgs(["dp"])
    grid.all_reduce(torch.ones(1, device=device), "dp")
    seen: dict[str, object] = {"rank": rank}
    first = size - 2 if place == "shrink" else size - 1
    if place == "agent":
        if os.environ.get("GROUP_RANK") == "1":
            die_with_agent(out)
    elif place == "hostlost" and os.environ.get("GROUP_RANK") == "0":
        die_with_agent(out)
    elif place == "agentstop" and os.environ.get("GROUP_RANK") == "1":
        stop_agent(out)
    elif place == "stop" and rank == first:
        return stop_and_resume(grid, out)
    elif rank == first:
        time.sleep(0.5)  # the others are inside the call by now
        die(out, "first" if place == "shrink" else "killed")
    try:
        if place in ("create", "agent", "stop", "hostlost"):
            grid.create_pg("dp", tag="late")  # the victim never comes
        else:
            grid.all_reduce(torch.ones(1, device=device), "dp")
        seen["error"] = "no failure"
    except hypergrid.RankFailure as failure:
        seen.update(raised=type(failure).__name__, dead=failure.dead, at=time.time(), said=str(failure)[:400])
    except hypergrid.StoreLostError as lost:  # (no world can be re-formed: the script ends, as a user's would)
        seen.update(raised=type(lost).__name__, at=time.time(), said=str(lost)[:400])
        (out / f"rank{rank}.json").write_text(json.dumps(seen))
        raise
    if place == "shrink" and rank == size - 1:
        patched: Any = recovery
        patched.reform_world = die_forming  # dies as the world forms
    regrid = grid.shrink(dead=seen.get("dead") or None, dim="dp", timeout_s=30)
    if place == "shrink":
        seen.update(
            dead=[dead for dead in regrid.dead if dead != size - 2],
            at=time.time(),
            attempts=regrid.attempts,
            seconds=regrid.seconds,
        )
    total = torch.ones(1, device=device)
    regrid.grid.all_reduce(total, "dp")
    seen["sum"] = total.item()
    regrid.grid.destroy()
    (out / f"rank{rank}.json").write_text(json.dumps(seen))
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
