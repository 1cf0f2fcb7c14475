"""One guard round for many simulated participants on one real TCPStore: hypergrid's protocol against leader-reads-all.

    python benchmarks/guard.py [--participants 1024,16384,131072] [--threads 16] [--repeats 3]
        [--budget-s 240] [--json PATH] [--plot PATH]

The benchmark starts one ``TCPStore`` server on a free localhost port and
``--threads`` client connections to it. Each thread acts for a slice of the
participants: it makes each of them arrive, then runs the decision where it
falls in its slice, then waits for the verdict for each of the others. Every
store operation is real, so the server (one thread, as in a job) does the work
it would do for that many ranks; what the simulation saves is only the ranks'
own processes.

- ``hypergrid``: the shipped protocol, `hypergrid.agreement.protocol.Round`, driven step
  by step (``arrive``, ``decide``, ``await_verdict``).
- ``leader-reads-all``: hypergrid's previous guard, reimplemented here for the
  comparison: every participant writes its request key; the first waits for all
  of them, reads them with one ``multi_get``, compares, deletes them and writes
  a verdict; the others wait for the verdict, read it and count themselves done
  (the last deletes the verdict).

hypergrid's round leaves its roster and verdict for the commit that follows
the creation, whose members delete them (one operation each, on two members,
not simulated here: the benchmark deletes them); it checks that nothing else is
left but the announcements of the participants that waited past half their
probe time (a round that ends in time writes none).

Store operations are counted per participant by a proxy around its client
connection (one call is one operation, whatever it carries). Reported per size
and protocol: the median time of ``--repeats`` rounds (fewer where the next
would pass ``--budget-s``: one leader-reads-all round of 131,072 takes more
than a minute), the operations of the busiest participant and of all of them.
"""

from __future__ import annotations

import argparse
import datetime
import json
import pathlib
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

from torch.distributed import TCPStore  # type: ignore[attr-defined]

from benchmarks.common import median
from hypergrid.agreement.diagnosis import announce_key
from hypergrid.agreement.protocol import Round
from hypergrid.agreement.request import CreationRequest

IMPLS = ("hypergrid", "leader-reads-all")
REQUEST = CreationRequest(
    "tp8\u00d7cp8\u00d7pp16\u00d7dp16", ("dp-tp",), "enumerate", 0, options=(("guard_timeout_s", "300"),)
)
_TIMEOUT = datetime.timedelta(seconds=900)


class CountingStore:
    """A store client seen through a counter: every call is one operation of one participant."""

    def __init__(self, store: Any) -> None:
        self.store = store
        self.ops = 0

    def _count(self, name: str, *args: Any) -> Any:
        self.ops += 1
        return getattr(self.store, name)(*args)

    def add(self, key: str, value: int) -> int:
        return int(self._count("add", key, value))

    def append(self, key: str, value: str) -> None:
        self._count("append", key, value)

    def set(self, key: str, value: str) -> None:
        self._count("set", key, value)

    def get(self, key: str) -> bytes:
        return bytes(self._count("get", key))  # (one call; torch's client sends two requests, a WAIT and the GET)

    @property
    def timeout(self) -> datetime.timedelta:
        return self.store.timeout  # type: ignore[no-any-return]  # (the client's own setting: no request)

    def set_timeout(self, timeout: datetime.timedelta) -> None:
        self.store.set_timeout(timeout)

    def wait(self, keys: list[str], *timeout: datetime.timedelta) -> None:
        self._count("wait", keys, *timeout)

    def compare_set(self, key: str, expected: str, desired: str) -> bytes:
        return bytes(self._count("compare_set", key, expected, desired))

    def delete_key(self, key: str) -> bool:
        return bool(self._count("delete_key", key))

    def multi_set(self, keys: list[str], values: list[str]) -> None:
        self._count("multi_set", keys, values)

    def multi_get(self, keys: list[str]) -> list[bytes]:
        return list(self._count("multi_get", keys))

    def check(self, keys: list[str]) -> bool:
        return bool(self._count("check", keys))

    def num_keys(self) -> int:
        return int(self._count("num_keys"))


