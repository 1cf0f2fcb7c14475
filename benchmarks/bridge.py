"""``hypergrid.Bridge``'s direct schedule against a leader-then-broadcast one (Megatron's design), in one run.

    python benchmarks/bridge.py [--bytes 16M] [--iters 10] [--warmup 2] [--json out.json]

8 gloo ranks: the source grid on ranks 0-3, the destination on 4-7, for each
pair of ``PAIRS``. A step moves one global float32 tensor of ``--bytes`` from
the source's ranks to the destination's. Two schedules, timed alternately:

- ``direct``: ``Bridge.send_forward`` / ``recv_forward`` (every destination rank
  receives its pieces from the source ranks that hold them, load spread over
  the source's copies);
- ``leader``: the baseline reimplemented from Megatron-Core's
  ``BridgeCommunicator``: the first ``tp`` rank of each source replica sends
  its slice to the first ``tp`` rank of each destination replica that needs
  it (fan-in or fan-out), which then broadcasts its slice over its ``tp``
  group.

A step's time is the slowest rank's (all-reduce of the maximum), from a
barrier to the end of the transfer; the table gives the median over
``--iters`` steps. Bytes are counted per rank from the schedules themselves:
what a rank posts (and for the broadcast, the root sending the slice once to
each other member, as a flat broadcast does; gloo's own algorithm may spread
that over the members).
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import time
from typing import Any

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

import torch
import torch.distributed as dist

from benchmarks.common import human_bytes, median, parse_bytes, progress, write_json
from hypergrid import Bridge, HyperCommGrid, spawn
from hypergrid.layout.bridge_plan import plan_transfer

#: (source (shape, names), destination (shape, names)); the source on ranks 0-3, the destination on 4-7.
PAIRS = {
    "tp1 dp4 -> tp2 dp2": (([1, 4], ["tp", "dp"]), ([2, 2], ["tp", "dp"])),
    "tp2 dp2 -> tp2 dp2": (([2, 2], ["tp", "dp"]), ([2, 2], ["tp", "dp"])),
    "tp2 dp2 -> tp1 dp4": (([2, 2], ["tp", "dp"]), ([1, 4], ["tp", "dp"])),
}
WIDTH = 256  # float32 columns per row of the global tensor


def direct_bytes(src: HyperCommGrid, dst: HyperCommGrid, rows: int) -> tuple[dict[int, int], dict[int, int]]:
    """Bytes each rank sends and receives in the direct schedule (from the bridge's own plan)."""
    sent: dict[int, int] = {}
    received: dict[int, int] = {}
    for piece in plan_transfer(src.layout, dst.layout, batch=rows):
        if piece.sender != piece.receiver:
            size = (piece.batch[1] - piece.batch[0]) * WIDTH * 4
            sent[piece.sender] = sent.get(piece.sender, 0) + size
            received[piece.receiver] = received.get(piece.receiver, 0) + size
    return sent, received


def leader_routes(src: HyperCommGrid, dst: HyperCommGrid, rows: int) -> list[tuple[int, int, int, int]]:
    """The baseline's leader-to-leader transfers: (source leader, destination leader, first row, last row)."""
    routes = []
    src_dp, dst_dp = src.layout.dim_size("dp"), dst.layout.dim_size("dp")
    src_rows, dst_rows = rows // src_dp, rows // dst_dp
    for s in range(src_dp):
        for d in range(dst_dp):
            start, stop = max(s * src_rows, d * dst_rows), min((s + 1) * src_rows, (d + 1) * dst_rows)
            if start < stop:
                routes.append((src.layout.rank_at(tp=0, dp=s), dst.layout.rank_at(tp=0, dp=d), start, stop))
    return routes


def leader_bytes(src: HyperCommGrid, dst: HyperCommGrid, rows: int) -> tuple[dict[int, int], dict[int, int]]:
    sent: dict[int, int] = {}
    received: dict[int, int] = {}
    for sender, receiver, start, stop in leader_routes(src, dst, rows):
        size = (stop - start) * WIDTH * 4
        sent[sender] = sent.get(sender, 0) + size
        received[receiver] = received.get(receiver, 0) + size
    tp, dst_rows = dst.layout.dim_size("tp"), rows // dst.layout.dim_size("dp")
    for rank in range(dst.rank_offset, dst.rank_offset + dst.size):
        if dst.layout.coord_of(rank).tp == 0:
            sent[rank] = sent.get(rank, 0) + (tp - 1) * dst_rows * WIDTH * 4
        else:
            received[rank] = received.get(rank, 0) + dst_rows * WIDTH * 4
    return sent, received


def leader_step(src: HyperCommGrid, dst: HyperCommGrid, x: torch.Tensor, rows: int) -> None:
    """One transfer of the baseline: leader to leader, then a broadcast over the destination's tp group."""
    rank = dist.get_rank()
    ops, buffers = [], []
    src_rows, dst_rows = rows // src.layout.dim_size("dp"), rows // dst.layout.dim_size("dp")
    for sender, receiver, start, stop in leader_routes(src, dst, rows):
        if rank == sender:
            first = src.layout.coord_of(rank).dp * src_rows
            ops.append(dist.P2POp(dist.isend, x[start - first : stop - first].contiguous(), receiver))
        if rank == receiver:
            buffers.append((start, torch.empty(stop - start, WIDTH)))
            ops.append(dist.P2POp(dist.irecv, buffers[-1][1], sender))
    if ops:
        for work in dist.batch_isend_irecv(ops):
            work.wait()
    if dst.layout.contains(rank):
        mine = torch.empty(dst_rows, WIDTH)
        first = dst.layout.coord_of(rank).dp * dst_rows
        for start, buffer in buffers:
            mine[start - first : start - first + buffer.shape[0]] = buffer
        dst.broadcast(mine, "tp", group_src=0)


def worker(size: int, iters: int, warmup: int) -> list[dict[str, Any]]:
    rank = dist.get_rank()
    rows = max(4, size // (WIDTH * 4)) // 4 * 4
    out = []
    for name, ((s_shape, s_names), (d_shape, d_names)) in PAIRS.items():
        src, dst = HyperCommGrid(s_shape, s_names), HyperCommGrid(d_shape, d_names, rank_offset=4)
        src.create_pgs(["tp", "dp"])
        dst.create_pgs(["tp", "dp"])
        bridge = Bridge(src, dst)
        x = torch.randn(rows // src.layout.dim_size("dp"), WIDTH) if rank < 4 else None
        times: dict[str, list[float]] = {"direct": [], "leader": []}
        for step in range(warmup + iters):
            for schedule in times:
                dist.barrier()
                started = time.perf_counter()
                if schedule == "direct":
                    bridge.send_forward(x) if x is not None else bridge.recv_forward()
                else:
                    leader_step(src, dst, x if x is not None else torch.empty(0), rows)
                took = torch.tensor([time.perf_counter() - started], dtype=torch.float64)
                dist.all_reduce(took, op=dist.ReduceOp.MAX)
                if step >= warmup:
                    times[schedule].append(float(took.item()))
        for schedule, counted in (("direct", direct_bytes(src, dst, rows)), ("leader", leader_bytes(src, dst, rows))):
            sent, received = counted
            out.append(
                {
                    "pair": name,
                    "schedule": schedule,
                    "bytes": rows * WIDTH * 4,
                    "max_sent_per_rank": max(sent.values()),
                    "max_received_per_rank": max(received.values()),
                    "total_bytes_moved": sum(sent.values()),
                    "hops": 1 if schedule == "direct" else 2,
                    "time_ms_median": 1e3 * median(times[schedule]),
                }
            )
        bridge.destroy()
        src.destroy()
        dst.destroy()
    return out


def format_rows(rows: list[dict[str, Any]]) -> str:
    lines = ["# pair                 schedule  max sent/rank  max recv/rank  total moved  time/step (median)  ratio"]
    for row in rows:
        base = next(r for r in rows if r["pair"] == row["pair"] and r["schedule"] == "leader")
        lines.append(
            f"{row['pair']:<22} {row['schedule']:<8} {human_bytes(row['max_sent_per_rank']):>13} "
            f"{human_bytes(row['max_received_per_rank']):>14} {human_bytes(row['total_bytes_moved']):>12} "
            f"{row['time_ms_median']:>15.2f} ms  {row['time_ms_median'] / base['time_ms_median']:5.2f}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bytes", type=parse_bytes, default=parse_bytes("16M"), help="global tensor size")
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--json", type=str, default=None)
    args = parser.parse_args(argv)
    progress(f"bridge: {len(PAIRS)} pairs, {human_bytes(args.bytes)} per step, {args.iters} steps, 8 gloo ranks")
    rows: list[dict[str, Any]] = spawn(worker, 8, (args.bytes, args.iters, args.warmup), timeout_s=600)[0]
    print(format_rows(rows))
    if args.json:
        write_json(pathlib.Path(args.json), rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
