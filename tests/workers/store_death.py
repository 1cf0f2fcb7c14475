"""The job's store dies with rank 0 (issue 31, item 5): a plain ``env://`` launch, rank 0 hosting the TCPStore.

Not ``hypergrid.spawn`` (its parent hosts the store): `run` is the target of
a ``torch.multiprocessing`` process, and each survivor writes what its next
grid calls raised to ``<out>/rank<r>.json``.
"""

from __future__ import annotations

import datetime
import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from hypergrid import HyperCommGrid


def _attempt(call: Any) -> dict[str, Any]:
    try:
        call()
    except BaseException as error:  # what was raised is the result
        cause = error.__cause__
        return {
            "type": type(error).__name__,
            "hypergrid": type(error).__module__.startswith("hypergrid"),
            "message": str(error).splitlines()[0] if str(error) else "",
            "cause": None if cause is None else type(cause).__name__,
        }
    return {"type": None}


def run(rank: int, size: int, port: int, out: str, watch: str = "1", spares: int = 0) -> None:
    """Join the job (rank 0 hosts the store), make a grid, then rank 0 SIGKILLs itself and the others carry on.

    ``watch``: ``HYPERGRID_WATCH`` (``"0"``: no watcher, so only the main thread's store calls meet the loss).
    ``spares``: the last ranks of the world are the grid's spares; they wait in ``standby`` as rank 0 dies, and
    write what ``standby`` raised.
    """
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(size))
    os.environ["HYPERGRID_WATCH"] = watch
    dist.init_process_group("gloo", init_method="env://", timeout=datetime.timedelta(seconds=600))
    grid = HyperCommGrid([2, (size - spares) // 2], ["tp", "dp"], guard_timeout_s=60.0, spares=spares)
    grid.create_pgs(["tp", "dp"])
    if rank >= size - spares:
        dist.barrier()
        seen = {"standby": _attempt(grid.standby)}  # rank 0 dies while this spare waits for a call
        Path(out, f"rank{rank}.json").write_text(json.dumps(seen, indent=1))
        os._exit(0)
    x = torch.ones(2)
    grid.all_reduce(x, "dp")
    dist.barrier()
    if rank == 0:
        if spares:  # the spares are in standby by now; the arrival registered, and waits
            raw = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=datetime.timedelta(seconds=60))
            raw.wait(["test/arrival"])
            time.sleep(0.5)
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(1.0)  # the store and rank 0's sockets are gone now
    seen = {
        "all_reduce": _attempt(lambda: grid.all_reduce(torch.ones(2), "dp")),
        "create_pg": _attempt(lambda: grid.create_pg(["dp", "tp"])),
        "tp_all_reduce": _attempt(lambda: grid.all_reduce(torch.ones(2), "tp")),
    }
    Path(out, f"rank{rank}.json").write_text(json.dumps(seen, indent=1))
    os._exit(0)  # torch's own teardown may wait on the dead store; what hypergrid raised is recorded


def arrival(port: int, out: str) -> None:
    """A process that arrives to join the job (``grid.arrive`` on its store) and waits as rank 0 dies; writes what
    ``arrive`` raised to ``<out>/arrival.json``."""
    store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=datetime.timedelta(seconds=600))
    grid = HyperCommGrid([2, 2], ["tp", "dp"])
    store.set("test/arrival", "1")
    seen = {"arrive": _attempt(lambda: grid.arrive(store=store, wake_ranks=False))}
    Path(out, "arrival.json").write_text(json.dumps(seen, indent=1))
    os._exit(0)
