"""DeepSpeed's ``PipelineModule`` on hypergrid's grid: the supported hook.

DeepSpeed's ``PipelineModule`` always builds DeepSpeed's own ``PipelineParallelGrid`` (a module-level name of
``deepspeed.runtime.pipe.module``), which ``deepspeed.initialize`` takes as the mpu. ``hypergrid_grid()`` makes
the modules built inside it build hypergrid's ``PipelineParallelGrid`` instead; ``pipeline_module`` builds one
module that way (docs/migrate/deepspeed.md has the two lines to write). DeepSpeed is imported on first use (not by
``hypergrid.compat.deepspeed``). Replacing the name is process-wide while the block runs: build modules from one
thread at a time.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from hypergrid.compat.deepspeed_pipe import PipelineParallelGrid
from hypergrid.compat.dependency import import_or_refuse
from hypergrid.validation import check_instance, public, refuse

__all__ = ["hypergrid_grid", "pipeline_module"]

_MODULE = "deepspeed.runtime.pipe.module"


@contextlib.contextmanager
def hypergrid_grid() -> Iterator[None]:
    """Inside the block, DeepSpeed's ``PipelineModule`` (and its subclasses) build hypergrid's grid.

    Restores DeepSpeed's own class afterwards, also when the block raises.
    """
    module = _deepspeed("hypergrid_grid")
    original = module.PipelineParallelGrid
    module.PipelineParallelGrid = PipelineParallelGrid
    try:
        yield
    finally:
        module.PipelineParallelGrid = original


def _deepspeed(call: str) -> Any:
    """DeepSpeed's pipeline module, or ``DependencyError`` naming ``call`` when DeepSpeed does not import."""
    return import_or_refuse(_MODULE, call, "DeepSpeed", "pip install deepspeed")


@public
def pipeline_module(*args: Any, cls: Any = None, **kwargs: Any) -> Any:
    """A DeepSpeed ``PipelineModule`` (or ``cls``, a subclass) whose grid, its ``mpu()``, is hypergrid's.

    Collective, as DeepSpeed's constructor is. Arguments go to the constructor.

    Raises:
        InvalidArgumentError: ``cls`` is not a subclass of DeepSpeed's ``PipelineModule``.
        DependencyError: (an ``ImportError``) DeepSpeed does not import.
    """
    expected = "a subclass of DeepSpeed's PipelineModule"
    check_instance("", "cls", cls, type, expected, optional=True)
    base = _deepspeed("pipeline_module").PipelineModule
    chosen = base if cls is None else cls
    if not issubclass(chosen, base):
        raise refuse("", "cls", cls, expected)
    with hypergrid_grid():
        return chosen(*args, **kwargs)
