"""Recovery from a SIGKILL nobody names, end to end, and the roll call and agreement at scale.

    python benchmarks/elastic.py [--world 4,8,16] [--repeats 3] [--participants 1024,16384,131072]
        [--threads 16] [--json PATH]
    python benchmarks/elastic.py --second-death 20 [--world 8] [--span-ms 120] [--timeout 30] [--json PATH]

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

``--second-death RUNS`` (the bound, issue 31): RUNS fresh jobs of the first
``--world`` size, each with the same first death; then rank 5 (whom that
shrink keeps) calls ``os._exit`` at a moment of its own shrink, job ``i`` at
``i * span / RUNS`` into it. Per job, the slowest survivor's seconds from the
second death to the end of its shrink (**absorbed**), against the documented
bound ``timeout_s`` + 1 s, with the attempts, whether every survivor's first
all-reduce on the new grid was right, and the 1-minute load average when the
job started; then the median and the maximum. A job whose shrink ended before
the moment, or in which the others had committed, is not counted.

At scale: one real ``TCPStore`` server and ``--threads`` client connections
playing every participant (as ``benchmarks/guard.py`` does): the survivors'
agreement (`hypergrid.agreement.membership.MembershipRound`), with the store
operations of the busiest participant and of all. The world's roll call at
scale is `benchmarks/rollcall.py` (pipelined simulated ranks: threads playing
16,384 watchers measured the threads, not the store).
"""

from __future__ import annotations

import argparse
import datetime
import os
import pathlib
import signal
import sys
import tempfile
import threading
import time
from typing import Any

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

import torch
import torch.distributed as dist
from torch.distributed import TCPStore  # type: ignore[attr-defined]

from benchmarks.common import median, progress, write_json
from benchmarks.guard import simulate
from hypergrid import HyperCommGrid, HyperGridError, RankFailure, spawn
from hypergrid.agreement.membership import MembershipRound, Proposal, round_prefix
from hypergrid.agreement.world import World

PHASES = ("detection", "agreement", "re-form", "re-create", "first_collective", "total")
VICTIM, SECOND = 3, 2
#: The second death of `sweep`: a rank the first death's shrink keeps (dp slice 2 of tp=2 x dp=world/2).
LATE = 5
_TIMEOUT = datetime.timedelta(seconds=900)


