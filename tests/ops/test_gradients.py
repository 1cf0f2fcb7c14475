"""``grid.average_gradients``: the same gradients as one process on the whole batch, bucketed, checked first."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.distributed as dist

from hypergrid import DimsError, HyperCommGrid, InvalidArgumentError, spawn
from hypergrid.ops.gradients import gradient_buckets
from tests.workers import author as workers


@pytest.mark.processes
@pytest.mark.timeout(240)
@pytest.mark.parametrize("bucket_mb", [25, 0.0005])  # one bucket per dtype; many buckets of ~512 bytes
def test_averaging_over_dp_matches_one_process_on_the_whole_batch(bucket_mb: float) -> None:
    results = spawn(workers.averaged_gradients, 8, (bucket_mb,), timeout_s=180)
    model = workers.build_model()
    batch = torch.randn(16, 6)  # the workers' batch: same seed, drawn after the model
    # Equal quarters: the mean of the quarters' mean losses is the whole batch's mean loss.
    sum(workers.model_loss(model, quarter) for quarter in batch.chunk(4)).__truediv__(4).backward()
    expected = {name: p.grad for name, p in model.named_parameters()}
    assert expected["unused.weight"] is None and expected["hidden.bias"] is None
    for rank, grads in enumerate(results):
        assert grads.keys() == expected.keys()
        for name, grad in expected.items():
            if grad is None:
                assert grads[name] is None, (rank, name)
            else:
                torch.testing.assert_close(grads[name], grad, msg=f"rank {rank}, {name}")


def _model_with_grads(count: int, numel: int, double: tuple[int, ...] = ()) -> list[torch.Tensor]:
    dtypes = [torch.float64 if index in double else torch.float32 for index in range(count)]
    params = [torch.zeros(numel, dtype=dtype, requires_grad=True) for dtype in dtypes]
    for index, param in enumerate(params):
        param.grad = torch.full((numel,), float(index), dtype=param.dtype)
    return params


def test_buckets_keep_order_dtype_and_the_size_limit() -> None:
    params = _model_with_grads(10, 256, double=(5,))  # float32: 1 KiB each; the float64 one 2 KiB
    params[3].grad = None

    def indices(buckets: list[list[torch.Tensor]]) -> list[list[int]]:
        return [[next(i for i, p in enumerate(params) if p.grad is grad) for grad in bucket] for bucket in buckets]

    assert indices(gradient_buckets(params, bucket_mb=3 / 1024)) == [[0, 1, 2], [4, 6, 7], [8, 9], [5]]
    assert indices(gradient_buckets(params, bucket_mb=1 / 2048)) == [[0], [1], [2], [4], [6], [7], [8], [9], [5]]


@pytest.mark.usefixtures("one_rank_world")
def test_one_all_reduce_per_bucket(monkeypatch: pytest.MonkeyPatch) -> None:
    grid = HyperCommGrid([1], ["dp"])
    params = _model_with_grads(100, 64)  # 100 small parameters of 256 bytes
    calls: list[int] = []
    real = dist.all_reduce

    def counting(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        calls.append(tensor.numel())
        return real(tensor, *args, **kwargs)

    monkeypatch.setattr(dist, "all_reduce", counting)
    grid.average_gradients(params, "dp")
    assert calls == [100 * 64]
    calls.clear()
    grid.average_gradients(
        [*params, params[0]], "dp", bucket_mb=25 * 256 / 2**20
    )  # a tensor listed twice: once  # 25 parameters a bucket
    assert calls == [25 * 64] * 4
    assert [p.grad[0].item() for p in params] == [float(i) for i in range(100)]  # type: ignore[index]
    grid.destroy()


@pytest.mark.usefixtures("one_rank_world")
@pytest.mark.parametrize(
    ("args", "kwargs", "error", "text"),
    [
        (("model",), {}, InvalidArgumentError, "torch.nn.Module or an iterable of tensors, got 'model'"),
        (([torch.zeros(1), 3],), {}, InvalidArgumentError, "item 1 is not a tensor, got 3"),
        ((torch.nn.Linear(1, 1),), {"bucket_mb": 0}, InvalidArgumentError, "bucket_mb=0: expected a finite number > 0"),
        ((torch.nn.Linear(1, 1),), {"bucket_mb": True}, InvalidArgumentError, "bucket_mb=True"),
        ((torch.nn.Linear(1, 1), "xp"), {}, DimsError, "'xp'"),
    ],
)
def test_bad_arguments_are_refused_before_any_group_is_created(
    args: tuple[Any, ...], kwargs: dict[str, Any], error: type, text: str
) -> None:
    grid = HyperCommGrid([1], ["dp"])
    with pytest.raises(error, match=text.replace("(", r"\(").replace(")", r"\)")):
        grid.average_gradients(*args, **kwargs)
    assert grid.created_keys == []


@pytest.mark.usefixtures("one_rank_world")
@pytest.mark.parametrize(("backend", "op"), [("gloo", dist.ReduceOp.SUM), ("nccl", dist.ReduceOp.AVG)])
def test_avg_where_the_backend_has_it_else_sum_and_divide(
    backend: str, op: dist.ReduceOp.RedOpType, monkeypatch: pytest.MonkeyPatch
) -> None:
    grid = HyperCommGrid([1], ["dp"])
    grid.pg("dp")
    params = _model_with_grads(3, 4)
    ops: list[Any] = []
    monkeypatch.setattr(dist, "get_backend", lambda group=None: backend)
    monkeypatch.setattr(dist, "all_reduce", lambda tensor, op=None, group=None, async_op=False: ops.append(op))
    grid.average_gradients(params, "dp")
    assert ops == [op]
    grid.destroy()
