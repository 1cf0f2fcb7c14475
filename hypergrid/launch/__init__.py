"""The launch layer: start ranks (``spawn``, local processes) or join a launched job (``init_from_env``).

Imports only the base layer and torch: the demo, the tests and user scripts
stand on it; the grid does not need it. ``stacks`` makes a hung rank say
where it is: ``spawn`` uses it on timeout, ``torchrun`` users through
``HYPERGRID_STACK_DIR`` or ``enable_stack_dumps``.
"""

from hypergrid.launch.processes import WorkerDeath, default_device, init_from_env, spawn
from hypergrid.launch.stacks import STACK_DIR_ENV, enable_stack_dumps, read_stack_dumps

__all__ = [
    "WorkerDeath",
    "default_device",
    "init_from_env",
    "spawn",
    "STACK_DIR_ENV",
    "enable_stack_dumps",
    "read_stack_dumps",
]
