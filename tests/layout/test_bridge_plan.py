"""The bridge's schedule against a single-process reference: slice the global tensor by each layout, compare.

The reference knows nothing of the planner: it cuts a global array of distinct
numbers by the sender's and receiver's layouts (coordinates computed here from
Megatron's rule: dim 0 innermost, ``rank_offset`` first), assembles what each
receiving rank gets from the pieces, taking each piece out of its sender's
own slice, and compares with the receiver's slice of the global array.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hypergrid.errors import InvalidArgumentError
from hypergrid.layout import GridLayout
from hypergrid.layout.bridge_plan import Roles, boundary_ranks, plan_transfer

ROLES = ("tp", "cp", "dp", "pp")


def coords(shape: list[int], names: list[str], offset: int, rank: int) -> dict[str, int]:
    """``rank``'s coordinate on each named dim (dim 0 innermost), 0 on the roles the grid lacks."""
    local, found = rank - offset, dict.fromkeys(ROLES, 0)
    for size, name in zip(shape, names):
        found[name] = local % size
        local //= size
    return found


def sizes(shape: list[int], names: list[str]) -> dict[str, int]:
    found = dict.fromkeys(ROLES, 1)
    found.update(zip(names, shape))
    return found


def reference_slice(
    shape: list[int], names: list[str], offset: int, rank: int, batch: int, seq: int, sharded: bool
) -> tuple[slice, slice]:
    at, size = coords(shape, names, offset, rank), sizes(shape, names)
    rows = batch // size["dp"]
    if not sharded:
        return slice(at["dp"] * rows, (at["dp"] + 1) * rows), slice(0, seq)
    positions = seq // size["cp"]
    return slice(at["dp"] * rows, (at["dp"] + 1) * rows), slice(at["cp"] * positions, (at["cp"] + 1) * positions)


@st.composite
def sides(draw: st.DrawFn) -> tuple[list[int], list[str], int]:
    names = list(draw(st.permutations(ROLES)))[: draw(st.integers(1, 4))]
    shape = [draw(st.integers(1, 3)) for _ in names]
    while math.prod(shape) > 8:
        shape[shape.index(max(shape))] -= 1
    return shape, names, draw(st.integers(0, 8))


