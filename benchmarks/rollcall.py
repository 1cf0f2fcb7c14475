"""The world's roll call at scale: a real TCPStore, two real watchers, and many pipelined simulated ranks.

    python benchmarks/rollcall.py [--participants 1024,16384] [--processes 4]
        [--connections 16384] [--repeats 3] [--json PATH]

A world of N + 1 ranks whose last rank is dead; rank 0's main thread reports
a failure (`hypergrid.agreement.watcher.Watcher.report`), so the roll call
closes at its bound (the liveness bound after the caller's wake ended, as its
closers see ``I/woken``: `hypergrid.agreement.liveness.Incident.close`).

What runs for real: the ``TCPStore`` server (one event loop, as rank 0 hosts
it in a job); the caller (rank 0's report: the call, then one wake key per
block of 8 ranks, in ``multi_set``s of 256); rank 0 as a real `Watcher`
thread on its own connection, woken by the first ``multi_set`` like every
rank of its block; the two simulated ranks whose answers come first run the
real `Incident.close` and ``conclude`` (the roll call's closers), each on a
connection opened before the call, as a real watcher's is.

What is simulated: ranks 2 .. N - 1, by ``--processes`` processes. Each sends,
for each of its ranks, the same requests in the same order as a real
watcher that is not a closer (`SCRIPT`: the test
``tests/agreement/test_rollcall_scale.py`` checks it against a real watcher's
operations), byte for byte as torch's client writes them
(`benchmarks.store_wire`), over ``--connections`` sockets in all. With one
rank per socket (``--connections`` ≥ N) the server sees what it sees in a
job during a roll call: each rank uses only its watcher's connection (its
default-store connection stays idle), one socket per rank. With more ranks
than sockets (the host's file limit: 20,000 descriptors here), the ranks of a
socket send their requests back to back (the server parses them from one read
instead of one read each), and wait together: one ``wait`` on their blocks'
wake keys and one on the verdict, so the server sends one notification per socket
where a job's would send one per rank. The server's per-request work (parse,
map, answer) is the job's; its per-rank read and notification syscalls are
not. A real rank's client-side round trips are not either: a simulated rank
sends its next request without waiting for the answer of the previous one
(its answers are checked afterwards).

Reported per size: seconds from the call until every live rank read the
verdict (median of ``--repeats`` roll calls, each on fresh connections), when
the closers closed it, the live ranks named dead (any run that names one, or
whose ranks read different verdicts, raises), and the store operations per
rank (simulated: `SCRIPT`; the closers' counted on their connections).
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import multiprocessing
import pathlib
import selectors
import socket
import struct
import sys
import threading
import time
from collections.abc import Generator
from typing import Any

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

from torch.distributed import TCPStore  # type: ignore[attr-defined]

from benchmarks import store_wire as wire
from benchmarks.common import median, progress, write_json
from benchmarks.guard import CountingStore
from hypergrid.agreement.diagnosis import ABSENT
from hypergrid.agreement.liveness import (
    FAILURE,
    INCIDENT_KEYS,
    WAKE_BLOCK,
    Incident,
    Verdict,
    done_key,
    incident_prefix,
    members_key,
    wake_key,
    wake_keys,
    world_keys,
)
from hypergrid.agreement.rollkeys import gone_of, gone_text
from hypergrid.agreement.watcher import Watcher

#: A watcher's store operations for one incident that it does not close, from the wake to waiting again, when it is
#: the first live rank of its wake block (`hypergrid.agreement.liveness.wake_key`); the others' leave out "delete wake".
SCRIPT = (
    "read call",  # woken: Incident.answer
    "append alive",
    "add count",
    "wait verdict",  # Incident.close (diagnosis.get_until: torch's get, a WAIT and then the GET)
    "read verdict",
    "add read",  # Incident.conclude
    "delete wake",  # (the first of its block only)
    "wait wake",  # the watcher's loop: the next incident's wake key
)


def script(first_of_block: bool) -> tuple[str, ...]:
    """`SCRIPT` for a rank that is the first live rank of its wake block, or not."""
    return SCRIPT if first_of_block else tuple(step for step in SCRIPT if step != "delete wake")


TEXT = "benchmark"
_TIMEOUT = datetime.timedelta(seconds=900)


class _Socket:
    """The simulated ranks of one connection: their requests, by phase, and what the answers must be.

    ``units``: the ranks each participant answers for (one rank each; or a node's ranks, its agent answering).
    """

    def __init__(
        self, sock: socket.socket, world: int, units: list[range], readers: int, declared: bool = False
    ) -> None:
        self.sock = sock
        self.units = units
        ranks = range(units[0][0], units[-1][-1] + 1)
        self.ranks = ranks
        self.readers = readers
        self.complete_at = readers if declared else None  # the count that completes the roll call (the dead declared)
        prefix = incident_prefix(world, 0)
        self.prefix, self.world = prefix, world
        call = f"{prefix}/call"
        self.wakes = wake_keys(world, 0, ranks)  # one per block (of `WAKE_BLOCK` ranks) among this socket's ranks
        self.idle = wire.check([call]) + wire.wait(self.wakes)  # (the check's answer: the server read the wait)
        self.answer = b"".join(
            wire.compare_set(call, ABSENT, ABSENT)
            + wire.append(f"{prefix}/alive", "".join(f"{rank}\n" for rank in unit))
            + wire.add(f"{prefix}/count", len(unit))
            for unit in units
        )
        verdict = f"{prefix}/verdict"
        self.conclude = [  # every rank here but rank ``readers`` is live: the first of a block has rank % 8 == 0
            wire.get(verdict)
            + wire.add(f"{prefix}/read", len(unit))
            + b"".join(wire.delete_key(wake_key(world, 0, rank)) for rank in unit if rank % WAKE_BLOCK == 0)
            for unit in units
        ]
        self.deletes = [sum(1 for rank in unit if rank % WAKE_BLOCK == 0) for unit in units]
        self.woken = self.woken_at = self.answered = 0.0
        self.heard = 0.0
        self.orders: list[int] = []
        self.closing: list[int] = []  # the ranks here that answered first or second, until `drive` runs their close
        self.verdicts: set[bytes] = set()
        self.last_reader = False

    def go_idle(self) -> None:
        """Before the call: the ranks wait on their wake keys (one blocking wait for all of this connection's)."""
        self.sock.sendall(self.idle)
        wire.receive(self.sock, wire.FLAG)

    def steps(self, call_size: int) -> Generator[tuple[bytes, int], bytes, None]:
        """The incident, as (bytes to send, size of the answer to read next); each answer is sent back in.

        A rank whose answer came first or second (the roll call's closers) is
        left out of the pipelined steps after its answer: `drive` runs the real
        `Incident.close` for it.
        """
        yield b"", wire.FLAG  # the wake (the caller's multi_set)
        self.woken, self.woken_at = time.monotonic(), time.time()
        per = wire.INT + call_size + wire.INT  # the call, the count
        data = yield self.answer, len(self.units) * per
        self.answered = time.time()
        self.orders = [struct.unpack_from("<q", data, at + per - wire.INT)[0] for at in range(0, len(data), per)]
        firsts = [order - len(unit) + 1 for order, unit in zip(self.orders, self.units)]  # its first answer's place
        waiting = [index for index, first in enumerate(firsts) if first > 2]
        complete = [self.complete_at is not None and order >= self.complete_at for order in self.orders]
        self.closing = [index for index, first in enumerate(firsts) if first <= 2 or complete[index]]
        waiting = [index for index in waiting if not complete[index]]  # (its real close publishes at once)
        if not waiting:
            return
        yield wire.wait([f"{self.prefix}/verdict"]), wire.FLAG
        conclude = b"".join(self.conclude[index] for index in waiting)
        conclude += wire.wait(wake_keys(self.world, 1, [self.units[index][0] for index in waiting]))  # idle again
        head = yield conclude, wire.INT  # the verdict's length
        size = struct.unpack_from("<Q", head)[0]
        # Per participant: the verdict (its length, then it), the count of reads; each first of a block: its delete's
        sizes = [wire.INT + size + wire.INT + wire.INT * self.deletes[index] for index in waiting]
        data = head + (yield b"", sum(sizes) - len(head))
        self.heard = time.time()
        at = 0
        for each in sizes:
            self.verdicts.add(data[at + wire.INT : at + wire.INT + size])
            self.last_reader |= struct.unpack_from("<q", data, at + wire.INT + size)[0] >= self.readers
            at += each
        if self.last_reader:  # Incident.conclude's clean-up: ``done``, then the incident's keys and the dead's block's
            keys = [f"{self.prefix}/{name}" for name in INCIDENT_KEYS] + [wake_key(self.world, 0, self.readers)]
            clean_up = wire.set_key(done_key(self.world), "0") + b"".join(wire.delete_key(key) for key in keys)
            yield clean_up, len(keys) * wire.INT


def _close(port: int, one: _Socket, index: int, call: str, results: list[Any], spare: list[Any]) -> None:
    """The real `Incident.close` and ``conclude`` for a simulated rank that answered first or second.

    On a connection opened before the call (``spare``), as a real watcher's is: opening one here would count
    the connect (and this process's CPU share) in the closers' bound.
    """
    store = CountingStore(spare.pop() if spare else TCPStore("127.0.0.1", port, is_master=False, timeout=_TIMEOUT))
    size, unit = one.readers + 1, one.units[index]
    incident = Incident(store, one.prefix, unit[0], range(size), ranks=unit)
    incident._order = one.orders[index]  # what its answer (pipelined) returned
    incident._first = incident._order - len(unit) + 1
    incident.gone = tuple(rank for rank in gone_of(call) if rank not in unit)
    incident._complete = incident._order >= size - len(incident.gone)
    verdict = incident.close(call, one.woken)
    closed = time.time()
    if verdict is not None:
        incident.conclude(verdict)
    store.ops += 1  # the watcher's loop: its wait on the next wake key (not sent: this connection closes)
    results.append((time.time(), None if verdict is None else verdict.encode().encode(), store.ops, closed))


def drive(port: int, world: int, units: list[range], connections: int, readers: int, call: str, queue: Any) -> None:
    """One process: the participants answering for ``units`` over ``connections`` sockets, idle, then the
    incident; its figures to ``queue``."""
    try:
        per = -(-len(units) // connections)
        starts = range(0, len(units), per)
        links = wire.connect(port, len(starts))
        declared = bool(gone_of(call))
        sockets = [_Socket(link, world, units[at : at + per], readers, declared) for link, at in zip(links, starts)]
        for one in sockets:
            one.go_idle()
            one.sock.settimeout(600.0)
        # The closers' connections (at most two ranks close): open before the call, as a real watcher's
        spare = [TCPStore("127.0.0.1", port, is_master=False, timeout=_TIMEOUT) for _ in range(2)]
        queue.put(("ready", len(sockets)))
        selector = selectors.DefaultSelector()
        closers: list[threading.Thread] = []
        closed: list[Any] = []
        for one in sockets:
            flow = one.steps(len(call.encode()))
            selector.register(one.sock, selectors.EVENT_READ, [one, flow, next(flow)[1], b""])
        while selector.get_map():
            for key, _ in selector.select():
                state = key.data
                one, flow = state[0], state[1]
                state[3] += one.sock.recv(1 << 20)
                while state[2] and len(state[3]) >= state[2]:
                    chunk, state[3] = state[3][: state[2]], state[3][state[2] :]
                    try:
                        payload, state[2] = flow.send(chunk)
                    except StopIteration:
                        state[2] = 0
                        selector.unregister(one.sock)
                    else:
                        one.sock.sendall(payload)
                    while one.closing:
                        closing = (port, one, one.closing.pop(), call, closed, spare)
                        thread = threading.Thread(target=_close, args=closing)
                        thread.start()
                        closers.append(thread)
        for thread in closers:
            thread.join()
        orders = [order for one in sockets for order in one.orders]
        queue.put(
            (
                "done",
                {
                    "heard": max([one.heard for one in sockets] + [c[0] for c in closed]),
                    "woken": max(one.woken_at for one in sockets),
                    "answered": max(one.answered for one in sockets),
                    "closed": [c[3] for c in closed],
                    "first_order": min(orders),
                    "verdicts": sorted(
                        {v.decode() for one in sockets for v in one.verdicts} | {c[1].decode() for c in closed if c[1]}
                    ),
                    "closer_ops": [c[2] for c in closed],
                },
            )
        )
        for one in sockets:
            one.sock.close()
    except BaseException as error:  # reported by the main process
        queue.put(("error", repr(error)))


def units_of(ranks: range, per_node: int) -> list[range]:
    """``ranks`` cut where a node of ``per_node`` ranks ends (rank // per_node): what each participant answers for.

    Examples:
        >>> units_of(range(1, 20), 8)
        [range(1, 8), range(8, 16), range(16, 20)]
    """
    cuts = [rank for rank in ranks if rank % per_node == 0 and rank != ranks[0]]
    edges = [ranks[0], *cuts, ranks[-1] + 1]
    return [range(start, end) for start, end in itertools.pairwise(edges)]


def roll_call(
    server: Any,
    participants: int,
    processes: int,
    connections: int,
    world: int,
    per_node: int = 1,
    declared: bool = False,
) -> dict[str, Any]:
    """One roll call of ``participants`` live ranks (and one dead) on ``server``; its figures. ``per_node``: each
    node's agent answers for its ranks (`hypergrid.agreement.nodewatch`), one participant per node; 1: every rank
    answers itself. Rank 0 answers itself either way (the real watcher). ``declared``: the call declares the dead
    rank gone, as a launcher's agent that saw it exit does (the roll call is complete at the last live answer)."""
    text = gone_text([participants], TEXT) if declared else TEXT
    size = participants + 1  # rank ``participants`` is dead
    port = server.port

    def connection() -> CountingStore:
        return CountingStore(TCPStore("127.0.0.1", port, is_master=False, timeout=_TIMEOUT))

    # Every rank joined the world's watch (untimed set-up: each rank's join is two requests, once per world); the
    # dead one too: it joined, then died. The reporter's watcher joins as it starts.
    server.set(members_key(world), "".join(f"+{rank}\n" for rank in range(1, size)))
    server.add(f"{members_key(world)}-count", size - 1)
    watchers = [Watcher(connection(), connection(), world, 0, size).start()]  # the reporter
    units = units_of(range(1, participants), per_node)
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    workers = []
    for index in range(processes):
        mine = units[index * len(units) // processes : (index + 1) * len(units) // processes]
        sockets = max(1, min(len(mine), connections // processes))
        workers.append(
            context.Process(target=drive, args=(port, world, mine, sockets, participants, f"{FAILURE} {text}", queue))
        )
    for worker in workers:
        worker.start()
    messages = [queue.get(timeout=600) for _ in workers]
    errors = [m[1] for m in messages if m[0] == "error"]
    if errors:
        raise RuntimeError(f"a simulating process failed: {errors[0]}")
    sockets = sum(m[1] for m in messages)
    time.sleep(0.2)  # the real watchers go idle too
    before = [watcher.store.ops for watcher in watchers]
    called = time.time()
    verdict = watchers[0].report(FAILURE, text)
    reported = time.time()
    results = [queue.get(timeout=600) for _ in workers]
    for worker in workers:
        worker.join(60)
    errors = [m[1] for m in results if m[0] == "error"]
    if errors:
        raise RuntimeError(f"a simulating process failed: {errors[0]}")
    figures = [m[1] for m in results]
    time.sleep(0.2)  # the closers go idle again
    ops = [watcher.store.ops - b for watcher, b in zip(watchers, before)] + [
        o for f in figures for o in f["closer_ops"]
    ]
    for watcher in watchers:
        watcher.halt(watcher.side, 10.0)
    expected = Verdict(FAILURE, (participants,), TEXT, readers=None if declared else participants).encode()
    if declared:  # the completing answer's verdict, or a closer's (its roster read first: the readers counted)
        seen_readers = {Verdict.decode(text.encode()).readers for f in figures for text in f["verdicts"]}
        expected = Verdict(
            FAILURE, (participants,), TEXT, readers=seen_readers.pop() if seen_readers else None
        ).encode()
    seen = {v for f in figures for v in f["verdicts"]} | {w.verdicts[0].encode() for w in watchers if 0 in w.verdicts}
    named = {rank for text in seen for rank in Verdict.decode(text.encode()).dead}
    live_named_dead = len(named - {participants})  # a false death: a live rank fenced (must be 0)
    if verdict is None or verdict.dead != (participants,) or seen != {expected}:
        timings = [
            (round(f["woken"] - called, 3), round(f["answered"] - called, 3), [round(c - called, 3) for c in closed])
            for f in figures
            for closed in [f["closed"]]
        ]
        raise RuntimeError(
            f"the roll call of {participants} did not name rank {participants} dead everywhere "
            f"({live_named_dead} live ranks named dead; per simulating process, seconds after the call: woken, "
            f"answered, closed: {timings}): {[text[:300] for text in sorted(seen)[:3]]}"
        )
    return {
        "participants": participants,
        "per_node": per_node,
        "declared": declared,
        "answering": len(units) + 1,  # (rank 0, the real watcher, answers for itself)
        "seconds": max([reported, *(f["heard"] for f in figures)]) - called,
        "closer_seconds": reported - called,
        "woken_seconds": max(f["woken"] for f in figures) - called,
        "answered_seconds": max(f["answered"] for f in figures) - called,
        "simulated_read_seconds": max(f["heard"] for f in figures) - called,
        "closed_seconds": [round(c - called, 3) for f in figures for c in f["closed"]],
        "sockets": sockets + 1,
        "processes": processes,
        "store_ops_simulated_rank": len(SCRIPT),  # a participant's; the first of a wake block; the others one fewer
        "store_ops_simulated_rank_mean": (len(SCRIPT) - 1 + 1 / WAKE_BLOCK) / per_node,
        "store_ops_closers": ops,
        "live_named_dead": live_named_dead,
        "first_simulated_order": min(f["first_order"] for f in figures),
    }


def run(
    sizes: list[int],
    processes: int,
    connections: int,
    repeats: int,
    per_node: list[int] | None = None,
    declared: bool = False,
) -> list[dict[str, Any]]:
    """Every size and ranks per answerer (``per_node``, default [1]), ``repeats`` times each, alternating, on one
    store server; a row per size and ``per_node`` with the median time."""
    server = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=_TIMEOUT)
    baseline = server.num_keys()
    rows = []
    world = 1000
    for size, node in [(size, node) for size in sizes for node in per_node or [1]]:
        samples = []
        for repeat in range(repeats):
            world += 1
            sample = roll_call(server, size, processes, connections, world, node, declared)
            if not server.check([done_key(world)]):  # the world's keys: its ranks' last leaver deletes them
                raise RuntimeError(f"the roll call of {size} did not write its world's {done_key(world)}")
            for key in world_keys(world):
                server.delete_key(key)
            left = server.num_keys() - baseline
            if left:
                named = sorted(server.list_keys())[:20]
                raise RuntimeError(f"the roll call of {size} left {left} keys in the store, e.g. {named}")
            progress(f"# roll call {size:>7} ranks, {node} a participant, {repeat + 1}: {sample['seconds']:.3f} s")
            samples.append(sample)
        row = dict(samples[0])
        row["seconds"] = median([sample["seconds"] for sample in samples])
        row["closer_seconds"] = median([sample["closer_seconds"] for sample in samples])
        row["closed_seconds"] = [c for sample in samples for c in sample["closed_seconds"]]
        row["live_named_dead"] = max(sample["live_named_dead"] for sample in samples)
        row["repeats"] = repeats
        rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--participants", default="1024,16384", help="comma-separated live ranks (131072: see docs/design/rollcall.md)"
    )
    parser.add_argument("--processes", type=int, default=4, help="simulating processes (default 4)")
    parser.add_argument("--connections", type=int, default=256, help="sockets in all (default 256)")
    parser.add_argument("--repeats", type=int, default=3, help="roll calls per size (default 3)")
    parser.add_argument(
        "--per-node",
        default="1",
        help="comma-separated ranks a participant answers for: 1, every rank its own watcher; 8, a node's agent "
        "answering for its 8 workers (hypergrid.run's default). Default: 1",
    )
    parser.add_argument(
        "--declared", action="store_true", help="the call declares the dead rank gone (as hypergrid.run's agent does)"
    )
    parser.add_argument("--json", type=pathlib.Path, help='write {"rows": [...]} here')
    args = parser.parse_args(argv)
    sizes = [int(size) for size in args.participants.split(",") if size]
    nodes = [int(node) for node in args.per_node.split(",") if node]
    if not nodes or min(nodes) < 1:
        parser.error(f"--per-node: {args.per_node!r}; expected ranks per participant, 1 or more")
    rows = run(sizes, args.processes, args.connections, args.repeats, nodes, args.declared)
    head = (
        "ranks",
        "per node",
        "answering",
        "sockets",
        "seconds",
        "closer s",
        "ops/rank",
        "ops, closers",
        "named dead",
    )
    print(" ".join(f"{name:>12}" for name in head))
    for row in rows:
        cells = [row["participants"], row["per_node"], row["answering"], row["sockets"], f"{row['seconds']:.3f}"]
        cells += [f"{row['closer_seconds']:.3f}", f"{row['store_ops_simulated_rank_mean']:.2f}"]
        cells += [row["store_ops_closers"], row["live_named_dead"]]
        print(" ".join(f"{cell!s:>12}" for cell in cells))
    if args.json:
        write_json(args.json, rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
