"""The launch layer: start ranks (``spawn``, local processes) or join a launched job (``init_from_env``).

Imports only the base layer and torch: the demo, the tests and user scripts
stand on it; the grid needs only ``ledger.record_shrink`` (its ``shrink``
reports to ``hypergrid.run``). ``stacks`` makes a hung rank say
where it is: ``spawn`` uses it on timeout, ``torchrun`` users through
``HYPERGRID_STACK_DIR`` or ``enable_stack_dumps``. ``python -m hypergrid.run``
lives here too: its command line (``launcher``, ``flags``), its agent
(``agent``, ``health``, ``outcomes``), the ledger through which the workers'
shrinks tell it which deaths were accounted for (``ledger``), and ``orphans``,
which ends a worker with its parent (``spawn``'s too).
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
