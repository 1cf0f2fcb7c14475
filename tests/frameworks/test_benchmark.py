"""``benchmarks/torchtitan_meshes.py``: its report (with torchtitan, in the tier) and its refusal without it."""

from __future__ import annotations

import importlib.util
import json
import pathlib

import pytest

from benchmarks import torchtitan_meshes

HAVE_TORCHTITAN = importlib.util.find_spec("torchtitan") is not None


@pytest.mark.skipif(HAVE_TORCHTITAN, reason="torchtitan is installed: the report test runs instead")
def test_it_needs_torchtitan(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        torchtitan_meshes.main(["--repeats", "1"])
    assert exit_info.value.code == 2 and "needs torchtitan 0.3" in capsys.readouterr().err


@pytest.mark.skipif(not HAVE_TORCHTITAN, reason="needs torchtitan (make test-frameworks installs it)")
@pytest.mark.processes
@pytest.mark.timeout(600)
def test_one_job_each_side_by_side(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "meshes.json"
    assert torchtitan_meshes.main(["--repeats", "1", "--json", str(path)]) == 0
    rows = {row["builder"]: row for row in json.loads(path.read_text())}
    assert sorted(rows) == ["hypergrid", "torchtitan"]
    # dense (dp_replicate 2 x dp_shard 2 x tp 2): torchtitan's four unflattens make groups per dim each time;
    # hypergrid makes tp, dp_replicate, dp_shard, batch and efsdp once (the world is the default group) and one
    # fake one-rank group for every size-1 dim. enumerate calls new_group once per group of a family.
    assert (rows["hypergrid"]["real_groups_per_rank"], rows["hypergrid"]["fake_groups_per_rank"]) == (5, 1)
    assert rows["hypergrid"]["new_group_calls_per_rank"] == 4 + 4 + 4 + 2 + 2 + 1  # tp, dp_*, batch, efsdp, fake
    assert rows["torchtitan"]["real_groups_per_rank"] > rows["hypergrid"]["real_groups_per_rank"]
    assert all(row["seconds_max_median"] > 0 for row in rows.values())
