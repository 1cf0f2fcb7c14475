"""The grid layer: ``HyperCommGrid``, the registry, and the capabilities assembled on it.

``grid`` is the registry (construct, key, create, get, destroy); ``batch``
orders guarded creation; the facets add getters, views, node awareness,
DeviceMesh export, shims and shared communicators (``front``: the grid's delegations to them).
"""

from hypergrid.grid.bridge import Bridge
from hypergrid.grid.grid import HyperCommGrid, world_size_hint
from hypergrid.grid.regrid import Regrid
from hypergrid.grid.snapshots import StepSnapshots

__all__ = ["Bridge", "HyperCommGrid", "Regrid", "StepSnapshots", "world_size_hint"]
