"""The launch layer: start ranks (``spawn``, local processes) or join a launched job (``init_from_env``).

Imports only the base layer and torch: the demo, the tests and user scripts
stand on it; the grid does not need it.
"""

from hypergrid.launch.processes import WorkerDeath, default_device, init_from_env, spawn

__all__ = ["WorkerDeath", "default_device", "init_from_env", "spawn"]
