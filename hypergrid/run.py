"""``python -m hypergrid.run``: torchrun's flags, an agent that keeps the surviving workers running.

    python -m hypergrid.run --standalone --nproc-per-node 4 train.py

See ``hypergrid.launch.launcher`` and docs/launcher.md.
"""

import logging
import os
import sys

from hypergrid.agreement.nodewatch import NodeWatch
from hypergrid.agreement.sentinel import announce_death
from hypergrid.binding.cpplog import LEVEL_ENV, quiet_cpp_log
from hypergrid.launch.launcher import main

__all__ = ["main"]

if __name__ == "__main__":
    # torch's C++ warnings on a failed store connection print every C++ frame, once per connection, where the
    # agent and the workers report the failure in one line each: errors only, in the agent and (inherited) its
    # workers, unless the user set TORCH_CPP_LOG_LEVEL (docs/launcher.md).
    if quiet_cpp_log():
        os.environ[LEVEL_ENV] = "ERROR"
    # a worker's death: the survivors' roll call, at once; the node's agent answers it for its workers
    code = main(on_death=announce_death, node_watch=lambda *args: NodeWatch(*args[:3], report=args[3]))
    # Exit without the interpreter's teardown: an agent that gave up waiting (a barrier timeout, a
    # signal) may leave its watcher thread blocked in a store wait, and a connection that dies during
    # teardown makes that C++ call abort the process, losing the exit code.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
