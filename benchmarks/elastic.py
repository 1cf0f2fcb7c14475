"""Recovery from a SIGKILL nobody names, end to end, and the roll call and agreement at scale.

    python benchmarks/elastic.py [--world 4,8,16] [--repeats 3] [--participants 1024,16384,131072]
        [--threads 16] [--json PATH]

End to end: ``--world`` gloo ranks (``hypergrid.spawn``, the store in the
parent), grid tp=2 x dp=world/2 with the families ``tp``, ``dp``, ``dp-tp``
and a tagged ``dp``, groups' timeout 600 s (production-like). The ranks run
steps (a ``tp`` then a ``dp`` all-reduce); in step 2 rank 3 SIGKILLs itself
(after writing the time to the store). Every survivor catches ``RankFailure``
(the world's roll call names the dead), calls ``shrink(dead=failure.dead or None)``
and runs one all-reduce over the new grid. Per survivor, wall-clock from the
SIGKILL: **detection** (to ``RankFailure``), then the shrink's phases
(``Regrid.seconds``): **agreement**, **re-form** (abort + the new world) and
**re-create** (families + commit), then the **first collective**; **total**
is from the SIGKILL to the end of that collective. A row is the slowest
survivor's figures (retired ranks excluded), median over ``--repeats`` fresh
jobs (each column its own median). A row "+ second death" kills rank 2 too,
as it leaves the old world inside the survivors' shrink (after its teardown):
the shrink absorbs it with a second attempt.

At scale: one real ``TCPStore`` server and ``--threads`` client connections
playing every participant (as ``benchmarks/guard.py`` does): the world's roll
call (`hypergrid.agreement.liveness.Incident`, the last rank dead, so it closes
at its deadline) and the survivors' agreement
(`hypergrid.agreement.membership.MembershipRound`), with the store operations
of the busiest participant and of all.
"""

from __future__ import annotations

import argparse
import datetime
import os
import pathlib
import signal
import sys
import time
from typing import Any

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

import torch
import torch.distributed as dist
from torch.distributed import TCPStore  # type: ignore[attr-defined]

from benchmarks.common import median, progress, write_json
from benchmarks.guard import simulate
from hypergrid import HyperCommGrid, RankFailure, spawn
from hypergrid.agreement.liveness import FAILURE, Incident, bound_s, incident_prefix
from hypergrid.agreement.membership import MembershipRound, Proposal, round_prefix
from hypergrid.binding.reform import current_epoch

PHASES = ("detection", "agreement", "re-form", "re-create", "first_collective", "total")
VICTIM, SECOND = 3, 2
_TIMEOUT = datetime.timedelta(seconds=900)


