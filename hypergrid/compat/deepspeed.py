"""DeepSpeed's topology module as a drop-in: change the import, keep the code.

``from hypergrid.compat.deepspeed import ProcessTopology, PipelineParallelGrid``
replaces ``from deepspeed.runtime.pipe.topology import ...``. The topologies are
computed by hypergrid's layout (``get_coord`` and ``filter_match`` no longer scan
every rank) and ``PipelineParallelGrid`` creates its groups through a
``HyperCommGrid`` (``grid.grid``). DeepSpeed's ``PipelineModule`` builds its own
grid class: ``pipeline_module(...)`` (or a ``with hypergrid_grid():`` block) makes
it build hypergrid's, which ``deepspeed.initialize`` then uses as the mpu
(``hypergrid.compat.deepspeed_module``). ``PipelineParallelGrid`` has every public
method of DeepSpeed 0.19's, including the Megatron names DeepSpeed's checkpoint
writer calls (``get_pipeline_model_parallel_rank`` / ``_world_size``,
``get_data_parallel_group_ranks``).

Compatibility beats strictness in this adapter only: where DeepSpeed answers an
absent axis leniently, so does this module, while hypergrid's native API
(``HyperCommGrid``, ``GridLayout``) raises ``DimsError``. Same as DeepSpeed:

- ``get_dim(absent)`` is ``0``; ``get_axis_comm_lists(absent)`` is ``[]``;
  ``filter_match`` / ``get_axis_list`` with a value outside its axis give ``[]``;
  ``get_rank_repr`` ignores omitted axes the topology lacks.
- ``PipelineParallelGrid`` treats absent ``pipe`` / ``data`` / ``model`` axes as
  size 1 (coordinate 0), with ``max(get_dim(axis), 1)``; it ignores
  ``process_group``; ``is_first_stage`` / ``is_last_stage`` are attributes.

Differences from DeepSpeed, each a clearer failure or a cheaper answer:

- Errors are hypergrid's classes, each also the builtin DeepSpeed raises where it
  raises one: an unknown rank in ``get_coord``, a missing axis in ``get_rank``
  and ``_prime_factors(0)`` raise ``ValueError`` subclasses; an out-of-range
  coordinate in ``get_rank`` raises ``RankError`` (DeepSpeed: a failed assert);
  ``filter_match(unknown_axis=...)`` raises ``DimsError`` (DeepSpeed:
  ``AttributeError``); a topology whose size is not the world's raises
  ``WorldSizeError`` (DeepSpeed: ``AssertionError("Invalid Grid")``).
- ``ProcessTopology`` validates its sizes and names at construction (DeepSpeed
  accepts a size of 0 and fails later).
- ``str(topology)`` is ``ProcessTopology(axes=..., dims=...)``, not the whole
  mapping; ``topology.mapping`` is built on access instead of held.
- ``PipelineParallelGrid`` prints nothing, absent axes never break it (DeepSpeed
  fails without ``pipe`` or ``data``), ``get_slice_parallel_world_size`` returns
  its value on every version, and the ``get_tensor_model_parallel_*`` names are
  aliases of the slice getters.
- The model group (every axis but ``data``), the ``data``, ``pipe`` and ``model``
  families are created once each, by ``HyperCommGrid.create_pg``, with the
  grid's creation guard: a rank that builds another topology raises
  ``DesyncError`` instead of hanging.

Examples:
    >>> topo = PipeModelDataParallelTopology(num_pp=2, num_mp=2, num_dp=2)
    >>> topo.get_axis_comm_lists("data"), topo.get_axis_comm_lists("tensor")
    ([[0, 2], [1, 3], [4, 6], [5, 7]], [])
    >>> _prime_factors(30)
    [2, 3, 5]
"""

from __future__ import annotations

from hypergrid.compat.deepspeed_module import hypergrid_grid, pipeline_module
from hypergrid.compat.deepspeed_pipe import PipelineParallelGrid
from hypergrid.compat.deepspeed_topology import (
    PipeDataParallelTopology,
    PipeModelDataParallelTopology,
    ProcessTopology,
    _prime_factors,
)

__all__ = [
    "PipeDataParallelTopology",
    "PipeModelDataParallelTopology",
    "PipelineParallelGrid",
    "ProcessTopology",
    "_prime_factors",
    "hypergrid_grid",
    "pipeline_module",
]
