"""The launch layer: start ranks (``spawn``, local processes) or join a launched job (``init_from_env``).

Imports only the base layer and torch; the grid needs only ``memberlog`` (its ``shrink`` records each world in
``hypergrid.run``'s log). ``stacks`` makes a hung rank say where it is. ``python -m hypergrid.run`` lives here too: its
command line (``launcher``, ``flags``), its agent (``agent``, ``health``, ``outcomes``), the round's membership log
(``memberlog``), the workers' error files (``errorfile``) and ``orphans`` (a worker ends with its parent).
docs/design/launcher.md.
"""

from hypergrid.launch.envstore import job_store
from hypergrid.launch.processes import WorkerDeath, default_device, init_from_env, spawn
from hypergrid.launch.stacks import STACK_DIR_ENV, enable_stack_dumps, read_stack_dumps

__all__ = [
    "WorkerDeath",
    "default_device",
    "init_from_env",
    "job_store",
    "spawn",
    "STACK_DIR_ENV",
    "enable_stack_dumps",
    "read_stack_dumps",
]
