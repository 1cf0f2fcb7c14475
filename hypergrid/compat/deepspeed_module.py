"""DeepSpeed's ``PipelineModule`` on hypergrid's grid: the supported hook.

DeepSpeed's ``PipelineModule`` always builds DeepSpeed's own
``PipelineParallelGrid`` (a module-level name of ``deepspeed.runtime.pipe.module``),
and ``deepspeed.initialize`` refuses an ``mpu`` next to a ``PipelineModule``: it
takes ``model.mpu()``, the module's grid. ``hypergrid_grid()`` makes the modules
built inside it build hypergrid's ``PipelineParallelGrid`` instead (its groups
created through a ``HyperCommGrid``, guarded); ``pipeline_module`` builds one
module that way. The engine then runs on hypergrid's groups with no other change::

    from hypergrid.compat.deepspeed import pipeline_module

    model = pipeline_module(layers, topology=topology, loss_fn=loss_fn)  # or a PipelineModule subclass: cls=...
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)

DeepSpeed is imported on first use (not by ``hypergrid.compat.deepspeed``).
Replacing the name is process-wide while the block runs: build modules from
one thread at a time.
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Iterator
from typing import Any

from hypergrid.compat.deepspeed_pipe import PipelineParallelGrid
from hypergrid.errors import InvalidArgumentError

__all__ = ["hypergrid_grid", "pipeline_module"]

_MODULE = "deepspeed.runtime.pipe.module"


@contextlib.contextmanager
def hypergrid_grid() -> Iterator[None]:
    """Inside the block, DeepSpeed's ``PipelineModule`` (and its subclasses) build hypergrid's grid.

    Restores DeepSpeed's own class afterwards, also when the block raises.
    """
    module: Any = importlib.import_module(_MODULE)
    original = module.PipelineParallelGrid
    module.PipelineParallelGrid = PipelineParallelGrid
    try:
        yield
    finally:
        module.PipelineParallelGrid = original


def pipeline_module(*args: Any, cls: Any = None, **kwargs: Any) -> Any:
    """A DeepSpeed ``PipelineModule`` (or ``cls``, a subclass) whose grid, its ``mpu()``, is hypergrid's.

    Collective, as DeepSpeed's constructor is. Arguments go to the constructor.

    Raises:
        InvalidArgumentError: ``cls`` is not a subclass of DeepSpeed's ``PipelineModule``.
    """
    base = importlib.import_module(_MODULE).PipelineModule
    chosen = base if cls is None else cls
    if not (isinstance(chosen, type) and issubclass(chosen, base)):
        raise InvalidArgumentError(f"pipeline_module: cls={cls!r} must be a subclass of DeepSpeed's PipelineModule")
    with hypergrid_grid():
        return chosen(*args, **kwargs)