class LeaderReadsAll:
    """hypergrid's previous guard protocol, for comparison (the same steps as `Round`)."""

    def __init__(self, store: Any, prefix: str, rank: int, participants: Sequence[int], request: CreationRequest):
        self.store, self.prefix, self.rank, self.participants = store, prefix, rank, participants
        self.encoded = request.encoded

    def arrive(self) -> bool:
        self.store.set(f"{self.prefix}/request/{self.rank}", self.encoded)
        return self.rank == self.participants[0]

    def decide(self) -> bool:
        keys = [f"{self.prefix}/request/{rank}" for rank in self.participants]
        self.store.wait(keys, _TIMEOUT)
        agree = len(set(self.store.multi_get(keys))) == 1
        for key in keys:
            self.store.delete_key(key)
        self.store.set(f"{self.prefix}/verdict", "ok" if agree else "mismatch")
        return agree

    def await_verdict(self) -> bool:
        verdict = f"{self.prefix}/verdict"
        self.store.wait([verdict], _TIMEOUT)
        agree = self.store.get(verdict) == b"ok"
        if self.store.add(f"{self.prefix}/read", 1) == len(self.participants) - 1:
            self.store.delete_key(verdict)
            self.store.delete_key(f"{self.prefix}/read")
        return agree


def _make(impl: str, prefix: str, participants: Sequence[int]) -> Callable[[Any, int], Any]:
    if impl == "hypergrid":
        return lambda store, rank: Round(store, prefix, rank, participants, REQUEST, _TIMEOUT.total_seconds())
    return lambda store, rank: LeaderReadsAll(store, prefix, rank, participants, REQUEST)


def simulate(
    impl: str, participants: int, clients: list[Any], prefix: str, make: Callable[[Any, int], Any] | None = None
) -> dict[str, Any]:
    """One round of ``impl`` for ``participants`` simulated ranks over ``clients``; time and operation counts.

    ``make(store, rank)`` builds one participant's side (default: ``impl``'s); its steps return
    ``True``, or a verdict whose ``kind`` is ``"ok"``, where the participant agreed.
    """
    everyone = range(participants)
    make = make or _make(impl, prefix, everyone)
    count = len(clients)
    slices = [
        everyone[thread * participants // count : (thread + 1) * participants // count] for thread in range(count)
    ]
    stores = [[CountingStore(clients[thread]) for _ in mine] for thread, mine in enumerate(slices)]
    outcomes: list[Any] = []
    errors: list[BaseException] = []
    start = threading.Barrier(count + 1)

    def work(thread: int) -> None:
        start.wait()
        try:
            sides = [make(store, rank) for store, rank in zip(stores[thread], slices[thread])]
            deciding = [side.arrive() for side in sides]
            results = [side.decide() for side, decides in zip(sides, deciding) if decides]
            results += [side.await_verdict() for side, decides in zip(sides, deciding) if not decides]
            outcomes.extend(results)
        except BaseException as error:  # reported by the main thread
            errors.append(error)

    threads = [threading.Thread(target=work, args=(thread,)) for thread in range(count)]
    for thread in threads:
        thread.start()
    start.wait()
    began = time.perf_counter()
    for thread in threads:
        thread.join()
    seconds = time.perf_counter() - began
    if errors:
        raise errors[0]
    agreed = [outcome if isinstance(outcome, bool) else outcome.kind == "ok" for outcome in outcomes]
    if len(agreed) != participants or not all(agreed):
        raise RuntimeError(f"{impl} with {participants} participants did not agree everywhere")
    ops = [store.ops for mine in stores for store in mine]
    return {"seconds": seconds, "store_ops_busiest_rank": max(ops), "store_ops_total": sum(ops)}


def run(
    sizes: list[int], threads: int, repeats: int, budget_s: float, log: Callable[[str], None]
) -> list[dict[str, Any]]:
    """Every size and protocol on one store server; rows with the median of up to ``repeats`` rounds.

    A further round of a protocol at a size is skipped when its last round,
    added to the time spent so far, would pass ``budget_s`` (every size gets
    at least one round of each protocol).
    """
    server = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=_TIMEOUT)
    clients = [TCPStore("127.0.0.1", server.port, is_master=False, timeout=_TIMEOUT) for _ in range(threads)]
    baseline = server.num_keys()
    began = time.perf_counter()
    rows = []
    for size in sizes:
        samples: dict[str, list[dict[str, Any]]] = {impl: [] for impl in IMPLS}
        for repeat in range(repeats):
            for impl in IMPLS if repeat % 2 == 0 else IMPLS[::-1]:
                done = samples[impl]
                if done and time.perf_counter() - began + done[-1]["seconds"] > budget_s:
                    continue
                sample = simulate(impl, size, clients, f"bench/{impl}/{size}/{repeat}")
                log(f"# {impl:<16} {size:>7} participants, round {repeat + 1}: {sample['seconds']:.3f} s")
                if impl == "hypergrid":
                    prefix = f"bench/{impl}/{size}/{repeat}"
                    server.delete_key(f"{prefix}/roster")  # the commit's first two members do this
                    server.delete_key(f"{prefix}/verdict")
                    for rank in range(size):  # a slow round's announcements (kept by each rank until destroy())
                        server.delete_key(announce_key(rank))
                left = server.num_keys() - baseline
                if left:
                    raise RuntimeError(f"{impl} left {left} keys in the store after a round of {size}")
                done.append(sample)
        for impl in IMPLS:
            done = samples[impl]
            rows.append(
                {
                    "participants": size,
                    "impl": impl,
                    "seconds": median([sample["seconds"] for sample in done]),
                    "store_ops_busiest_rank": done[0]["store_ops_busiest_rank"],
                    "store_ops_total": done[0]["store_ops_total"],
                    "repeats": len(done),
                    "threads": threads,
                }
            )
    return rows


