"""The tp x dp example (examples/elastic_tp_dp.py) inside spawned gloo processes, a rank SIGKILLed at a chosen point.

The example's ``train`` runs as written (its recovery loop is docs/elastic.md's
recipe); ``--kill`` makes one rank kill itself at a point of a step.
"""

from __future__ import annotations

import importlib.util
import pathlib
from typing import Any

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
