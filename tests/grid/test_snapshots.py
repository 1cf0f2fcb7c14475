"""``StepSnapshots`` in one process: which steps it keeps, what a restore gives back, and what it refuses."""

from __future__ import annotations

import pytest
import torch

from hypergrid import HyperCommGrid, StepSnapshots
from hypergrid.errors import InvalidArgumentError


def _model() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1)).double()
    return model, torch.optim.Adam(model.parameters(), lr=0.01)


def _train(model: torch.nn.Module, optimizer: torch.optim.Optimizer, step: int) -> None:
    x = torch.randn(16, 4, generator=torch.Generator().manual_seed(step), dtype=torch.float64)
    (model(x) ** 2).mean().backward()
    optimizer.step()
    optimizer.zero_grad()


def _state(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    tensors = [p.detach().clone() for p in model.parameters()]
    for per_param in optimizer.state_dict()["state"].values():
        tensors += [value.clone() for _, value in sorted(per_param.items())]
    return tensors


def _equal(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b))


@pytest.mark.parametrize(
    ("taken", "held"),
    [
        ([0, 1, 2, 3], (2, 3)),  # the last two
        ([0, 1, 2, 1], (1,)),  # a step held again: it is replaced, the newer ones go
        ([0, 1, 5], (5,)),  # a jump: start over (the steps held are consecutive)
        ([3], (3,)),
    ],
)
def test_the_steps_held(taken: list[int], held: tuple[int, ...]) -> None:
    snapshots = StepSnapshots(torch.zeros(1))
    for step in taken:
        snapshots.take(step)
    assert snapshots.steps == held and snapshots.step == held[-1]


def test_restore_gives_back_the_model_and_the_optimizer_of_that_step_and_clears_gradients() -> None:
    model, optimizer = _model()
    snapshots = StepSnapshots(model, optimizer)
    states = []
    for step in range(4):
        snapshots.take(step)
        states.append(_state(model, optimizer))
        _train(model, optimizer, step)
    x = torch.ones(2, 4, dtype=torch.float64)
    model(x).sum().backward()  # a failed step's gradients, left behind
    assert snapshots.restore(2) == 2 and snapshots.steps == (2,)
    assert _equal(_state(model, optimizer), states[2])
    assert all(p.grad is None for p in model.parameters())
    # Training on from the restored state is the training that never failed, bitwise.
    _train(model, optimizer, 2)
    _train(model, optimizer, 3)
    reference, reference_optimizer = _model()
    for step in range(4):
        _train(reference, reference_optimizer, step)
    assert _equal(_state(model, optimizer), _state(reference, reference_optimizer))


def test_the_snapshot_survives_the_optimizer_it_was_restored_into() -> None:
    model, optimizer = _model()
    snapshots = StepSnapshots(model, optimizer)
    _train(model, optimizer, 0)
    snapshots.take(1)
    kept = _state(model, optimizer)
    for _ in range(2):  # restore, train on (the optimizer updates its state in place), restore again
        snapshots.restore(1)
        assert _equal(_state(model, optimizer), kept)
        _train(model, optimizer, 1)


def test_plain_tensors_are_restored_in_place() -> None:
    w = torch.zeros(3, requires_grad=True)
    snapshots = StepSnapshots([w])
    snapshots.take(0)
    with torch.no_grad():
        w += 1
    w.grad = torch.ones(3)
    snapshots.restore(0)
    assert w.tolist() == [0.0, 0.0, 0.0] and w.grad is None


@pytest.mark.parametrize(
    ("make", "words"),
    [
        (lambda: StepSnapshots(object()), "state_dict"),
        (lambda: StepSnapshots(keep=0), "keep=0"),
        (lambda: StepSnapshots(torch.zeros(1)).restore(0), "a step held: []"),
        (lambda: StepSnapshots(torch.zeros(1)).take(-1), "step=-1"),
    ],
)
def test_bad_arguments_are_refused(make: object, words: str) -> None:
    with pytest.raises(InvalidArgumentError, match=None) as raised:
        make()  # type: ignore[operator]
    assert words in str(raised.value)


def _holding_a_state() -> StepSnapshots:
    """Snapshots that hold a state (an empty one, a set-up a death cut short, needs no family to restore nothing)."""
    snapshots = StepSnapshots(torch.zeros(1))
    snapshots.take(0)
    return snapshots


@pytest.mark.usefixtures("one_rank_world")
@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"step": 1, "snapshots": StepSnapshots()}, "pass one"),
        ({"step": -1}, "step=-1"),
        ({"snapshots": "mine"}, "StepSnapshots"),
        ({"snapshots": _holding_a_state(), "dim": "dp"}, "create_pg('dp')"),
    ],
)
def test_shrink_refuses_a_bad_step_or_snapshots_before_anything_happens(kwargs: dict, words: str) -> None:
    grid = HyperCommGrid([1, 1], ["tp", "dp"])
    grid.create_pg("tp")
    with pytest.raises(InvalidArgumentError) as raised:
        grid.shrink(**kwargs)
    assert words in str(raised.value) and "shrink" in str(raised.value)
    assert grid.created_keys == ["tp"]  # nothing torn down
    grid.destroy()


def test_the_advice_when_no_member_holds_the_step_names_the_real_cause() -> None:
    """Issue 54: with a replica dim of size 1 the advice was to keep more snapshots, where no replica exists."""
    from hypergrid.grid.snapshots import _no_holder

    alone = _no_holder(7, "dp", [0])
    assert "has no other member (dp has size 1)" in alone and "keep more snapshots" not in alone
    assert "checkpoint" in alone
    assert "keep more snapshots" in _no_holder(7, "dp", [0, 0])
