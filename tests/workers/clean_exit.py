"""A healthy job that ends normally, for every way users launch one (tests/launch/test_clean_exit.py).

Run as a script under torchrun or ``python -m hypergrid.run`` (``env://``), or
through `run_env_rank` from ``torch.multiprocessing`` with rank 0 hosting the
store (``env://``, or a ``TCPStore`` the script owns). Each rank creates a grid
family, checks one all_reduce, optionally destroys the grid and the default
group, and writes ``<out>/rank<r>.json``: the all_reduce result and the names of
the threads still alive after ``destroy_process_group()`` (or at the end).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time

import torch
import torch.distributed as dist

from hypergrid import HyperCommGrid


def job(out: str, destroy: bool, delay_rank: int | None, store_owned: bool) -> None:
    """One rank's job (the process group is initialized here from the environment)."""
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if store_owned:  # the user's own store, hosted by rank 0
        store = dist.TCPStore(
            os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world, is_master=rank == 0, use_libuv=True
        )
        dist.init_process_group("gloo", store=store, rank=rank, world_size=world)
    else:
        dist.init_process_group("gloo", init_method="env://")
    grid = HyperCommGrid([world], ["dp"])
    total = torch.ones(1)
    dist.all_reduce(total, group=grid.create_pg("dp"))
    if destroy:
        grid.destroy()
        dist.destroy_process_group()
    threads = sorted(thread.name for thread in threading.enumerate() if thread.name.startswith("hypergrid"))
    with open(os.path.join(out, f"rank{rank}.json"), "w") as file:
        json.dump({"sum": float(total.item()), "hypergrid_threads": threads}, file)
    if delay_rank is not None and rank == delay_rank:
        time.sleep(1.0)  # this rank exits last


def run_env_rank(rank: int, world: int, port: int, out: str, destroy: bool, delay_rank: int, owned: bool) -> None:
    """``torch.multiprocessing`` entry point: env:// with rank 0 hosting the store."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world))
    job(out, destroy, delay_rank, owned)


def spawned() -> dict[str, object]:
    """``hypergrid.spawn`` entry point (the parent hosts the store): the sum and the threads left after destroy."""
    world = dist.get_world_size()
    grid = HyperCommGrid([world], ["dp"])
    total = torch.ones(1)
    dist.all_reduce(total, group=grid.create_pg("dp"))
    grid.destroy()
    dist.destroy_process_group()
    threads = sorted(thread.name for thread in threading.enumerate() if thread.name.startswith("hypergrid"))
    return {"sum": float(total.item()), "hypergrid_threads": threads}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--destroy", action="store_true")
    args = parser.parse_args(argv)
    job(args.out, args.destroy, None, False)
    return 0


if __name__ == "__main__":
    sys.exit(main())


def _server_side_connections(port: int) -> int:
    """Established TCP connections whose local port is ``port``: the store server's side of each client."""
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as file:
                rows = file.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            if int(fields[1].rsplit(":", 1)[1], 16) == port and fields[3] == "01":  # 01: ESTABLISHED
                count += 1
    return count


def store_connections(creations: int) -> dict[str, int]:
    """``hypergrid.spawn`` entry point: the store's connections once every rank created ``creations`` families."""
    world = dist.get_world_size()
    grid = HyperCommGrid([2, world // 2], ["tp", "dp"])
    for dims in [["tp"], ["dp"], ["tp", "dp"]][:creations]:
        total = torch.ones(1)
        dist.all_reduce(total, group=grid.create_pg(dims))
    dist.barrier()
    connections = _server_side_connections(int(os.environ["MASTER_PORT"]))
    dist.barrier()
    return {"connections": connections, "world": world}
