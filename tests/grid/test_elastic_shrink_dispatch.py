"""Where the backend can shrink in place (NCCL >= 2.27), shrink uses ``torch.distributed.shrink_group``.

No GPU here: gloo is checked to report that it cannot (the re-formed world is what
the process tests cover), and the dispatch itself with a stand-in backend that can.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

from hypergrid.binding import reform


@pytest.mark.usefixtures("one_rank_world")
def test_gloo_cannot_shrink_in_place() -> None:
    assert reform.can_shrink() is False


@pytest.mark.usefixtures("one_rank_world")
def test_a_backend_that_can_shrink_is_shrunk_in_place(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[Any] = []
    monkeypatch.setattr(reform, "can_shrink", lambda: True)
    monkeypatch.setattr(dist, "shrink_group", lambda excluded, shrink_flags: calls.append((excluded, shrink_flags)))
    base = c10d._get_default_store()
    namespace = reform.reform_world(base, 1, "kept/", 0, 1, reform.formed(), None, None, excluded=[5, 3])
    assert calls == [([3, 5], c10d.SHRINK_ABORT)]  # sorted; in-flight work aborted
    assert namespace == "kept/" and dist.is_initialized()  # shrunk in place: the group keeps its keys


@pytest.mark.usefixtures("one_rank_world")
def test_without_excluded_ranks_the_world_is_re_formed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(reform, "can_shrink", lambda: True)
    monkeypatch.setattr(dist, "shrink_group", lambda *args, **kwargs: pytest.fail("shrink_group called"))
    before, base = dist.group.WORLD, c10d._get_default_store()
    namespace = reform.reform_world(base, 1, None, 0, 1, reform.formed(), None, None, excluded=None)  # (reordered)
    assert dist.group.WORLD is not before and namespace is not None and namespace.startswith("hypergrid/elastic/1/")
