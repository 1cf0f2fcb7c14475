"""hypergrid: named N-dimensional grids of ranks and their process groups.

The public surface:

- ``GridLayout`` — the pure layout core (numpy/einops, no torch).
- ``HyperCommGrid`` — Megatron-Core's API over torch.distributed, with
  groups created lazily, keyed by canonical order.
- ``Bridge`` — activations and gradients between two grids of different shapes.
- ``StepSnapshots`` — the training state of the last steps, for ``shrink`` to resume from an agreed one.
- ``ElasticLoop`` — the training loop the library owns: set-up and a step; a death anywhere is absorbed.
- ``spawn`` — a local multi-process launcher with a hard timeout.
- the exceptions in ``hypergrid.errors``.

Examples:
    >>> import hypergrid
    >>> grid = hypergrid.HyperCommGrid([2, 2, 2], ["tp", "cp", "dp"])
    >>> grid.get_rank_enum("cp-dp")
    [[0, 2, 4, 6], [1, 3, 5, 7]]
"""

import importlib
from typing import TYPE_CHECKING, Any

from hypergrid import errors
from hypergrid.errors import *  # noqa: F403 - the exceptions are public, listed in errors.__all__
from hypergrid.layout import GridLayout

if TYPE_CHECKING:
    from hypergrid.grid import Bridge, HyperCommGrid, Regrid, StepSnapshots
    from hypergrid.launch import WorkerDeath, init_from_env, spawn
    from hypergrid.loop import ElasticLoop, LoopResult

# The torch binding is imported on first use, so that the pure layout core
# (``import hypergrid.layout``) works where torch is not installed.
_LAZY = {
    "Bridge": "hypergrid.grid",
    "HyperCommGrid": "hypergrid.grid",
    "Regrid": "hypergrid.grid",
    "StepSnapshots": "hypergrid.grid",
    "ElasticLoop": "hypergrid.loop",
    "LoopResult": "hypergrid.loop",
    "spawn": "hypergrid.launch",
    "init_from_env": "hypergrid.launch",
    "WorkerDeath": "hypergrid.launch",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'hypergrid' has no attribute {name!r}")


__version__ = "0.4.0"

__all__ = [
    "Bridge",
    "GridLayout",
    "HyperCommGrid",
    "Regrid",
    "StepSnapshots",
    "ElasticLoop",
    "LoopResult",
    "spawn",
    "init_from_env",
    "WorkerDeath",
    "__version__",
]
__all__ += errors.__all__
