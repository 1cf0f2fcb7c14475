"""The toolkit on 8 real gloo ranks: collectives on every family, autograd mappings, pipeline p2p, mesh, MPU.

Expectations are computed here from each rank's coordinates, written out by
hand (not from the grid's enumeration), and the inputs' definition.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

from hypergrid import spawn
from tests.workers import toolkit as toolkit_workers
from tests.workers.toolkit import contribution

pytestmark = [pytest.mark.processes, pytest.mark.timeout(300)]
WORLD = 8
FAMILIES = ["tp", "pp", "dp", "pp-tp", "dp-tp", "dp-pp", "dp-pp-tp"]


def tpd(rank: int) -> dict[str, int]:
    """Coordinates in the [2, 2, 2] (tp, pp, dp) grid: tp innermost."""
    return {"tp": rank % 2, "pp": rank // 2 % 2, "dp": rank // 4}


def members(rank: int, dims: list[str], coords: Callable[[int], dict[str, int]] = tpd, ranks: Any = None) -> list[int]:
    """The ranks that share every coordinate of ``rank`` except along ``dims``, ascending."""
    mine = coords(rank)
    pool = range(WORLD) if ranks is None else ranks
    return [q for q in pool if all(coords(q)[d] == mine[d] for d in mine if d not in dims)]


@pytest.fixture(scope="module")
def results() -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = spawn(
        toolkit_workers.toolkit_scenarios, WORLD, (["tp", "dp-tp", "dp-pp-tp"],), timeout_s=240
    )
    return out


def _equal(got: Any, expected: torch.Tensor) -> bool:
    return torch.equal(torch.tensor(got, dtype=torch.float64), expected)


def test_every_collective_on_every_family(results: list[dict[str, Any]]) -> None:
    for rank, result in enumerate(results):
        collectives = result["collectives"]
        assert sorted(key for key in collectives if key != "errors") == sorted(FAMILIES)
        for key in FAMILIES:
            got = collectives[key]
            group = members(rank, key.split("-"))
            n, position = len(group), group.index(rank)
            assert _equal(got["all_reduce"], sum(contribution(q, 2, 3) for q in group)), (rank, key)
            assert _equal(got["all_reduce_async"], sum(contribution(q, 1, 2) for q in group))
            assert _equal(got["all_reduce_max"], torch.stack([contribution(q, 1, 2) for q in group]).amax(0))
            assert _equal(got["all_gather_0"], torch.cat([contribution(q, 2, 3) for q in group], 0))
            assert _equal(got["all_gather_1"], torch.cat([contribution(q, 2, 3) for q in group], 1))
            assert got["all_gather_neg"] == got["all_gather_1"]
            total0 = sum(contribution(q, 2 * n, 3) for q in group)
            total1 = sum(contribution(q, 3, 2 * n) for q in group)
            assert isinstance(total0, torch.Tensor) and isinstance(total1, torch.Tensor)
            assert _equal(got["reduce_scatter_0"], total0[2 * position : 2 * position + 2])
            assert _equal(got["reduce_scatter_1"], total1[:, 2 * position : 2 * position + 2])
            assert _equal(got["broadcast"], contribution(group[-1], 2, 2))
            assert _equal(got["broadcast_async"], contribution(group[1], 1, 1))
            assert got["same_group"] is True


def test_collective_errors_name_the_value(results: list[dict[str, Any]]) -> None:
    errors = results[0]["collectives"]["errors"]
    assert errors["non_dividing"].startswith("InvalidArgumentError") and "size 3" in errors["non_dividing"]
    assert "4 equal chunks" in errors["non_dividing"]
    assert errors["bad_group_src"].startswith("InvalidArgumentError") and "group_src=2" in errors["bad_group_src"]
    assert errors["unknown_dims"].startswith("DimsError") and "'ep'" in errors["unknown_dims"]
    assert errors["bad_dim"].startswith("InvalidArgumentError") and "dim=3" in errors["bad_dim"]


def test_autograd_mappings_match_single_process_references(results: list[dict[str, Any]]) -> None:
    for result in results:
        assert set(result["autograd"]) == {"tp", "dp-tp", "dp-pp-tp"}
        for dims, checks in result["autograd"].items():
            assert checks == {"column": True, "row": True, "sequence": True, "input_untouched": True}, dims


def test_pipeline_neighbours_and_real_send_recv(results: list[dict[str, Any]]) -> None:
    for rank, result in enumerate(results):
        # [2, 4] (tp, pp): a ring of 4 stages along pp, stride 2.
        tp, pp = rank % 2, rank // 2
        prev, nxt = tp + 2 * ((pp - 1) % 4), tp + 2 * ((pp + 1) % 4)
        ring = result["pipeline"]["ring4"]
        assert (ring["prev"], ring["next"], tuple(ring["shift"])) == (prev, nxt, (prev, nxt))
        assert ring["recv_prev"] == [prev, 1.0] and ring["recv_next"] == [nxt, -1.0]
        assert ring["forward"] == prev * 10.0
        assert ring["peers"] == [(nxt, "isend"), (prev, "irecv"), (prev, "isend"), (nxt, "irecv")]
        assert ring["groups_are_grids"] is True
        # [2, 2, 2]: a ring of 2, where both neighbours are one rank; the pairs still match.
        other = rank ^ 2
        ring = result["pipeline"]["ring2"]
        assert (ring["prev"], ring["next"]) == (other, other)
        assert ring["recv_prev"] == [other, 1.0] and ring["recv_next"] == [other, -1.0]
        assert ring["forward"] == other * 10.0


def test_mesh_with_a_combined_dim_uses_the_grids_groups(results: list[dict[str, Any]]) -> None:
    full = torch.arange(32, dtype=torch.float64).reshape(8, 4)
    for rank, result in enumerate(results):
        mesh = result["mesh"]
        c = tpd(rank)
        assert tuple(mesh["names"]) == ("dp", "pp_tp")
        assert mesh["mesh"] == [[tp + 2 * pp + 4 * dp for pp in range(2) for tp in range(2)] for dp in range(2)]
        assert mesh["groups"] == {"dp": members(rank, ["dp"]), "pp_tp": members(rank, ["pp", "tp"])}
        assert mesh["local_ranks"] == {"dp": c["dp"], "pp_tp": 2 * c["pp"] + c["tp"]}
        assert mesh["same_objects"] is True and mesh["again_same"] is True
        assert mesh["new_groups_on_reexport"] == 0
        assert mesh["single"] == (("dp_pp_tp",), list(range(8)), True)
        index = 2 * c["pp"] + c["tp"]
        assert _equal(mesh["local"], full[2 * index : 2 * index + 2]) and mesh["full_back"] is True


def test_mpu_getters_against_the_grid(results: list[dict[str, Any]]) -> None:
    # Dense [2, 2, 1, 2] (tp, cp, dp, pp) and expert [1, 2, 2, 2] (etp, ep, edp, pp) over 8 ranks.
    def dense(r: int) -> dict[str, int]:
        return {"tp": r % 2, "cp": r // 2 % 2, "dp": 0, "pp": r // 4}

    def expert(r: int) -> dict[str, int]:
        return {"etp": 0, "ep": r % 2, "edp": r // 2 % 2, "pp": r // 4}

    for rank, result in enumerate(results):
        mpu = result["mpu"]
        assert mpu["shapes"] == ([2, 2, 1, 2], ["tp", "cp", "dp", "pp"], [1, 2, 2, 2], ["etp", "ep", "edp", "pp"])
        expected = {
            "data": members(rank, ["dp"], dense),
            "tensor": members(rank, ["tp"], dense),
            "pipe": members(rank, ["pp"], dense),
            "model": members(rank, ["tp", "pp"], dense),
            "context": members(rank, ["cp"], dense),
            "expert": members(rank, ["ep"], expert),
            "expert_tensor": members(rank, ["etp"], expert),
            "expert_data": members(rank, ["edp"], expert),
        }
        assert mpu["groups"] == expected
        assert mpu["ranks"] == mpu["group_ranks"] == {role: g.index(rank) for role, g in expected.items()}
        assert mpu["sizes"] == {role: len(g) for role, g in expected.items()}
        assert mpu["context_global_ranks"] == expected["context"]
        pipe = expected["pipe"]
        i = pipe.index(rank)
        assert (mpu["next"], mpu["prev"]) == (pipe[(i + 1) % 2], pipe[(i - 1) % 2]) == tuple(mpu["grid_next_prev"])
        assert (mpu["first_rank"], mpu["last_rank"]) == (pipe[0], pipe[-1])
        first = dense(rank)["pp"] == 0
        assert mpu["first"] == (first, first) and mpu["last"] == (not first, first, not first)
        assert mpu["pipe_shared"] is True


@pytest.mark.parametrize("strategy", ["enumerate", "local"])
def test_sub_grid_members_and_non_members(results: list[dict[str, Any]], strategy: str) -> None:
    sub = range(2, 6)  # [2, 2] (tp, dp) over ranks 2..5

    def coords(r: int) -> dict[str, int]:
        return {"tp": (r - 2) % 2, "dp": (r - 2) // 2}

    for rank, result in enumerate(results):
        got = result[f"sub_{strategy}"]
        assert got["world_after"] == WORLD  # nobody hung or fell out of step
        if rank in sub:
            assert got["all_reduce"] == "no error"
            assert got["all_reduce_value"] == sum(members(rank, ["dp"], coords, sub))
            assert got["mesh"] == {
                "mesh": [[2, 3], [4, 5]],
                "names": ("dp", "tp"),
                "dp": members(rank, ["dp"], coords, sub),
                "tp": members(rank, ["tp"], coords, sub),
            }
        else:
            for text in (got["all_reduce"], got["mesh"]):
                assert text.startswith("RankError") and f"rank {rank} is outside the grid" in text
                assert "ranks 2..5" in text
            assert got["all_reduce_value"] == rank  # untouched: no collective ran on the world
