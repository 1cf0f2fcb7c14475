"""``hypergrid.Bridge`` on 8 gloo ranks against single-process slicing, and a dead peer on 4.

Every destination rank must receive exactly its slice of the global tensor
(cut here by the reference of tests/layout/test_bridge_plan.py) and every
source rank exactly its slice of the gradient, for several pairs of grids:
2 -> 3 data-parallel, cp-sharded sequences, pipelines on both sides, grids on
the same or overlapping ranks, four dtypes; the combined calls in a pipelined
schedule; shapes that change; a checked bridge whose sender disagrees and a
bridge built differently on one rank (both: the same error on every
participant, no hang); senders that go wrong without checked collectives (a
refused tensor, a dtype or shape that changes, a batch the senders disagree
on: an error on every rank, no hang, nothing wrong delivered, and the next
transfer correct).
"""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from hypergrid import WorkerDeath, spawn
from tests.layout.test_bridge_plan import coords, reference_slice, sizes
from tests.workers import bridge as workers
from tests.workers import bridge_mismatch

pytestmark = [pytest.mark.processes]


def expected(
    spec: tuple[list[int], list[str], int], stage: str, tensor: torch.Tensor, batch_dim: int, seq_dim: int | None
) -> dict[int, torch.Tensor]:
    """Each boundary rank of ``spec`` and its slice of ``tensor`` (the reference's cut)."""
    shape, names, offset = spec
    stage_index = sizes(shape, names)["pp"] - 1 if stage == "last" else 0
    seq = tensor.shape[seq_dim] if seq_dim is not None else 1
    out = {}
    for rank in range(offset, offset + math.prod(shape)):
        if coords(shape, names, offset, rank)["pp"] != stage_index:
            continue
        rows, positions = reference_slice(shape, names, offset, rank, tensor.shape[batch_dim], seq, seq_dim is not None)
        part = tensor.narrow(batch_dim, rows.start, rows.stop - rows.start)
        if seq_dim is not None:
            part = part.narrow(seq_dim, positions.start, positions.stop - positions.start)
        out[rank] = part
    return out


@pytest.fixture(scope="module")
def results() -> list[dict[str, Any]]:
    outcome: list[dict[str, Any]] = spawn(workers.everything, 8, timeout_s=150)
    return outcome


@pytest.mark.timeout(200)
@pytest.mark.parametrize("name", sorted(workers.CASES))
def test_every_rank_gets_exactly_its_slice_forward_and_back(results: list[dict[str, Any]], name: str) -> None:
    src, dst, shape, batch_dim, seq_dim, dtype = workers.CASES[name]
    activation, grad = workers.global_tensors(shape, dtype)
    forward = expected(dst, "first", activation, batch_dim, seq_dim)
    backward = expected(src, "last", grad, batch_dim, seq_dim)
    for rank, result in enumerate(results):
        got = result[name]
        assert set(got) == {key for key, ranks in (("forward", forward), ("backward", backward)) if rank in ranks}
        if rank in forward:
            assert got["forward"].dtype == dtype
            torch.testing.assert_close(got["forward"], forward[rank], rtol=0, atol=0, msg=f"{name} rank {rank}")
        if rank in backward:
            torch.testing.assert_close(got["backward"], backward[rank], rtol=0, atol=0, msg=f"{name} rank {rank}")


def test_the_combined_calls_pipeline_three_micro_batches(results: list[dict[str, Any]]) -> None:
    xs = [torch.arange(8.0).reshape(8, 1) * (k + 1) for k in range(3)]
    for rank in range(4, 8):
        dp = (rank - 4) // 2  # dst [2, 2] tp, dp from rank 4
        want = [x[4 * dp : 4 * dp + 4] for x in xs]
        for got, slice_ in zip(results[rank]["pipelined"]["activations"], want):
            torch.testing.assert_close(got, slice_)
    for rank in range(4):
        for got, x in zip(results[rank]["pipelined"]["grads"], xs):
            torch.testing.assert_close(got, -x[2 * rank : 2 * rank + 2])


def test_variable_shapes_and_a_checked_mismatch(results: list[dict[str, Any]]) -> None:
    for rank in (2, 3):
        seen = results[rank]["variable and checked"]
        for rows in (2, 3):
            torch.testing.assert_close(seen[f"rows {rows}"], torch.full((rows, 2), float(rank - 2)))
    for rank in range(4):
        seen = results[rank]["variable and checked"]
        assert seen["checked 0"] is None
        kind, text = seen["checked 1"]
        assert kind == "CollectiveMismatchError", (rank, text)
        assert "rank(s) [0] sent the global shape [6, 2] float32" in text, text
        assert "the bridge carries shape [4, 2] float32" in text, text


