"""Topology-aware layout planning: price each order of a grid's dims on a cluster's tiers.

Pure: no torch import (``Plan.to_grid`` imports the grid when called).

Examples:
    >>> from hypergrid.topology import Traffic, plan
    >>> plan({"tp": 8, "dp": 16}, [Traffic("dp", "all_reduce", 4e9)], "h100_8x")[0].order
    ('dp', 'tp')
"""

from hypergrid.cluster.spans import Span, family_spans
from hypergrid.cluster.tiers import PRESETS, Tier, Topology
from hypergrid.topology.cost import OPS, bus_factor, collective_seconds
from hypergrid.topology.planner import MAX_PLAN_DIMS, Plan, plan
from hypergrid.topology.traffic import Traffic, llm_step_traffic

__all__ = [
    "Tier",
    "Topology",
    "PRESETS",
    "Traffic",
    "llm_step_traffic",
    "plan",
    "Plan",
    "MAX_PLAN_DIMS",
    "OPS",
    "bus_factor",
    "collective_seconds",
    "Span",
    "family_spans",
]
