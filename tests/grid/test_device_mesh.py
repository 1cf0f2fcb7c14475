"""DeviceMesh export at world 8: one root per grid, named and cached meshes, flatten, views, size-1 and world groups.

Each property has a check that fails without it; training runs compare FSDP2 + tensor parallelism on the grid's
meshes bitwise against the same run on torch's own ``init_device_mesh`` meshes. Expected values are written here
from the layout's documented order (tp innermost, then cp, dp_shard, dp_replicate, pp), never read from the export.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from hypergrid import spawn
from tests.workers import meshes as workers

pytestmark = [pytest.mark.processes, pytest.mark.timeout(400)]
WORLD = 8


@pytest.fixture(scope="module")
def results() -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = spawn(workers.mesh_scenarios, WORLD, timeout_s=360)
    return out


def _replica(rank: int) -> tuple[int, int, int]:
    """(dp_replicate, dp_shard, tp) coordinates of ``rank``: tp = rank % 2, dp_shard = rank // 2 % 2, ..."""
    return rank // 4, rank // 2 % 2, rank % 2


def test_named_dims_and_the_same_object(results: list[dict[str, Any]]) -> None:
    for out in results:
        assert out["named"] == (("batch", "tp"), [[0, 1], [2, 3], [4, 5], [6, 7]])
        assert out["named_again_same"] is True and out["named_batch_is_family"] is True


def test_every_mesh_derives_from_one_root(results: list[dict[str, Any]]) -> None:
    for out in results:
        assert out["root"] == (("world",), list(range(WORLD)))
        assert out["one_root"] == [True] * 5
        # Separate exports concatenate as torch's own submeshes do (FSDP's HSDP + TP path).
        assert out["concatenated"] == (("dp_replicate", "dp_shard", "tp"), [[[0, 1], [2, 3]], [[4, 5], [6, 7]]])


def test_a_mesh_mixes_grid_and_view_dims(results: list[dict[str, Any]]) -> None:
    for rank, out in enumerate(results):
        # (pp 1, dp_replicate 2, efsdp 1, ep 4): ep is 4 consecutive ranks, dp_replicate the halves.
        assert out["sparse"] == (("pp", "dp_replicate", "efsdp", "ep"), [[[[0, 1, 2, 3]], [[4, 5, 6, 7]]]])
        ep = [0, 1, 2, 3] if rank < 4 else [4, 5, 6, 7]
        assert out["sparse_groups"] == (True, True, ep)


def test_flatten_resolves_to_the_grids_family(results: list[dict[str, Any]]) -> None:
    for rank, out in enumerate(results):
        tp = rank % 2
        assert out["flat"] == (("dp_replicate_dp_shard",), [tp, tp + 2, tp + 4, tp + 6], True)
        assert out["flat_is_family"] is True and out["flat_sparse_is_family"] is True
        assert out["new_groups_from_flatten"] == 0
        assert out["flatten_name_taken"] is True


def test_unflatten_splits_into_families(results: list[dict[str, Any]]) -> None:
    for rank, out in enumerate(results):
        half = 0 if rank < 4 else 4
        assert out["unflatten"] == (("dp_replicate", "rest"), [[0, 1, 2, 3], [4, 5, 6, 7]], True, True)
        assert out["unflatten_rest_ranks"] == [half, half + 1, half + 2, half + 3]
        assert out["unflatten_refused"] == "DimsError"


def test_size1_dims_and_the_default_group(results: list[dict[str, Any]]) -> None:
    for out in results:
        assert out["size1_backends"] == ["fake", "fake"]
        assert out["world_is_default"] == (True, True)
        assert out["one_rank_real_groups"] == []
        # tp, dp_shard, dp_replicate (2 each), dp_replicate-dp_shard and ep (4), dp_replicate-efsdp (2), the world (8).
        assert out["real_groups"] == [(2, "gloo"), (2, "gloo"), (2, "gloo"), (4, "gloo"), (4, "gloo"), (8, "gloo")]


def test_pickled_mesh_is_plain(results: list[dict[str, Any]]) -> None:
    for out in results:
        assert out["pickled"] == ("DeviceMesh", ("batch", "tp"), [[0, 1], [2, 3], [4, 5], [6, 7]])


def test_destroy_forgets_the_meshes(results: list[dict[str, Any]]) -> None:
    for out in results:
        assert out["after_destroy"] == (True, True, [[0, 1], [2, 3], [4, 5], [6, 7]])
        assert out["sources_left"] == 0


def _same(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a["losses"], b["losses"])) and all(
        torch.equal(a["params"][name], b["params"][name]) for name in b["params"]
    )


def test_training_on_the_grids_meshes_is_bitwise_torchs(results: list[dict[str, Any]]) -> None:
    assert results[0]["torch_mesh"] == [[[0, 1], [2, 3]], [[4, 5], [6, 7]]]
    reference = results[0]["reference"]
    for out in results:
        assert _same(out["hsdp_grid"], out["hsdp_torch"])
        assert _same(out["fsdp_grid"], out["fsdp_torch"])
        for name, value in reference.items():  # and right: one process on the four replicas' batches
            assert torch.allclose(out["hsdp_grid"]["params"][name], value, atol=3e-7), name
            assert torch.allclose(out["fsdp_grid"]["params"][name], value, atol=3e-7), name
    # The replicas trained on different batches: their losses differ (the comparison above is not vacuous).
    assert results[0]["hsdp_grid"]["losses"][0] != results[4]["hsdp_grid"]["losses"][0]


def test_subgrid_members_and_outsiders() -> None:
    results = spawn(workers.subgrid_scenarios, WORLD, timeout_s=120)
    for rank, out in enumerate(results):
        if 2 <= rank < 6:
            assert out["mesh"] == ([2, 3, 4, 5], [2, 3, 4, 5], "gloo")
        else:
            assert out["mesh"] == "RankError"
        assert out["world_after"] == WORLD


def test_fsdp_with_mixed_precision_over_a_size1_dim() -> None:
    for out in spawn(workers.size1_fsdp_scenario, 2, timeout_s=120):
        assert out["backend"] == "fake"
        assert _same(out["grid"], out["torch"])
        assert out["grid"]["params"]["0.weight"].dtype == torch.float32  # trained in bf16, kept in fp32
