"""Members of a shrink attempt re-form the world under one group name, whatever their previous attempt left.

torch names the default group from a counter that it increments before the
rendezvous and that only ``destroy_process_group`` resets: a member whose
attempt failed inside ``init_process_group`` (a peer died in gloo's handshake)
kept a count the others had reset, so every later attempt looked for the
others' addresses under another name, and the shrink failed with "every member
still answers" (the second-death stress test, about 1 run in 10 at 40 ms).
"""

from __future__ import annotations

from typing import Any

import pytest

from hypergrid import spawn
from tests.workers import reform

pytestmark = [pytest.mark.processes, pytest.mark.timeout(120)]


def test_a_member_whose_init_failed_re_forms_the_world_with_the_others() -> None:
    results: list[Any] = spawn(reform.reform_after_a_failed_init, 3, (2,), timeout_s=90)
    assert results[2]["failed"] is not None and results[2]["counted"] == 1, results  # the state torch leaves
    assert [result["counted"] for result in results[:2]] == [0, 0], results
    assert [result["sum"] for result in results] == [6.0, 6.0, 6.0], results
    assert len({result["name"] for result in results}) == 1, results


def test_a_traceback_after_re_forming_the_world_has_one_rank_prefix(capsys: pytest.CaptureFixture[str]) -> None:
    """torch wraps ``sys.excepthook`` in a ``[rank<N>]:`` prefix at every world it forms; after a re-formation a
    traceback is prefixed once, with the new world's rank (issue 54: ``[rank3]: [rank4]:`` was seen)."""
    import datetime
    import sys

    import torch.distributed as dist

    from hypergrid.binding.reform import reform_world

    plain = sys.excepthook
    base = dist.HashStore()
    try:
        dist.init_process_group("gloo", store=dist.PrefixStore("first", base), rank=0, world_size=1)
        for number in (1, 2):
            reform_world(base, number, None, 0, 1, ("gloo", datetime.timedelta(seconds=30)), None, None)
        try:
            raise ValueError("after two re-formations")
        except ValueError:
            sys.excepthook(*sys.exc_info())
        printed = capsys.readouterr().err
        assert "[rank0]: ValueError: after two re-formations" in printed, printed
        assert "[rank0]: [rank0]:" not in printed, printed
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
        sys.excepthook = plain
