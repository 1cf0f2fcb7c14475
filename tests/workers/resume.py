"""The tp x dp example (examples/elastic_tp_dp.py) inside spawned gloo processes, a rank SIGKILLed at a chosen point.

The example's ``train`` runs as written (its recovery loop is docs/elastic.md's
recipe); ``--kill`` makes one rank kill itself at a point of a step.
"""

from __future__ import annotations

import importlib.util
import os
import pathlib
import signal
import threading
from typing import Any

import torch.distributed as dist

from hypergrid import HyperCommGrid

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "examples" / "elastic_tp_dp.py"


def example() -> Any:
    """The example as a module (examples/ is not a package)."""
    spec = importlib.util.spec_from_file_location("elastic_tp_dp", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def train(flags: list[str]) -> dict[str, Any]:
    """Run the example's training with ``flags`` on the spawned world; this rank's outcome."""
    module = example()
    return dict(module.train(module.parser().parse_args([*flags, "--quiet"])))


def check_trial(
    outcomes: dict[int, Any], victims: list[int], steps: int, *, context: object = "", complete: bool = True
) -> None:
    """What every trial must end with, from each first rank's outcome (a dead rank's is a `WorkerDeath` or absent).

    ``complete``: ``outcomes`` has every rank (spawn's results), else only the survivors' reports.

    Every survivor at the final step; survivors that went through the same
    shrinks resumed at the same steps; the dp replicas of each tp shard hold
    bitwise equal weights; every shard equals the one-process replay.
    """
    survivors = {first: seen for first, seen in outcomes.items() if isinstance(seen, dict) and "rank" in seen}
    assert survivors, (context, outcomes)
    for first in victims:
        assert first not in survivors, (context, first, outcomes.get(first))
    for first, seen in outcomes.items() if complete else ():
        if first not in victims:
            assert isinstance(seen, dict) and ("rank" in seen or seen.get("retired") or seen.get("spare")), (
                context,
                first,
                seen,
            )
    assert sorted(seen["rank"] for seen in survivors.values()) == list(range(len(survivors))), (context, survivors)
    for first, seen in survivors.items():
        assert seen["step"] == steps, (context, first, seen)
        assert seen["max_abs_vs_one_process"] < 1e-9, (context, first, seen)
        shape = seen["shape"]
        assert shape == next(iter(survivors.values()))["shape"], (context, survivors)
    by_tp: dict[int, set[str]] = {}
    for seen in survivors.values():
        by_tp.setdefault(seen["tp"], set()).add(seen["weights_sha256"])
    assert all(len(digests) == 1 for digests in by_tp.values()), (context, by_tp)
    assert len(by_tp) == next(iter(survivors.values()))["shape"]["tp"], (context, by_tp)
    last = [seen["resumed"][-1] for seen in survivors.values() if seen["resumed"]]
    assert len(set(last)) <= 1, (context, survivors)  # the last shrink agreed one step for every survivor


def train_dying_in_creation(flags: list[str], victim: int, delay_ms: float) -> dict[str, Any]:
    """`train`, with rank ``victim`` SIGKILLed ``delay_ms`` ms after its loop begins creating the families (the
    grid is built and this rank joined the world's roll calls: its death is a death, not a late start)."""
    if dist.get_rank() == victim:
        original = HyperCommGrid.create_pgs

        def create_pgs(self: Any, *args: Any, **kwargs: Any) -> Any:
            threading.Timer(delay_ms / 1000, os.kill, (os.getpid(), signal.SIGKILL)).start()
            return original(self, *args, **kwargs)

        HyperCommGrid.create_pgs = create_pgs  # type: ignore[method-assign]  # (a spawned process of its own)
    return train(flags)


def train_dying_at_the_finish(flags: list[str], victim: int) -> dict[str, Any]:
    """`train`, with rank ``victim`` SIGKILLed as its loop reaches the finish line (before the replica check: the
    others wait for it there)."""
    if dist.get_rank() == victim:
        from hypergrid.loop import course

        def dying(*args: Any) -> bool:
            os.kill(os.getpid(), signal.SIGKILL)
            return False

        course.replicas_equal = dying  # type: ignore[assignment]  # (a spawned process of its own)
    return train(flags)
