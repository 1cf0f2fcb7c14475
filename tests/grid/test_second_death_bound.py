"""The bound holds (issue 31, item 8): a second death at any moment of a shrink is absorbed within ``timeout_s`` + ~1 s.

`benchmarks.elastic.sweep`: 8 gloo ranks (tp=2 x dp=4, 600 s group timeouts),
rank 3 SIGKILLed in a step, rank 5 ``os._exit`` at moments spread over its own
shrink; every survivor of the new grid must get the right all-reduce, and the
slowest must be done within the documented bound of the second death (a few
seconds more allowed for this loaded 2-core box). The 20-run figures are in
docs/design/recovery.md (``python benchmarks/elastic.py --second-death 20``).
"""

from __future__ import annotations

import pytest

from benchmarks.elastic import sweep

pytestmark = [pytest.mark.processes]

TIMEOUT_S = 10.0
SLACK_S = 4.0  # process scheduling on a loaded 2-core host


@pytest.mark.stress
@pytest.mark.timeout(600)
def test_a_second_death_at_six_moments_of_a_shrink_is_absorbed_within_the_bound() -> None:
    result = sweep(8, 6, 0.12, TIMEOUT_S)
    counted = [sample for sample in result["samples"] if "error" not in sample]
    assert not result["not_absorbed"], result["samples"]
    assert counted, result["samples"]  # at least one second death came inside a shrink
    for sample in counted:
        assert sample["right"] and sample["dead"] == [3, 5], sample
        assert sample["absorbed_s"] <= TIMEOUT_S + 1.0 + SLACK_S, sample
