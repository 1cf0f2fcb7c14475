"""Recovery from a dead rank with ``grid.shrink``, and the survivors' agreement round at scale.

    python benchmarks/elastic.py [--world 8] [--repeats 3] [--timeout-s 2] [--participants 1024,16384,131072]
        [--threads 16] [--json PATH]

Recovery: ``--world`` gloo ranks (``hypergrid.spawn``, store in the parent), grid
tp=2 x dp=world/2 with the families ``tp``, ``dp``, ``dp-tp`` and a tagged
``dp``; rank 3 exits; one second later every survivor calls ``shrink`` and
then one all-reduce over the new grid. Timed on each survivor from the call to
``shrink`` to the end of that first collective, split into the phases
``Regrid.seconds`` reports (agreement, abort, re-formed world, re-created
families) and the first collective; a row gives the slowest survivor's
figures (retired ranks excluded), median over ``--repeats`` fresh jobs. Two
modes: the survivors name the dead (``dead=[3]``) or leave it to the timeout
(``dead=None``, ``timeout_s=--timeout-s``).

Agreement at scale: one real ``TCPStore`` server and ``--threads`` client
connections playing every participant, as ``benchmarks/guard.py`` does, for
`hypergrid.agreement.membership.MembershipRound` (one rank named dead, all
others agreeing) next to the guard's round (`hypergrid.agreement.protocol.Round`)
at the same size. Reported: the round's time and the store operations of the
busiest participant and of all.
"""

from __future__ import annotations

import argparse
import datetime
import os
import pathlib
import sys
import time
from typing import Any

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

import torch
import torch.distributed as dist
from torch.distributed import TCPStore  # type: ignore[attr-defined]

from benchmarks.common import median, progress, write_json
from benchmarks.guard import simulate
from hypergrid import HyperCommGrid, spawn
from hypergrid.agreement.membership import MembershipRound, Proposal, round_prefix

PHASES = ("agreement", "abort", "world", "families", "first_collective", "total")
VICTIM = 3
_TIMEOUT = datetime.timedelta(seconds=900)


def recovery_worker(given: bool, timeout_s: float) -> dict[str, float] | None:
    """One rank of the recovery job: the survivors' phase times (None on the victim and retired ranks)."""
    grid = HyperCommGrid(
        [2, dist.get_world_size() // 2],
        ["tp", "dp"],
        guard_timeout_s=60.0,
        group_options={"timeout": datetime.timedelta(seconds=30)},
    )
    grid.create_pgs(["tp", "dp", ["dp", "tp"]])
    grid.create_pg("dp", tag="ag")
    dist.barrier()
    if dist.get_rank() == VICTIM:
        os._exit(1)
    time.sleep(1.0)
    began = time.perf_counter()
    regrid = grid.shrink(dead=[VICTIM] if given else None, timeout_s=timeout_s)
    if regrid.retired:
        return None
    before = time.perf_counter()
    regrid.grid.all_reduce(torch.ones(1), ["dp", "tp"])
    end = time.perf_counter()
    return {**regrid.seconds, "first_collective": end - before, "total": end - began}


def recovery(world: int, repeats: int, timeout_s: float) -> list[dict[str, Any]]:
    rows = []
    for given in (True, False):
        samples = []
        for repeat in range(repeats):
            results = spawn(recovery_worker, world, (given, timeout_s), timeout_s=300, allow_deaths=True)
            times = [r for r in results if isinstance(r, dict)]
            slowest = {phase: max(t[phase] for t in times) for phase in PHASES}
            progress(f"# world {world}, dead {'given' if given else 'by timeout'}, job {repeat + 1}: {slowest}")
            samples.append(slowest)
        row: dict[str, Any] = {"ranks": world, "dead": "given" if given else f"timeout {timeout_s:g} s"}
        row.update({phase: median([sample[phase] for sample in samples]) for phase in PHASES})
        rows.append({**row, "repeats": repeats})
    return rows


class _Agreeing:
    """A membership round's steps, answering True where the participant got the expected dead set."""

    def __init__(self, side: MembershipRound) -> None:
        self.side = side

    def arrive(self) -> bool:
        return self.side.arrive()

    def decide(self) -> bool:
        return self.side.decide() == self.side.proposal.dead

    def await_verdict(self) -> bool:
        return self.side.await_verdict() == self.side.proposal.dead


def agreement(sizes: list[int], threads: int) -> list[dict[str, Any]]:
    server = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=_TIMEOUT)
    clients = [TCPStore("127.0.0.1", server.port, is_master=False, timeout=_TIMEOUT) for _ in range(threads)]
    baseline = server.num_keys()
    rows = []
    for size in sizes:
        # `size` survivors of a world of size + 1 whose last rank is dead; the guard's round at the same size.
        proposal = Proposal((size,), "drop", "dp")
        prefix = round_prefix(size)

        def make(store: Any, rank: int, prefix: str = prefix, proposal: Proposal = proposal, size: int = size) -> Any:
            return _Agreeing(MembershipRound(store, prefix, rank, range(size + 1), proposal, _TIMEOUT.total_seconds()))

        for impl, maker in (("shrink agreement", make), ("guard round", None)):
            sample = simulate("hypergrid", size, clients, f"bench/elastic/{impl}/{size}", maker)
            left = server.num_keys() - baseline
            if left:
                raise RuntimeError(f"{impl} left {left} keys in the store after a round of {size}")
            progress(f"# {impl:<16} {size:>7} participants: {sample['seconds']:.3f} s")
            rows.append({"participants": size, "impl": impl, **sample, "threads": threads})
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world", default="8", help="comma-separated world sizes for the recovery (default 8)")
    parser.add_argument("--repeats", type=int, default=3, help="fresh jobs per world size and mode (default 3)")
    parser.add_argument("--timeout-s", type=float, default=2.0, help="shrink's timeout when the dead are not named")
    parser.add_argument("--participants", default="1024,16384", help="comma-separated sizes for the agreement round")
    parser.add_argument("--threads", type=int, default=16, help="client connections for the agreement round")
    parser.add_argument("--json", type=pathlib.Path, help='write {"rows": [...]} here')
    args = parser.parse_args(argv)
    rows: list[dict[str, Any]] = []
    for world in [int(w) for w in args.world.split(",") if w]:
        rows += recovery(world, args.repeats, args.timeout_s)
    print(f"{'ranks':>5} {'dead':<14} " + " ".join(f"{phase:>16}" for phase in PHASES))
    for row in rows:
        print(f"{row['ranks']:>5} {row['dead']:<14} " + " ".join(f"{row[phase] * 1e3:>13.1f} ms" for phase in PHASES))
    sizes = [int(size) for size in args.participants.split(",") if size]
    scale = agreement(sizes, args.threads) if sizes else []
    print(f"{'participants':>12} {'round':<17} {'seconds':>9} {'ops busiest':>11} {'ops total':>10}")
    for row in scale:
        print(
            f"{row['participants']:>12} {row['impl']:<17} {row['seconds']:>9.3f} "
            f"{row['store_ops_busiest_rank']:>11} {row['store_ops_total']:>10}"
        )
    if args.json:
        write_json(args.json, rows + scale)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