def print_table(rows: list[dict[str, Any]]) -> None:
    print(f"{'participants':>12} {'impl':<16} {'seconds':>9} {'ops busiest':>11} {'ops total':>10} {'ops/rank':>8}")
    for row in rows:
        print(
            f"{row['participants']:>12} {row['impl']:<16} {row['seconds']:>9.3f} "
            f"{row['store_ops_busiest_rank']:>11} {row['store_ops_total']:>10} "
            f"{row['store_ops_total'] / row['participants']:>8.2f}"
        )
    by_size: dict[int, dict[str, float]] = {}
    for row in rows:
        by_size.setdefault(row["participants"], {})[row["impl"]] = row["seconds"]
    print("\n# leader-reads-all / hypergrid (time)")
    for size, times in by_size.items():
        print(f"{size:>12} {times['leader-reads-all'] / times['hypergrid']:.1f}x")


def plot(rows: list[dict[str, Any]], path: pathlib.Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(7, 4.5))
    for impl, style in zip(IMPLS, ("o-", "s--")):
        mine = [row for row in rows if row["impl"] == impl]
        axes.plot([r["participants"] for r in mine], [r["seconds"] for r in mine], style, label=impl)
    axes.set_xscale("log")
    axes.set_yscale("log")
    axes.set_xlabel("participants")
    axes.set_ylabel("seconds per guard round (median)")
    axes.set_title("one guard round on one TCPStore")
    axes.grid(True, which="both", alpha=0.3)
    axes.legend()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(figure)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--participants", default="1024,16384,131072", help="comma-separated sizes")
    parser.add_argument("--threads", type=int, default=16, help="client connections, one thread each (default 16)")
    parser.add_argument("--repeats", type=int, default=3, help="rounds per size and protocol (default 3)")
    parser.add_argument(
        "--budget-s", type=float, default=240.0, help="skip further repeats past this many seconds (default 240)"
    )
    parser.add_argument("--json", type=pathlib.Path, help='write {"rows": [...]} here')
    parser.add_argument("--plot", type=pathlib.Path, help="write a log-log PNG of seconds vs participants here")
    args = parser.parse_args(argv)
    try:
        sizes = [int(size) for size in args.participants.split(",")]
    except ValueError:
        parser.error(f"--participants must be comma-separated ints, got {args.participants!r}")
    if any(size < 2 for size in sizes) or args.threads < 1 or args.repeats < 1:
        parser.error("participants must be >= 2, --threads and --repeats >= 1")
    rows = run(sizes, args.threads, args.repeats, args.budget_s, lambda line: print(line, file=sys.stderr, flush=True))
    print_table(rows)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"rows": rows}, indent=1) + "\n")
    if args.plot:
        plot(rows, args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
