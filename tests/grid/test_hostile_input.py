"""Values that used to reach torch unchecked: refused before any communication, with the project's errors.

One table per entry point; every case names the value it refuses. A one-rank
gloo world is enough: each refusal happens before anything is sent.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

from hypergrid import (
    BackendError,
    GridSpecError,
    HyperCommGrid,
    HyperGridError,
    InvalidArgumentError,
    UnexpectedArgumentError,
)
from hypergrid.launch import spawn
from hypergrid.values import MAX_TIMEOUT_S, shown
from tests.workers import guard as guard_workers

pytestmark = pytest.mark.timeout(120)

# Each backend torch has not built in on this machine (gloo always is, in the wheels the tests run on).
UNAVAILABLE = [name for name in ("nccl", "mpi", "ucc", "xccl") if not getattr(dist, f"is_{name}_available")()]

BAD_BACKENDS = {
    "gloo:cpu": "reversed",  # device:backend the wrong way round: torch raised AssertionError
    "cpu:gloo,cpu:gloo": "twice",
    "cpu:gloo,": "not a device:backend pair",
    "cpu:gloo:x": "not a device:backend pair",
    "tpu:gloo": "not a device:backend pair",
    "undefined": "not a backend",
    "glo": "not a backend",
    "": "must be None",
    " ": "must be None",
}


@pytest.mark.parametrize("backend", sorted(BAD_BACKENDS))
def test_malformed_backends_are_refused_at_construction(backend: str) -> None:
    with pytest.raises(BackendError, match=BAD_BACKENDS[backend]) as error:
        HyperCommGrid([1], ["dp"], backend=backend)
    assert repr(backend) in str(error.value)


@pytest.mark.parametrize("backend", sorted(BAD_BACKENDS))
def test_malformed_backends_are_refused_by_create_pg(backend: str, one_rank_world: None) -> None:
    grid = HyperCommGrid([1], ["dp"])
    with pytest.raises(BackendError, match=BAD_BACKENDS[backend]):
        grid.create_pg("dp", backend=backend, tag="x")
    assert grid.created_keys == []


@pytest.mark.parametrize("form", ["gloo", "GLOO", " gloo ", "cpu:gloo", "CPU:gloo"])
def test_every_form_torch_accepts_for_gloo_works(form: str, one_rank_world: None) -> None:
    grid = HyperCommGrid([1], ["dp"])
    group = grid.create_pg("dp", backend=form, tag="cpu")
    tensor = torch.ones(2)
    dist.all_reduce(tensor, group=group)
    assert tensor.tolist() == [1.0, 1.0]
    grid.destroy()


@pytest.mark.skipif(not UNAVAILABLE, reason="every backend is built in here")
@pytest.mark.parametrize("form", ["{name}", "cpu:gloo,cuda:{name}"])
def test_backends_not_built_in_are_a_backend_error(form: str, one_rank_world: None) -> None:
    for name in UNAVAILABLE:
        backend = form.format(name=name)
        grid = HyperCommGrid([1], ["dp"], backend=backend)  # planning for another machine is fine
        with pytest.raises(BackendError, match=rf"backend {name!r} is not available"):
            grid.create_pg("dp")
        with pytest.raises(BackendError, match=rf"backend {name!r} is not available"):
            HyperCommGrid([1], ["dp"]).create_pg("dp", backend=backend, tag="other")


def test_a_backend_is_checked_by_name_and_torch_creates_it(monkeypatch: pytest.MonkeyPatch) -> None:
    # Megatron-Core's test_create_pg_with_options pattern: NCCL named on a machine without it, torch's creation
    # stood in for (no world), options passed through untouched.
    made: list[tuple[Any, dict[str, Any]]] = []
    group, options = object(), object()
    monkeypatch.setenv("WORLD_SIZE", "8")

    def stand_in(rank_enum: Any, **kwargs: Any) -> tuple[Any, None]:
        made.append((rank_enum, kwargs))
        return group, None

    monkeypatch.setattr(dist, "new_subgroups_by_enumeration", stand_in)
    grid = HyperCommGrid([2, 4], ["tp", "dp"], backend="nccl")
    assert grid.create_pg("tp", pg_options=options, group_desc="TEST_GROUP") is group
    assert made == [
        ([[0, 1], [2, 3], [4, 5], [6, 7]], {"backend": "nccl", "pg_options": options, "group_desc": "TEST_GROUP"})
    ]


@pytest.mark.skipif(not UNAVAILABLE, reason="every backend is built in here")
def test_a_backend_torch_lacks_is_one_line_naming_it_and_the_family(one_rank_world: None) -> None:
    name = UNAVAILABLE[0]
    made: list[Any] = []
    real = dist.new_subgroups_by_enumeration
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(c10d, "new_subgroups_by_enumeration", lambda *a, **k: made.append(a) or real(*a, **k))
        patch.setattr(dist, "new_subgroups_by_enumeration", c10d.new_subgroups_by_enumeration)
        with pytest.raises(BackendError) as error:
            HyperCommGrid([1], ["dp"], backend=name).create_pg("dp")
    text = str(error.value)
    assert "\n" not in text and f"backend {name!r} is not available" in text and "'dp'" in text, text
    assert "refused before any rank waits" in text and made == []  # torch was never asked


def test_a_backend_torch_lacks_is_refused_before_the_guard_waits() -> None:
    # Rank 0 alone asks (rank 1 never calls) with a guard timeout of 600 s: a wait would outlast the test's limit.
    name = UNAVAILABLE[0] if UNAVAILABLE else "nccl"
    if not UNAVAILABLE and torch.cuda.is_available():
        pytest.skip("every backend is built in here and CUDA is present")
    outcomes = spawn(guard_workers.unavailable_backend_alone, 2, (name,), timeout_s=90)
    assert outcomes[1] == {}
    for strategy, said in outcomes[0].items():
        assert said.startswith("BackendError") and f"backend {name!r}" in said, (strategy, said)
        assert "GuardTimeout" not in said and "create_pg 'dp@" not in said, said


def test_plain_nccl_without_a_cuda_device_is_refused(monkeypatch: pytest.MonkeyPatch, one_rank_world: None) -> None:
    # A torch built with NCCL on a machine without a GPU (stood in for: NCCL said available, CUDA said absent).
    monkeypatch.setattr(dist, "is_nccl_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(BackendError, match=r"torch.cuda.is_available\(\) is False"):
        HyperCommGrid([1], ["dp"]).create_pg("dp", backend="nccl", tag="gpu")


def test_members_only_mpi_groups_are_refused_by_name(one_rank_world: None) -> None:
    # torch has no use_local_synchronization for MPI (it raised a bare ValueError), built in or not
    with pytest.raises(BackendError, match="no members-only MPI groups"):
        HyperCommGrid([1], ["dp"], strategy="local").create_pg("dp", backend="mpi", tag="mpi")


def test_a_mocked_creation_is_not_refused_in_a_world(monkeypatch: pytest.MonkeyPatch, one_rank_world: None) -> None:
    # Megatron-Core's pattern inside an initialized world: torch's creation stood in for, so NCCL named on a
    # machine without it creates nothing, and nothing is refused (the stand-in gets exactly what we pass).
    made: list[tuple[Any, dict[str, Any]]] = []
    group = object()

    def stand_in(rank_enum: Any, **kwargs: Any) -> tuple[Any, None]:
        made.append((rank_enum, kwargs))
        return group, None

    monkeypatch.setattr(dist, "new_subgroups_by_enumeration", stand_in)
    grid = HyperCommGrid([1], ["dp"], backend="nccl")
    assert grid.create_pg("dp", group_desc="TEST_GROUP") is group
    assert made[0][0] == [[0]] and made[0][1]["backend"] == "nccl", made


@pytest.mark.parametrize(
    "timeout",
    [datetime.timedelta.max, datetime.timedelta(days=86_000), datetime.timedelta(seconds=MAX_TIMEOUT_S + 1)],
    ids=["max", "86000-days", "just-over-the-limit"],
)
def test_timeouts_torch_cannot_hold_are_refused_up_front(timeout: datetime.timedelta, one_rank_world: None) -> None:
    grid = HyperCommGrid([1], ["dp"])
    with pytest.raises(InvalidArgumentError, match="at most 100 years") as error:
        grid.create_pg("dp", timeout=timeout)
    assert repr(timeout) in str(error.value)
    with pytest.raises(InvalidArgumentError, match="at most 100 years"):
        HyperCommGrid([1], ["dp"], group_options={"timeout": timeout})
    assert grid.created_keys == []


def test_the_longest_timeout_allowed_works(one_rank_world: None) -> None:
    grid = HyperCommGrid([1], ["dp"])
    group = grid.create_pg("dp", timeout=datetime.timedelta(seconds=MAX_TIMEOUT_S))
    tensor = torch.ones(1)
    dist.all_reduce(tensor, group=group)
    assert tensor.tolist() == [1.0]
    grid.destroy()


@pytest.mark.parametrize(
    "seconds", [float("inf"), float("nan"), 10**400, 10**5000, MAX_TIMEOUT_S * 2, np.float64("inf")], ids=shown
)
def test_guard_timeouts_beyond_a_float_or_the_limit_are_refused(seconds: Any) -> None:
    with pytest.raises(InvalidArgumentError, match="guard_timeout_s"):
        HyperCommGrid([1], ["dp"], guard_timeout_s=seconds)


@pytest.mark.parametrize("shape", [[10**5000], [2, 10**5000]], ids=["one-dim", "two-dims"])
def test_shapes_too_long_to_print_are_a_grid_spec_error(shape: list[int]) -> None:
    with pytest.raises(GridSpecError, match="too long to print"):
        HyperCommGrid(shape, ["a", "b"][: len(shape)])


def test_get_pg_with_a_creation_option_names_it(one_rank_world: None) -> None:
    grid = HyperCommGrid([1, 1], ["tp", "dp"])
    grid.create_pg("tp", within="node", ranks_per_node=1)
    refused = r"get_pg got unexpected keyword argument\(s\) \['ranks_per_node'\]"
    with pytest.raises(UnexpectedArgumentError, match=refused):
        grid.get_pg("tp", within="node", ranks_per_node=4)
    grid.destroy()


def test_numpy_integers_are_ints_for_ranks_per_node(one_rank_world: None) -> None:
    grid = HyperCommGrid([1, 1], ["tp", "dp"])
    within = grid.pg("tp", within="node", ranks_per_node=np.int64(4))
    assert grid.pg("tp", within="node", ranks_per_node=np.int32(4)) is within
    tensor = torch.arange(3.0)
    grid.hierarchical_all_reduce(tensor, "tp", ranks_per_node=np.int64(4))
    assert tensor.tolist() == [0.0, 1.0, 2.0]
    grid.destroy()


def _op(call: str) -> Callable[[HyperCommGrid], Any]:
    tensor = torch.ones(4)
    return {
        "all_reduce": lambda grid: grid.all_reduce(tensor, "dp", op="sum"),
        "reduce_scatter": lambda grid: grid.reduce_scatter(tensor, "dp", op="sum"),
        "hierarchical_all_reduce": lambda grid: grid.hierarchical_all_reduce(tensor, "dp", op="sum", ranks_per_node=1),
    }[call]


@pytest.mark.parametrize("call", ["all_reduce", "reduce_scatter", "hierarchical_all_reduce"])
def test_an_op_that_is_not_a_reduce_op_is_refused(call: str, one_rank_world: None) -> None:
    grid = HyperCommGrid([1], ["dp"])
    with pytest.raises(InvalidArgumentError, match=r"op='sum' is not a torch.distributed.ReduceOp"):
        _op(call)(grid)
    grid.destroy()


TENSORS = {
    "expanded": (lambda: torch.ones(1).expand(4), "expanded"),
    "expanded 2-d": (lambda: torch.ones(3, 1).expand(3, 5), "expanded"),
    "sparse": (lambda: torch.eye(3).to_sparse(), "dense"),
}


@pytest.mark.parametrize("case", sorted(TENSORS))
def test_hierarchical_all_reduce_refuses_tensors_it_cannot_write_before_communicating(
    case: str, one_rank_world: None
) -> None:
    make, expected = TENSORS[case]
    grid = HyperCommGrid([1], ["dp"])
    sent: list[str] = []
    original = dist.all_reduce

    def counting(*args: Any, **kwargs: Any) -> Any:
        sent.append("all_reduce")
        return original(*args, **kwargs)

    dist.all_reduce = counting
    try:
        with pytest.raises(InvalidArgumentError, match=expected):
            grid.hierarchical_all_reduce(make(), "dp", ranks_per_node=1)
    finally:
        dist.all_reduce = original
    assert sent == []
    grid.destroy()


@pytest.mark.parametrize("call", ["all_gather", "reduce_scatter"])
def test_expanded_inputs_are_read_fine(call: str, one_rank_world: None) -> None:
    grid = HyperCommGrid([1], ["dp"])
    assert getattr(grid, call)(torch.ones(1).expand(4), "dp").tolist() == [1.0] * 4
    grid.destroy()


@pytest.mark.parametrize("call", ["all_gather", "reduce_scatter"])
def test_sparse_tensors_are_refused_by_gathering_collectives(call: str, one_rank_world: None) -> None:
    grid = HyperCommGrid([1], ["dp"])
    with pytest.raises(InvalidArgumentError, match="dense"):
        getattr(grid, call)(torch.eye(2).to_sparse(), "dp")
    grid.destroy()


@pytest.mark.parametrize("dtype", [torch.int64, torch.int8, torch.bool], ids=str)
@pytest.mark.parametrize("checked", [True, False], ids=["checked", "unchecked"])
def test_an_integer_gradient_is_refused_before_communicating(
    dtype: torch.dtype, checked: bool, one_rank_world: None
) -> None:
    # torch raised "result type Float can't be cast to the desired output type Long" from the division
    param = torch.zeros(3, dtype=dtype)
    param.grad = torch.ones(3, dtype=dtype)
    grid = HyperCommGrid([1], ["dp"], check_collectives=checked)
    sent: list[str] = []
    original = dist.all_reduce
    dist.all_reduce = lambda *args, **kwargs: sent.append("all_reduce") or original(*args, **kwargs)
    try:
        with pytest.raises(InvalidArgumentError) as error:
            grid.average_gradients([torch.zeros(2, requires_grad=True), param], "dp")
    finally:
        dist.all_reduce = original
    text = str(error.value)
    assert "\n" not in text and text.startswith("average_gradients: parameter 1") and str(dtype) in text, text
    assert sent == [] and param.grad.tolist() == torch.ones(3, dtype=dtype).tolist()
    grid.destroy()


@pytest.mark.parametrize("value", ["yes please", "2", "on!"])
def test_a_bad_check_collectives_variable_is_refused(value: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HYPERGRID_CHECK_COLLECTIVES", value)
    with pytest.raises(InvalidArgumentError, match=repr(value)):
        HyperCommGrid([1], ["dp"])
    assert HyperCommGrid([1], ["dp"], check_collectives=False).check_collectives is False


def test_every_refusal_is_a_hypergrid_error_and_a_builtin() -> None:
    for error in (BackendError, InvalidArgumentError):
        assert issubclass(error, (HyperGridError, ValueError))
    assert issubclass(UnexpectedArgumentError, TypeError)


@pytest.mark.parametrize("call", ["shrink", "grow"])
@pytest.mark.parametrize(
    ("argument", "said"),
    [
        ({"step": -1}, "step=-1: expected an int"),
        ({"step": "x"}, "step='x': expected an int"),
        ({"timeout_s": 0}, "timeout_s=0: expected a positive number of seconds"),
        ({"snapshots": 3}, "snapshots=3: expected a hypergrid.StepSnapshots"),
        ({"policy": "bad"}, "policy must be one of"),
    ],
)
def test_shrink_and_grow_name_a_bad_argument_before_torch_distributed_is_asked_for(
    call: str, argument: dict[str, Any], said: str
) -> None:
    """Issue 54: ``grow(step=-1)`` before init raised ``NotInitializedError``, not the bad argument."""
    assert not dist.is_initialized()
    grid = HyperCommGrid([2], ["dp"])
    with pytest.raises(InvalidArgumentError) as refused:
        getattr(grid, call)(**argument)
    assert str(refused.value).startswith(f"{call}: {said}"), str(refused.value)
