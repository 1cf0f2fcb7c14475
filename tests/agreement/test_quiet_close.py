"""When the closers close a roll call (`hypergrid.agreement.liveness.Incident.close`): threads on a real TCPStore.

The bound runs from the end of the caller's wake (``I/woken``) and from the
last answer: a closer reads the count of answers and closes once the bound
passed since both, at the latest as long again as the wake took. So a roll
call whose answers all came in during a long wake closes the bound after its
end, not a wake's length later, and answers still coming in (a store that
serves them late) keep it open.
"""

from __future__ import annotations

import datetime
import time
from collections.abc import Iterator
from typing import Any

import pytest
from torch.distributed import TCPStore  # type: ignore[attr-defined]

from hypergrid.agreement import liveness
from hypergrid.agreement.liveness import QUIET_READS, done_key
from tests.agreement.test_liveness import roll_call

TIMEOUT = datetime.timedelta(seconds=60)


@pytest.fixture(scope="module")
def server() -> Iterator[Any]:
    yield TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=TIMEOUT)


@pytest.fixture(autouse=True)
def no_fallback(monkeypatch: pytest.MonkeyPatch) -> None:
    """10 s per rank: the fallback (`liveness.bound_s` from the call) is far; only the rule under test closes."""
    monkeypatch.setattr(liveness, "PER_RANK_S", 10.0)


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
    assert set(server.list_keys()) - before == {done_key(31)}
    # A closer: 24 at most before the count was read (`test_rollcall_scale`), then the count at the wake's end and
    # once at the bound, with a check for the verdict
    assert max(ops.values()) <= 24 + 3


@pytest.mark.timeout(60)
def test_answers_still_coming_in_after_the_bound_keep_the_roll_call_open_until_the_bound_passes_without_one(
    server: Any,
) -> None:
    # The wake ends 1.5 s after the call; ranks 3, 4 and 5 answer 1.8, 2.2 and 2.6 s after it, each within the
    # bound (0.5 s) of the one before, 4 and 5 past the bound from the wake's end (2.0 s); rank 6 never. Only rank
    # 6 is dead, and the verdict comes once 0.5 s passed without an answer (from 3.1 s), before the latest (3.5 s).
    before = set(server.list_keys())
    started = time.monotonic()
    late = {3: 1.8, 4: 2.2, 5: 2.6}
    verdicts, ops = roll_call(server, 32, 7, [0, 1, 2, 3, 4, 5], bound=0.5, late=late, woken_at=1.5)
    elapsed = time.monotonic() - started
    assert {verdict.dead for verdict in verdicts.values()} == {(6,)}
    assert elapsed >= 3.1, elapsed
    assert set(server.list_keys()) - before == {done_key(32)}
    # O(1) whatever the ranks: the count at the wake's end, then at most QUIET_READS + 1 reads of it after the bound,
    # each with a check for the verdict
    assert max(ops.values()) <= 24 + 1 + 2 * (QUIET_READS + 1)


@pytest.mark.timeout(60)
def test_answers_that_never_stop_coming_close_at_the_latest_as_long_again_as_the_wake_took(server: Any) -> None:
    # The wake ends 1 s after the call; ranks answer every 0.3 s until 3.3 s: the closers close at the latest
    # 1 s + 0.5 s + 1 s = 2.5 s after the call. Those that answered by then are alive, those after are dead.
    late = {rank: 0.3 * (rank - 1) for rank in range(3, 13)}  # 0.6 s (rank 3) to 3.3 s (rank 12)
    started = time.monotonic()
    verdicts, _ = roll_call(server, 33, 13, list(range(13)), bound=0.5, late=late, woken_at=1.0)
    elapsed = time.monotonic() - started
    published = {verdict.dead for verdict in verdicts.values() if verdict is not None}  # one verdict for all
    assert len(published) == 1, published
    dead = published.pop()
    assert dead and set(dead) <= {rank for rank, at in late.items() if at > 2.3}  # within 0.2 s of the latest
    assert {rank for rank, at in late.items() if at > 2.8} <= set(dead)  # 0.3 s past it: the closers did not wait
    for rank in dead:  # too late: each finds the incident over, or reads the verdict that names it
        assert verdicts[rank] is None or rank in verdicts[rank].dead
    assert elapsed < 4.5, elapsed
