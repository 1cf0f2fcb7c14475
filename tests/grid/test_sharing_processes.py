"""Sharing, tags and backend twins across spawned gloo ranks: membership, all_reduce, destroy, guard."""

from __future__ import annotations

from typing import Any

import pytest

from hypergrid import spawn
from tests.references import megatron_rank_groups
from tests.workers import sharing as workers

pytestmark = [pytest.mark.processes]

SHAPE, NAMES = [2, 1, 2, 2], ["tp", "cp", "ep", "dp"]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("strategy", ["enumerate", "local"])
def test_shared_groups_have_the_enumerated_members_and_work(strategy: str) -> None:
    results: list[dict[str, Any]] = spawn(workers.shared_families, 8, (strategy,), timeout_s=240)
    sizes = dict(zip(NAMES, SHAPE))
    for rank, out in enumerate(results):
        memberships: dict[tuple[int, ...], list[str]] = {}
        for key, seen in out["families"].items():
            expected = next(g for g in megatron_rank_groups("-".join(NAMES), sizes, key) if rank in g)
            assert seen["ranks"] == expected and seen["sum"] == sum(expected), (rank, key)
            memberships.setdefault(tuple(expected), []).append(key)
        # Families share an object exactly when their members are the same.
        for keys in memberships.values():
            for key in keys:
                assert out["families"][key]["same_as"] == sorted(keys), (rank, key)
        assert out["communicators"] == len(memberships) + 2 == 8 + 2  # 7 memberships, the single-rank group, 2 tagged
        dp = next(g for g in megatron_rank_groups("-".join(NAMES), sizes, "dp") if rank in g)
        assert out["twin"] == {"distinct": True, "ranks": [dp, dp], "sums": [sum(dp)] * 3}
        assert out["held_back_to_before"]


OPTIONS = [("timeout", "timeout=200s"), ("tag", "'dp@ag'"), ("backend", "backend='gloo'")]


@pytest.fixture(scope="module")
def verdicts() -> list[dict[str, str]]:
    """One world of 4 for every option: each rank's verdict by what differs on rank 2."""
    out: list[dict[str, str]] = spawn(workers.differing_options_each, 4, (2, [w for w, _ in OPTIONS]), timeout_s=240)
    return out


@pytest.mark.timeout(300)
@pytest.mark.parametrize(("what", "needle"), OPTIONS)
def test_ranks_asking_with_other_options_get_the_mismatch_error(
    verdicts: list[dict[str, str]], what: str, needle: str
) -> None:
    results = [verdict[what] for verdict in verdicts]
    assert all(message.startswith("ranks disagree") for message in results), results
    assert all(needle in message and "rank(s) 2 asked for" in message for message in results)
