"""``shrink`` called by only some live ranks (issue 30, item 5).

The callers wait for the absent ranks until ``timeout_s`` (they are alive:
their watchers answer every roll call, so nothing declares them dead sooner;
docs/elastic.md states this bound), then go on without them; an absent rank's
next grid call raises a ``HyperGridError`` (``RankFailure`` if it comes before
its watcher read the world's end, ``FencedError`` from then on; see the test
for the rare run where the end is never read) and its process ends normally,
without a signal.
"""

from __future__ import annotations

from typing import Any

import pytest

from hypergrid import spawn
from tests.workers import partial

pytestmark = [pytest.mark.processes, pytest.mark.timeout(180)]


def test_absent_live_ranks_are_left_behind_after_timeout_and_fenced() -> None:
    timeout_s = 4.0
    results: list[Any] = spawn(partial.partial_shrink, 4, ([0, 1], timeout_s), timeout_s=120)
    for rank in (0, 1):
        assert results[rank].get("dead") == [2, 3], (rank, results[rank])
        assert results[rank]["world"] == 2, results[rank]
        assert timeout_s <= results[rank]["seconds"] < timeout_s + 15.0, results[rank]
    for rank in (2, 3):
        # A HyperGridError each time, never a hang or a raw torch error. Usually FencedError from the second call
        # on; in about 1 run in 5 here the rank's watcher never read the world's end and it stays RankFailure
        # (issue 31 item 4, "the stopped are fenced, always", is open).
        assert len(results[rank]["errors"]) == 2, (rank, results[rank])
        assert set(results[rank]["errors"]) <= {"RankFailure", "FencedError"}, (rank, results[rank])
