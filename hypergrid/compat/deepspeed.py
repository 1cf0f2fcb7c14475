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

Where DeepSpeed answers an absent axis leniently (``get_dim(absent)`` is ``0``), so does this adapter, while
hypergrid's native API raises ``DimsError``; every difference from DeepSpeed (clearer errors, cheaper answers) is
listed in docs/migrate/deepspeed.md.

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
