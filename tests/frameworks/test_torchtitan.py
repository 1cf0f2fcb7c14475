"""The torchtitan tier (``make test-frameworks``): hypergrid's meshes against torchtitan 0.3's own, at world 8.

For dense, cp 2, pp 2, ep 2 and ep 4 configurations under each spmd backend, every mesh torchtitan's
``ParallelDims`` gives out (world, the global meshes, every single-axis mesh, the spmd meshes, multi-axis
lookups) has the same dim names, the same ranks and the same groups on every rank when ``build_mesh`` is
hypergrid's. Skipped where torchtitan is not installed (the tier installs it).
"""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("torchtitan")

from hypergrid import spawn
from tests.workers import titan

pytestmark = [pytest.mark.processes, pytest.mark.timeout(900)]


@pytest.fixture(scope="module")
def results() -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = spawn(titan.oracle, titan.WORLD, (titan.BACKENDS,), timeout_s=840)
    return out


@pytest.mark.parametrize("config", [f"{c}/{b}" for c in titan.CONFIGS for b in titan.BACKENDS])
def test_every_mesh_has_torchtitans_members(results: list[dict[str, Any]], config: str) -> None:
    for rank, out in enumerate(results):
        run = out[config]
        assert run["ours"].keys() == run["theirs"].keys()
        for key in run["theirs"]:
            assert run["ours"][key] == run["theirs"][key], (rank, config, key)
        assert run["one_root"] is True and run["world_is_default"] is True


def test_the_meshes_compared_are_real(results: list[dict[str, Any]]) -> None:
    # Rank 3 (row-major pp, dp_replicate, dp_shard, cp, tp): groups written from torchtitan's documented order.
    runs = results[3]
    assert runs["dense/spmd_types"]["ours"]["axis:tp"] == (("tp",), [2, 3], [[2, 3]])
    assert runs["pp2/spmd_types"]["ours"]["axis:pp"] == (("pp",), [3, 7], [[3, 7]])
    assert runs["cp2/spmd_types"]["ours"]["axis:cp"] == (("cp",), [1, 3], [[1, 3]])
    assert runs["ep2/spmd_types"]["ours"]["axis:ep"] == (("ep",), [2, 3], [[2, 3]])
    assert runs["ep4/spmd_types"]["ours"]["axis:ep"] == (("ep",), [0, 1, 2, 3], [[0, 1, 2, 3]])
