"""Who answers the roll call for a node's workers under ``hypergrid.run``: `NodeAnswerer`, held by the agent.

By default the agent answers for all of its workers (``hypergrid.agreement.nodewatch.NodeWatch``, passed in by
``hypergrid.run``: this layer does not import the roll call); ``--worker-watchers`` leaves each worker to answer for
itself, as under torchrun. Each round gets a new directory, named in the workers' environment (`NODE_WATCH_ENV`),
where the workers' FIFOs live (``hypergrid.agreement.relay``). docs/launcher.md ("Deaths known at once").
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from typing import Any

from hypergrid.values import described

__all__ = ["NODE_WATCH_ENV", "NodeAnswerer", "NodeWatchFactory"]

#: The environment variable that names the directory of the agent that answers the roll call for its workers.
NODE_WATCH_ENV = "HYPERGRID_NODE_WATCH"

#: What makes a round's answerer: ``(connect, log, directory, report)`` -> an object with ``start()`` and
#: ``stop()`` (``hypergrid.agreement.nodewatch.NodeWatch``).
NodeWatchFactory = Callable[[Callable[[], Any], str, str, Callable[[str], None]], Any]


class NodeAnswerer:
    """The agent's answerer for its workers, one round at a time.

    Args:
        factory: makes a round's answerer (None: the workers answer for themselves, and nothing is named).
        report: where a line goes when a round's answerer cannot start (the launcher's stderr).

    Examples:
        >>> answerer = NodeAnswerer(None, print)
        >>> answerer.begin(lambda: None, "L/"), NODE_WATCH_ENV in os.environ
        (False, False)
    """

    def __init__(self, factory: NodeWatchFactory | None, report: Callable[[str], None]) -> None:
        self.factory = factory
        self.report = report
        self.watch: Any = None  # this round's
        self.answered = 0  # roll calls the agent answered for its workers, every round's (`NodeWatch.answered`)

    def begin(self, connect: Callable[[], Any], log: str) -> bool:
        """A round starts (before its workers): end the last one's, start this one's and name its directory in
        the environment the workers inherit; whether it answers for them (False: none, or it could not start)."""
        self.end()
        if self.factory is None:
            return False
        directory = tempfile.mkdtemp(prefix="hypergrid-node-")
        try:
            self.watch = self.factory(connect, log, directory, self.report)
            self.watch.start()
        except Exception as error:  # the workers answer for themselves
            self.report(f"the agent cannot answer for its workers ({described(error)}); each answers")
            self.watch = None
            shutil.rmtree(directory, ignore_errors=True)
            return False
        os.environ[NODE_WATCH_ENV] = directory
        return True

    def end(self) -> None:
        """The round ended (or the agent stops): its answerer stops, its directory goes."""
        os.environ.pop(NODE_WATCH_ENV, None)
        if self.watch is not None:
            self.watch.stop()
            self.answered += int(getattr(self.watch, "answered", 0))
            self.watch = None

    def said(self) -> str:
        """What the launcher's summary says of it: how many roll calls the agent answered ("" where it answers
        none: each worker answers for itself).

        Examples:
            >>> NodeAnswerer(None, print).said(), NodeAnswerer(lambda *args: None, print).said()
            ('', '; roll calls the agent answered for its workers: 0')
        """
        return "" if self.factory is None else f"; roll calls the agent answered for its workers: {self.answered}"
