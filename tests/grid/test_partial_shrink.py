"""``shrink`` called by only some live ranks (issue 30, item 5).

The callers wait for the absent ranks until ``timeout_s`` (they are alive:
their watchers answer every roll call, so nothing declares them dead sooner;
docs/elastic.md states this bound), then go on without them; an absent rank's
every grid call from then on raises ``FencedError`` (the world's record of its
end names it, read on the rank's first call whatever its watcher has read by
then) and its process ends normally, without a signal.
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
        # FencedError on every call: the world's record of its end names the rank, whether or not its watcher
        # read the end's call before the callers deleted it (issue 31 item 4).
        assert results[rank]["errors"] == ["FencedError", "FencedError"], (rank, results[rank])