@settings(max_examples=300, deadline=None)
@given(
    src=sides(),
    dst=sides(),
    multiple=st.integers(1, 3),
    sharded=st.booleans(),
    seq_multiple=st.integers(1, 2),
    reverse=st.booleans(),
)
def test_every_receiver_assembles_exactly_its_slice(
    src: tuple[list[int], list[str], int],
    dst: tuple[list[int], list[str], int],
    multiple: int,
    sharded: bool,
    seq_multiple: int,
    reverse: bool,
) -> None:
    if reverse:  # the gradients' way back: the destination's first stage sends to the source's last
        src, dst = dst, src
    (s_shape, s_names, s_off), (d_shape, d_names, d_off) = src, dst
    s_size, d_size = sizes(s_shape, s_names), sizes(d_shape, d_names)
    batch = math.lcm(s_size["dp"], d_size["dp"]) * multiple
    seq = math.lcm(s_size["cp"], d_size["cp"]) * seq_multiple * 2
    world = np.arange(batch * seq).reshape(batch, seq)
    sender, receiver = GridLayout(s_shape, s_names, s_off), GridLayout(d_shape, d_names, d_off)
    s_stage, d_stage = ("first", "last") if reverse else ("last", "first")
    pieces = plan_transfer(
        sender, receiver, batch=batch, seq=seq if sharded else None, sender_stage=s_stage, receiver_stage=d_stage
    )
    s_pp = 0 if s_stage == "first" else s_size["pp"] - 1
    d_pp = 0 if d_stage == "first" else d_size["pp"] - 1
    senders = [r for r in range(s_off, s_off + math.prod(s_shape)) if coords(s_shape, s_names, s_off, r)["pp"] == s_pp]
    receivers = [
        r for r in range(d_off, d_off + math.prod(d_shape)) if coords(d_shape, d_names, d_off, r)["pp"] == d_pp
    ]
    held = {r: reference_slice(s_shape, s_names, s_off, r, batch, seq, sharded) for r in senders}
    sent = dict.fromkeys(senders, 0)
    for receiver_rank in receivers:
        rows, positions = reference_slice(d_shape, d_names, d_off, receiver_rank, batch, seq, sharded)
        got = np.full((rows.stop - rows.start, positions.stop - positions.start), -1)
        covered = np.zeros_like(got)
        for piece in (p for p in pieces if p.receiver == receiver_rank):
            assert piece.sender in held, piece  # only the sender's boundary stage sends
            own_rows, own_positions = held[piece.sender]
            p_seq = piece.seq or (positions.start, positions.stop)
            assert own_rows.start <= piece.batch[0] < piece.batch[1] <= own_rows.stop, (piece, own_rows)
            assert own_positions.start <= p_seq[0] < p_seq[1] <= own_positions.stop, (piece, own_positions)
            local = world[own_rows, own_positions]  # what the sender holds, in its own indices
            part = local[
                piece.batch[0] - own_rows.start : piece.batch[1] - own_rows.start,
                p_seq[0] - own_positions.start : p_seq[1] - own_positions.start,
            ]
            at = (slice(piece.batch[0] - rows.start, piece.batch[1] - rows.start),)
            at += (slice(p_seq[0] - positions.start, p_seq[1] - positions.start),)
            got[at] = part
            covered[at] += 1
            if piece.sender != piece.receiver:
                sent[piece.sender] += part.size
        assert (covered == 1).all(), (receiver_rank, covered)
        np.testing.assert_array_equal(got, world[rows, positions])
    assert {p.receiver for p in pieces} <= set(receivers)
    # The load of one block's holders: at most the even share of what is asked of them plus one piece.
    blocks: dict[tuple[int, int, int, int], list[int]] = {}
    for rank, (rows, positions) in held.items():
        blocks.setdefault((rows.start, rows.stop, positions.start, positions.stop), []).append(rank)
    for ranks in blocks.values():
        asked = sum(sent[r] for r in ranks)
        biggest = max(
            [(p.batch[1] - p.batch[0]) * ((p.seq or (0, seq))[1] - (p.seq or (0, seq))[0]) for p in pieces] + [0]
        )
        assert max(sent[r] for r in ranks) <= asked / len(ranks) + biggest, (ranks, sent)


def test_two_to_three_spreads_over_tp_copies() -> None:
    src = GridLayout([2, 2], ["tp", "dp"])  # ranks 0..3: dp0 = {0, 1}, dp1 = {2, 3}
    dst = GridLayout([3], ["dp"], rank_offset=4)
    pieces = plan_transfer(src, dst, batch=6)
    assert sorted({p.sender for p in pieces}) == [0, 1, 2, 3]  # every tp copy sends a share
    assert boundary_ranks(GridLayout([2, 3], ["tp", "pp"], 2), "first") == [2, 3]


def test_more_holders_than_requests_split_the_rows() -> None:
    pieces = plan_transfer(GridLayout([4], ["tp"]), GridLayout([1], ["dp"], rank_offset=4), batch=8)
    assert [(p.sender, p.batch) for p in pieces] == [(0, (0, 2)), (1, (2, 4)), (2, (4, 6)), (3, (6, 8))]


def test_a_rank_that_holds_its_slice_takes_it_from_itself() -> None:
    same = GridLayout([2, 2], ["tp", "dp"])
    pieces = plan_transfer(same, same, batch=4)
    assert all(p.sender == p.receiver for p in pieces) and len(pieces) == 4


@pytest.mark.parametrize(
    ("batch", "seq", "text"),
    [
        (4, None, "the global batch 4 must be a positive multiple of the destination's dp size 3"),
        (6, 5, "the global sequence length 5 must be a positive multiple of the source's cp size 2"),
    ],
)
def test_sizes_that_do_not_divide_are_refused(batch: int, seq: int | None, text: str) -> None:
    src, dst = GridLayout([2, 2], ["cp", "dp"]), GridLayout([3], ["dp"])
    with pytest.raises(InvalidArgumentError, match=text):
        plan_transfer(src, dst, batch=batch, seq=seq, roles=Roles())
