"""The loop layer: ``ElasticLoop``, the training loop the library owns (set-up, steps, every death absorbed).

It stands on the grid's low-level API (``shrink``, ``standby``, ``arrive``, ``StepSnapshots``): docs/elastic.md.
"""

from hypergrid.loop.elastic_loop import ElasticLoop
from hypergrid.loop.result import LoopResult, WorldChange

__all__ = ["ElasticLoop", "LoopResult", "WorldChange"]