def test_a_bridge_built_differently_on_one_rank_is_a_desync_on_every_participant(
    results: list[dict[str, Any]],
) -> None:
    for rank in range(4):
        kind, text = results[rank]["desync"]["desync"]
        assert kind == "DesyncError", (rank, text)
        assert "batch_dim" in text, text
    assert all(results[rank]["desync"]["desync"] is None for rank in range(4, 8))


@pytest.mark.timeout(120)
def test_a_dead_receiver_is_a_rank_failure_for_its_sender() -> None:
    outcome = spawn(workers.a_death, 4, timeout_s=90, allow_deaths=True)
    assert isinstance(outcome[3], WorkerDeath)
    assert outcome[1]["error"] == "RankFailure", outcome[1]  # its pieces go to rank 3
    for rank in (0, 2):  # a transfer between two live ranks: it completes, or the failure news ends it
        assert outcome[rank]["error"] in (None, "RankFailure"), outcome[rank]
    assert all(outcome[rank]["seconds"] < 60 for rank in (0, 1, 2)), outcome


#: case -> (the step that goes wrong, the sender that refuses its tensor; None: the senders disagree).
SPOILED = {
    "a dtype the bridge does not carry, first transfer": (0, 0),
    "more than 8 dims, first transfer": (0, 0),
    "a dtype change after the first transfer": (1, 1),
    "a shape change after the first transfer": (1, 1),
    "senders disagree on the batch, first transfer": (0, None),
}


@pytest.fixture(scope="module")
def mismatches() -> list[dict[str, list[Any]]]:
    outcome: list[dict[str, list[Any]]] = spawn(bridge_mismatch.every_mismatch, 4, timeout_s=90)
    return outcome


@pytest.mark.timeout(150)
@pytest.mark.parametrize("case", sorted(bridge_mismatch.CASES))
def test_an_unchecked_sender_gone_wrong_is_an_error_on_every_rank_and_the_next_transfer_is_right(
    mismatches: list[dict[str, list[Any]]], case: str
) -> None:
    assert set(SPOILED) == set(bridge_mismatch.CASES)
    spoiled, refuser = SPOILED[case]
    for rank, outcome in enumerate(mismatches):
        steps = outcome[case]
        assert len(steps) == len(bridge_mismatch.CASES[case]), (rank, steps)
        for step, (kind, got) in enumerate(steps):
            if step != spoiled:
                assert kind == "ok", (rank, step, got)
                if rank < 2:
                    assert got is None
                else:  # the receivers' slices of the global [4, 2]: sender 0's rows hold 1, sender 1's hold 2
                    torch.testing.assert_close(got, torch.full((2, 2), rank - 1.0), msg=f"{case} rank {rank}")
            elif rank == refuser:
                assert kind == "InvalidArgumentError", (rank, got)
            elif refuser is not None:
                assert kind == "CollectiveMismatchError", (rank, got)
                assert f"rank(s) [{refuser}] refused its tensor" in got, got
            else:
                assert kind == "CollectiveMismatchError", (rank, got)
                assert "rank(s) [0] sent the global shape [4, 2] float32" in got, got
                assert "rank(s) [1] sent the global shape [6, 2] float32" in got, got


def test_a_gradient_gone_wrong_in_the_combined_calls_is_an_error_on_every_rank(
    mismatches: list[dict[str, list[Any]]],
) -> None:
    spoiled = {1: 2, 3: 3}  # step -> the receiver whose gradient is refused (first with headers first, then fixed)
    for rank, outcome in enumerate(mismatches):
        steps = outcome["combined calls"]
        assert len(steps) == len(bridge_mismatch.COMBINED), (rank, steps)
        for step, (kind, got) in enumerate(steps):
            if step not in spoiled:
                assert kind == "ok", (rank, step, got)
                want = -(rank + 1.0) if rank < 2 else rank - 1.0  # its gradient slice, or its activation slice
                torch.testing.assert_close(got, torch.full((2, 2), want), msg=f"rank {rank} step {step}")
            elif rank == spoiled[step]:
                assert kind == "InvalidArgumentError", (rank, step, got)
            else:
                assert kind == "CollectiveMismatchError", (rank, step, got)
                assert f"rank(s) [{spoiled[step]}] refused its tensor" in got, got
