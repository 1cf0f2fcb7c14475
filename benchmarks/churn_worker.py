"""A worker that creates, uses and destroys groups in a loop under ``python -m hypergrid.run``, until one dies.

    python -m hypergrid.run --standalone --nproc-per-node 8 benchmarks/churn_worker.py OUT [SECONDS]

Each rank builds a tp 2 x dp grid with production timeouts (groups 600 s), then loops for SECONDS (default 20):
``create_pgs`` of ``tp``, ``dp`` and ``(tp, dp)``, an all-reduce on each, ``destroy``. Someone SIGKILLs a worker
from outside (`benchmarks/chaos.py`'s ``churn`` case). Each survivor catches ``RankFailure`` wherever it lands,
notes when (``time.time()``) and whom it names, shrinks along dp, all-reduces on the new grid and writes
``OUT/rank<R>.json`` (R: its first rank): ``raised``, ``dead`` (as first ranks), ``at``, ``sum`` (the all-reduce
over the new grid: its size), ``retired``; a fenced rank writes ``raised: FencedError``. A rank that ends the loop
without a failure writes ``raised: null``.
"""

from __future__ import annotations

import datetime
import json
import pathlib
import sys
import time

import torch
import torch.distributed as dist

import hypergrid


def main() -> int:
    out, seconds = pathlib.Path(sys.argv[1]), float(sys.argv[2]) if len(sys.argv) > 2 else 20.0
    hypergrid.init_from_env(timeout_s=120)
    first, size = dist.get_rank(), dist.get_world_size()
    timeout = {"timeout": datetime.timedelta(seconds=600)}
    seen: dict[str, object] = {"rank": first, "raised": None, "loops": 0}
    print(f"rank {first} of {size}: pid {__import__('os').getpid()}", flush=True)
    deadline = time.monotonic() + seconds
    grid = None
    try:
        while time.monotonic() < deadline:
            grid = hypergrid.HyperCommGrid([2, size // 2], ["tp", "dp"], group_options=timeout)
            grid.create_pgs(["tp", "dp", ["tp", "dp"]])
            for family in ("tp", "dp", ["tp", "dp"]):
                total = torch.ones(1)
                grid.all_reduce(total, family)
            grid.destroy()
            seen["loops"] = int(seen["loops"]) + 1  # type: ignore[call-overload]
    except hypergrid.FencedError as fenced:
        seen.update(raised="FencedError", at=time.time(), said=str(fenced)[:300])
    except hypergrid.RankFailure as failure:
        seen.update(raised="RankFailure", at=time.time(), dead=list(failure.dead), said=str(failure)[:300])
        assert grid is not None
        try:
            regrid = grid.shrink(dead=failure.dead or None, dim="dp", timeout_s=60)
            seen["retired"] = regrid.rank is None
            if regrid.rank is not None:
                total = torch.ones(1)
                regrid.grid.all_reduce(total, ["tp", "dp"])
                seen["sum"] = total.item()
                regrid.grid.destroy()
        except hypergrid.HyperGridError as error:
            seen.update(shrink_raised=type(error).__name__, shrink_said=str(error)[:300])
    (out / f"rank{first}.json").write_text(json.dumps(seen))
    if dist.is_initialized():
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