def _job_grid() -> HyperCommGrid:
    """tp=2 x dp=world/2 with ``tp``, ``dp`` and ``dp-tp``, groups' timeout 600 s (production-like)."""
    grid = HyperCommGrid(
        [2, dist.get_world_size() // 2],
        ["tp", "dp"],
        guard_timeout_s=60.0,
        group_options={"timeout": datetime.timedelta(seconds=600)},
    )
    grid.create_pgs(["tp", "dp", ["dp", "tp"]])
    return grid


def recovery_worker(second_death: bool) -> dict[str, float] | None:
    """One rank of the job: the survivors' times from the SIGKILL (None on the dead and the retired)."""
    grid = _job_grid()
    grid.create_pg("dp", tag="ag")
    base, rank = World.current().base_store, dist.get_rank()
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


def second_death_worker(delay_s: float, timeout_s: float, mark: str) -> dict[str, Any] | None:
    """One rank of a `sweep` job: rank `VICTIM` dies in step 2, rank `LATE` ``delay_s`` into its own shrink.

    `LATE` writes the time of its death to the file ``mark`` (never through the store: its one connection
    may be busy in the main thread's wait, and the death must not wait for it). Returns, on each survivor
    of the new grid, the wall-clock times (``time.time()``) of its shrink's start and end, the result of
    its first all-reduce on the new grid, the attempts, the dead and the phases; None on the retired.
    """
    grid = _job_grid()
    rank = dist.get_rank()
    try:
        for step in range(4):
            if step == 2 and rank == VICTIM:
                os.kill(os.getpid(), signal.SIGKILL)
            grid.all_reduce(torch.ones(1), "tp")
            grid.all_reduce(torch.ones(1), "dp")
        return None
    except RankFailure as failure:
        started = time.time()
        late = _Late(mark)
        if rank == LATE:
            threading.Timer(delay_s, late.die).start()
        try:
            regrid = grid.shrink(dead=failure.dead or None, timeout_s=timeout_s)
        except HyperGridError as error:  # not absorbed: what this survivor saw, when
            return {"error": f"{type(error).__name__}: {error}", "started": started, "ended": time.time()}
    ended = time.time()
    late.live_on()  # on `LATE`: its shrink ended before its timer (the run is not counted)
    if regrid.retired:
        return None
    x = torch.ones(1)
    try:
        regrid.grid.all_reduce(x, ["dp", "tp"])
    except RankFailure:  # `LATE` died once the others had committed: a death after the shrink (not counted)
        return {"after": True}
    return {
        "started": started,
        "ended": ended,
        "sum": float(x.item()),
        "size": dist.get_world_size(),
        "attempts": regrid.attempts,
        "dead": list(regrid.dead),
        "phases": dict(regrid.seconds),
    }


class _Late:
    """The second death: `die` (on a timer) unless `live_on` came first; a lock orders the two."""

    def __init__(self, mark: str) -> None:
        self.mark = mark
        self.lock = threading.Lock()
        self.spared = False

    def die(self) -> None:
        with self.lock:
            if self.spared:
                return
            pathlib.Path(self.mark).write_text(repr(time.time()))
            os._exit(1)

    def live_on(self) -> None:
        with self.lock:
            self.spared = True


def sweep(world: int, runs: int, span_s: float, timeout_s: float) -> dict[str, Any]:
    """``runs`` jobs; in job ``i`` the second death comes ``i * span_s / runs`` into its shrink.

    Per job, the slowest survivor's seconds from the second death to the end of its shrink
    (``absorbed``), checked against the documented bound ``timeout_s`` + 1 s.
    """
    samples = []
    for run in range(runs):
        delay = run * span_s / runs
        load = os.getloadavg()[0]
        with tempfile.TemporaryDirectory() as folder:
            mark = pathlib.Path(folder) / "second"
            arguments = (delay, timeout_s, str(mark))
            results = spawn(second_death_worker, world, arguments, timeout_s=4 * timeout_s + 120, allow_deaths=True)
            second = float(mark.read_text()) if mark.exists() else None
        alive = [r for r in results if isinstance(r, dict)]
        failed = [r for r in alive if "error" in r]
        if failed:
            progress(f"# second death {delay * 1e3:.0f} ms into the shrink: NOT ABSORBED: {results}")
            samples.append({"delay_s": delay, "error": failed[0]["error"], "load": load})
            continue
        if second is None or any("after" in r for r in alive):
            progress(f"# second death {delay * 1e3:.0f} ms into the shrink: it came after the shrink (not counted)")
            continue
        absorbed = max(r["ended"] for r in alive) - second
        sample = {
            "delay_s": delay,
            "absorbed_s": absorbed,
            "shrink_s": max(r["ended"] - r["started"] for r in alive),
            "attempts": max(r["attempts"] for r in alive),
            "right": all(r["sum"] == r["size"] for r in alive),
            "survivors": len(alive),
            "dead": sorted({rank for r in alive for rank in r["dead"]}),
            "load": load,
            "phases": max((r["phases"] for r in alive), key=lambda p: sum(p.values())),
        }
        progress(f"# second death {delay * 1e3:.0f} ms into the shrink: {sample}")
        samples.append(sample)
    absorbed = [sample["absorbed_s"] for sample in samples if "error" not in sample]
    return {
        "ranks": world,
        "runs": runs,
        "timeout_s": timeout_s,
        "bound_s": timeout_s + 1.0,
        "median_s": median(absorbed) if absorbed else float("nan"),
        "max_s": max(absorbed, default=float("nan")),
        "over_bound": sum(1 for value in absorbed if value > timeout_s + 1.0),
        "all_right": all(sample.get("right") for sample in samples),
        "not_absorbed": sum(1 for sample in samples if "error" in sample),
        "samples": samples,
    }


def _sweep_table(result: dict[str, Any]) -> str:
    lines = [f"{'moment':>9} {'absorbed':>10} {'shrink':>9} {'attempts':>8} {'load':>5}  right"]
    for sample in result["samples"]:
        if "error" in sample:
            lines.append(f"{sample['delay_s'] * 1e3:>6.0f} ms  not absorbed: {sample['error'][:200]}")
            continue
        lines.append(
            f"{sample['delay_s'] * 1e3:>6.0f} ms {sample['absorbed_s']:>8.2f} s {sample['shrink_s']:>7.2f} s "
            f"{sample['attempts']:>8} {sample['load']:>5.2f}  {sample['right']}"
        )
    lines.append(
        f"{len(result['samples'])} runs, {result['ranks']} ranks, timeout_s {result['timeout_s']:g}: absorbed median "
        f"{result['median_s']:.2f} s, max {result['max_s']:.2f} s, bound {result['bound_s']:g} s, "
        f"{result['over_bound']} over it, {result['not_absorbed']} not absorbed"
    )
    return "\n".join(lines)


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
        proposal = Proposal((size,), "drop", "dp")

        def agreeing(store: Any, rank: int, size: int = size, proposal: Proposal = proposal) -> Any:
            side = MembershipRound(store, round_prefix(size), rank, range(size + 1), proposal, 900.0)
            return _Agreeing(side)

        for impl, maker in (("shrink agreement", agreeing),):
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
    parser.add_argument(
        "--second-death",
        type=int,
        default=0,
        metavar="RUNS",
        help="instead: RUNS jobs of --world ranks (the first size), a second death at a moment spread over the shrink",
    )
    parser.add_argument("--span-ms", type=float, default=400.0, help="the second deaths' moments span this (ms)")
    parser.add_argument("--timeout", type=float, default=30.0, help="shrink's timeout_s in the --second-death jobs")
    args = parser.parse_args(argv)
    if args.second_death:
        world = int(args.world.split(",")[0])
        result = sweep(world, args.second_death, args.span_ms / 1e3, args.timeout)
        print(_sweep_table(result))
        if args.json:
            write_json(args.json, [result])
        return 0
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