def recovery_worker(second_death: bool) -> dict[str, float] | None:
    """One rank of the job: the survivors' times from the SIGKILL (None on the dead and the retired)."""
    grid = HyperCommGrid(
        [2, dist.get_world_size() // 2],
        ["tp", "dp"],
        guard_timeout_s=60.0,
        group_options={"timeout": datetime.timedelta(seconds=600)},
    )
    grid.create_pgs(["tp", "dp", ["dp", "tp"]])
    grid.create_pg("dp", tag="ag")
    base, rank = current_epoch().base_store, dist.get_rank()
    if second_death and rank == SECOND:
        real_abort = HyperCommGrid.abort

        def abort_then_die(self: Any) -> None:  # inside the shrink, once the old groups are torn down
            real_abort(self)
            os._exit(1)

        HyperCommGrid.abort = abort_then_die  # type: ignore[method-assign]
    x = torch.ones(1)
    try:
        for step in range(4):
            if step == 2 and rank == VICTIM:
                base.set("bench/killed", repr(time.time()))
                os.kill(os.getpid(), signal.SIGKILL)
            grid.all_reduce(x, "tp")
            grid.all_reduce(x, "dp")
        return None
    except RankFailure as failure:
        caught = time.time()
        killed = float(base.get("bench/killed").decode())
        regrid = grid.shrink(dead=failure.dead or None, timeout_s=30.0)
    if regrid.retired:
        return None
    regrid.grid.all_reduce(torch.ones(1), ["dp", "tp"])
    end = time.time()
    seconds = regrid.seconds
    times = {
        "detection": caught - killed,
        "agreement": seconds["agreement"],
        "re-form": seconds["abort"] + seconds["world"],
        "re-create": seconds["families"] + seconds["commit"],
        "total": end - killed,
        "attempts": float(regrid.attempts),
    }
    times["first_collective"] = times["total"] - times["detection"] - sum(seconds.values())
    return times


def recovery(world: int, repeats: int, second_death: bool) -> dict[str, Any]:
    samples = []
    for repeat in range(repeats):
        results = spawn(recovery_worker, world, (second_death,), timeout_s=300, allow_deaths=True)
        times = [r for r in results if isinstance(r, dict)]
        slowest = {phase: max(t[phase] for t in times) for phase in (*PHASES, "attempts")}
        progress(f"# world {world}{' + second death' if second_death else ''}, job {repeat + 1}: {slowest}")
        samples.append(slowest)
    row: dict[str, Any] = {"ranks": world, "second_death": second_death, "repeats": repeats}
    row.update({phase: median([sample[phase] for sample in samples]) for phase in (*PHASES, "attempts")})
    return row


class _RollCall:
    """One rank's side of a roll call, as `benchmarks.guard.simulate` drives it: True where it read the verdict."""

    def __init__(self, store: Any, prefix: str, rank: int, size: int) -> None:
        self.incident = Incident(store, prefix, rank, range(size + 1))  # rank ``size`` never answers
        self.size = size
        self.call = ""

    def arrive(self) -> bool:
        self.call = self.incident.answer() or ""
        return False

    def decide(self) -> bool:  # never: with a dead rank nobody's answer completes the roll call
        raise AssertionError("a roll call with a dead rank closes at its deadline")

    def await_verdict(self) -> bool:
        deadline = time.monotonic() + bound_s(self.size + 1)
        verdict = self.incident.close(self.call, deadline)
        if verdict is None:
            return False
        self.incident.conclude(verdict)
        return verdict.dead == (self.size,)


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


def at_scale(sizes: list[int], threads: int) -> list[dict[str, Any]]:
    server = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=_TIMEOUT)
    clients = [TCPStore("127.0.0.1", server.port, is_master=False, timeout=_TIMEOUT) for _ in range(threads)]
    baseline = server.num_keys()
    rows = []
    for size in sizes:
        # `size` live ranks of a world of size + 1 whose last rank is dead.
        prefix = incident_prefix(size, 0)
        server.set(f"{prefix}/call", f"{FAILURE} benchmark")

        def roll_call(store: Any, rank: int, prefix: str = prefix, size: int = size) -> Any:
            return _RollCall(store, prefix, rank, size)

        proposal = Proposal((size,), "drop", "dp")

        def agreeing(store: Any, rank: int, size: int = size, proposal: Proposal = proposal) -> Any:
            side = MembershipRound(store, round_prefix(size), rank, range(size + 1), proposal, 900.0)
            return _Agreeing(side)

        for impl, maker in (("roll call", roll_call), ("shrink agreement", agreeing)):
            sample = simulate("hypergrid", size, clients, f"bench/elastic/{impl}/{size}", maker)
            left = server.num_keys() - baseline
            if left:
                raise RuntimeError(f"{impl} left {left} keys in the store after a round of {size}")
            progress(f"# {impl:<16} {size:>7} participants: {sample['seconds']:.3f} s")
            rows.append({"participants": size, "impl": impl, **sample, "threads": threads})
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world", default="8", help="comma-separated world sizes (default 8)")
    parser.add_argument("--repeats", type=int, default=3, help="fresh jobs per row (default 3)")
    parser.add_argument("--no-second-death", action="store_true", help="skip the rows with a death inside shrink")
    parser.add_argument("--participants", default="1024,16384", help="comma-separated sizes for the rounds at scale")
    parser.add_argument("--threads", type=int, default=16, help="client connections for the rounds at scale")
    parser.add_argument("--json", type=pathlib.Path, help='write {"rows": [...]} here')
    args = parser.parse_args(argv)
    rows: list[dict[str, Any]] = []
    for world in [int(w) for w in args.world.split(",") if w]:
        rows.append(recovery(world, args.repeats, False))
        if not args.no_second_death:
            rows.append(recovery(world, args.repeats, True))
    print(f"{'ranks':>5} {'second death':<12} " + " ".join(f"{phase:>16}" for phase in PHASES) + "  attempts")
    for row in rows:
        cells = " ".join(f"{row[phase] * 1e3:>13.1f} ms" for phase in PHASES)
        print(f"{row['ranks']:>5} {'yes' if row['second_death'] else 'no':<12} {cells}  {row['attempts']:>8.0f}")
    sizes = [int(size) for size in args.participants.split(",") if size]
    scale = at_scale(sizes, args.threads) if sizes else []
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
