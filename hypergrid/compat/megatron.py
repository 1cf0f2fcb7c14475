"""Megatron-Core on hypergrid: its layout vocabulary, its whole ``ProcessGroupCollection``, the state a model needs.

- Layout (``hypergrid.compat.megatron_layout``): ``grid_from_order``,
  ``RankGenerator``, ``megatron_tokens``, ``moe_grids``.
- The collection (``hypergrid.compat.megatron_collection``, planned by
  ``megatron_plan`` from the tables in ``megatron_fields``): ``process_groups``
  in one call from sizes or from a grid, ``grid_of``, ``destroy_process_groups``,
  ``process_group_families``; ``collection_class``, the stand-in
  ``ProcessGroupCollection`` and ``PG_FIELDS`` (``megatron_fields``).
- Model state (``hypergrid.compat.megatron_state``): ``setup_model_state``
  makes the global memory buffer and seeds the RNG tracker from the
  collection's ranks, what ``initialize_model_parallel`` does besides groups.

Replacing ``initialize_model_parallel``: docs/migrate/megatron.md.

Examples:
    >>> generator = RankGenerator(tp=2, ep=1, dp=2, pp=2, cp=1, order="tp-cp-ep-dp-pp")
    >>> generator.get_ranks("dp") == grid_from_order("tp-cp-dp-pp", tp=2, cp=1, dp=2, pp=2).get_rank_enum("dp")
    True
    >>> len(PG_FIELDS), PG_FIELDS[:3]
    (27, ('tp', 'pp', 'mp'))
"""

from __future__ import annotations

from hypergrid.compat.megatron_collection import destroy_process_groups, grid_of, process_groups
from hypergrid.compat.megatron_fields import PG_FIELDS, ProcessGroupCollection, collection_class
from hypergrid.compat.megatron_layout import RankGenerator, grid_from_order, megatron_tokens, moe_grids
from hypergrid.compat.megatron_plan import process_group_families
from hypergrid.compat.megatron_state import setup_model_state

__all__ = [
    "PG_FIELDS",
    "ProcessGroupCollection",
    "RankGenerator",
    "collection_class",
    "destroy_process_groups",
    "grid_from_order",
    "grid_of",
    "megatron_tokens",
    "moe_grids",
    "process_group_families",
    "process_groups",
    "setup_model_state",
]
