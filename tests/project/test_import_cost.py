"""What importing hypergrid costs a process: never torch's heavy lazy modules, which the forkserver imports instead.

torch's DTensor module pulls in sympy (0.7 to 1 s of CPU a process): a grid that imported it made every rank of
every job pay, 3 s of a 6-worker start on 2 cores. ``torch._dynamo`` (1.3 s), which a process's first optimizer
imports, and the grid are imported once by ``hypergrid.spawn``'s forkserver, so a forked worker finds them imported
(`hypergrid.launch.spawned.PRELOAD`); a fresh interpreter does not.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from hypergrid import spawn
from tests.workers import basic as workers

HEAVY = ("torch.distributed.tensor", "sympy", "torch._dynamo")


def test_importing_the_grid_imports_none_of_torchs_heavy_lazy_modules() -> None:
    code = (
        "import sys, torch, torch.distributed, hypergrid, hypergrid.grid; "
        f"print(','.join(name for name in {HEAVY!r} if name in sys.modules))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert result.stdout.strip() == "", f"importing hypergrid.grid imported {result.stdout.strip()}"


@pytest.mark.processes
@pytest.mark.timeout(180)
def test_a_forked_worker_starts_with_the_grid_and_dynamo_imported_a_fresh_one_without() -> None:
    forked = spawn(workers.imported, 2, (["hypergrid.grid", "torch._dynamo"],), start_method="forkserver")
    fresh = spawn(workers.imported, 1, (["torch._dynamo"],), start_method="spawn")
    assert forked == [["hypergrid.grid", "torch._dynamo"]] * 2
    assert fresh == [[]]  # so the worker's own module did not import it: the server did
