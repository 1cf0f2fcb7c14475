"""When the closers close a roll call (`hypergrid.agreement.liveness.Incident.close`): threads on a real TCPStore.

The bound runs from the end of the caller's wake (``I/woken``) and from the
last answer: a closer reads the count of answers and closes once the bound
passed since both, at the latest as long again as the wake took. So a roll
call whose answers all came in during a long wake closes the bound after its
end, not a wake's length later (the rule before this one), answers still
coming in (a store that serves them late) keep it open, and the latest still
holds.
"""

from __future__ import annotations

import datetime
import time
from collections.abc import Iterator
from typing import Any

import pytest
from torch.distributed import TCPStore  # type: ignore[attr-defined]

import hypergrid.timing
from hypergrid.agreement.liveness import world_keys
from tests.agreement.test_liveness import roll_call
from tests.agreement.test_rollcall_scale import CLOSER_OPS

TIMEOUT = datetime.timedelta(seconds=60)


@pytest.fixture(scope="module")
def server() -> Iterator[Any]:
    yield TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=TIMEOUT)


@pytest.fixture(autouse=True)
def no_fallback(monkeypatch: pytest.MonkeyPatch) -> None:
    """10 s per rank: the fallback (`liveness.bound_s` from the call) is far; only the rule under test closes."""
    monkeypatch.setattr(hypergrid.timing, "PER_PARTICIPANT_S", 10.0)


@pytest.mark.timeout(60)
def test_answers_all_in_during_a_long_wake_close_the_bound_after_it_not_a_wakes_length_later(server: Any) -> None:
    # The wake takes 2 s; ranks 0 to 3 answered at once, rank 4 never: the closers close 0.5 s after the wake's end
    # (2.5 s), not 0.5 s + 2 s after it (4.5 s, the latest: as long again as the wake took), never before 2.5 s.
    before = set(server.list_keys())
    started = time.monotonic()
    verdicts, ops = roll_call(server, 31, 5, [0, 1, 2, 3], bound=0.5, woken_at=2.0)
    elapsed = time.monotonic() - started
    assert {verdict.dead for verdict in verdicts.values()} == {(4,)}
    assert 2.5 <= elapsed < 4.0, elapsed
    assert set(server.list_keys()) - before == set(world_keys(31))
    # A closer: 24 at most before the count was read (`test_rollcall_scale`), then the count at the wake's end and
    # at its pace until a bound passes without an answer, each with a check for the verdict
    assert max(ops.values()) <= CLOSER_OPS


@pytest.mark.timeout(60)
def test_answers_still_coming_in_after_the_bound_keep_the_roll_call_open_until_the_bound_passes_without_one(
    server: Any,
) -> None:
    # The wake ends 2 s after the call; ranks 3, 4 and 5 answer 2.3, 2.7 and 3.1 s after it, each within the bound
    # (0.5 s) of the one before, 4 and 5 past the bound from the wake's end (2.5 s); rank 6 never. Only rank 6 is
    # dead, and the verdict comes once 0.5 s passed without an answer (from 3.6 s), well before the latest (as long
    # again as the wake took: 4.5 s, where the rule before this one closed).
    before = set(server.list_keys())
    started = time.monotonic()
    late = {3: 2.3, 4: 2.7, 5: 3.1}
    verdicts, ops = roll_call(server, 32, 7, [0, 1, 2, 3, 4, 5], bound=0.5, late=late, woken_at=2.0)
    elapsed = time.monotonic() - started
    assert {verdict.dead for verdict in verdicts.values()} == {(6,)}
    assert 3.6 <= elapsed < 4.4, elapsed
    assert set(server.list_keys()) - before == set(world_keys(32))
    assert max(ops.values()) <= CLOSER_OPS  # O(1) whatever the ranks (`test_rollcall_scale`)


@pytest.mark.timeout(60)
def test_answers_that_do_not_stop_coming_close_at_the_latest_as_long_again_as_the_wake_took(server: Any) -> None:
    # A 2 s bound; the wake ends 1 s after the call; ranks 3 and 4 answer 1.5 and 3.0 s after it (each within the
    # bound of the one before), rank 5 never: the closers close at the latest, 1 + 2 + 1 = 4 s after the call, not
    # once the bound passed without an answer (5 s). Every rank that answered is alive.
    started = time.monotonic()
    verdicts, _ = roll_call(server, 33, 6, [0, 1, 2, 3, 4], bound=2.0, late={3: 1.5, 4: 3.0}, woken_at=1.0)
    elapsed = time.monotonic() - started
    assert {verdict.dead for verdict in verdicts.values()} == {(5,)}
    assert 4.0 <= elapsed < 4.7, elapsed
