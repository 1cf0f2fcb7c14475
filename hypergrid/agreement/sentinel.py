"""A launcher's agent calls a roll call the moment a worker dies: `announce_death` (issue 46).

Under ``python -m hypergrid.run`` the agent sees a worker exit through ``waitpid`` at once, where the others would
find it only through a failed operation (gloo: a closed connection; NCCL: nothing) or a probe after
``HYPERGRID_PROBE_S``. The agent writes the call of the workers' current world's next incident, declaring the dead
rank gone (`hypergrid.agreement.rollkeys.gone_text`), and wakes every watcher: the roll call completes as soon as
every other rank answered, and every survivor's grid waits end with ``RankFailure`` naming it, wherever they are
(a collective, a creation, a shrink forming its world). docs/launcher.md says which launch detects how.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch.distributed as dist

from hypergrid.agreement.liveness import FAILURE, Incident
from hypergrid.agreement.rollkeys import gone_text
from hypergrid.launch.memberlog import MemberLog, world_of
from hypergrid.values import format_ranks

__all__ = ["announce_death"]


def announce_death(store: Any, log_prefix: str, members: Sequence[str], size: int, said: str) -> bool:
    """Call a roll call in the workers' current world declaring ``members`` dead; whether it called one.

    Args:
        store: a connection to the agents' store (the workers' store is under its prefixes).
        log_prefix: the round's membership log (`hypergrid.launch.memberlog`): where the workers published their roll
            calls' prefix, and every world they formed, with who each rank is.
        members: the dead processes, as the log names them (``"3"``, ``"3.1"``: `hypergrid.launch.memberlog`).
        size: the job's first world's size (every world after it is in the log).
        said: how they died, for the verdict's text.

    The death is first an entry of the log (``dead``, where a member is in the current world): that is the verdict,
    which every later roll call of the world declares (the agents' follows: `hypergrid.agreement.nodewatch`), so a
    death before the workers published their prefix (no grid yet), or a call into an incident nobody looks at, is
    still known. Nothing is called (False) before that prefix, or where none of the members is in the current world
    (a shrink left them out already). Where a roll call is open already, the ranks are listed in its ``I/gone``
    instead: its closers close without waiting for them, and its verdict names them dead.

    Examples:
        >>> import torch.distributed as dist
        >>> raw = dist.HashStore()
        >>> announce_death(raw, "L/", ["3"], 4, "died by signal SIGKILL")  # no worker published its prefix yet
        False
        >>> raw.set("L/liveness", "P/")
        >>> announce_death(raw, "L/", ["3"], 4, "died by signal SIGKILL"), raw.get("P/hypergrid/live/0/0/call")
        (True, b'failure [gone 3] rank 3 died by signal SIGKILL (seen by its launcher)')
    """
    log = MemberLog(store, log_prefix)
    epoch, ranks = world_of(log.entries(), size)
    gone = sorted(rank for rank, member in enumerate(ranks) if member in set(members))
    if not gone:
        return False
    log.append("dead", members=[ranks[rank] for rank in gone], said=said, world=epoch)  # the verdict, first
    prefix = log.read_cell("liveness")
    if prefix is None:
        return False
    workers: Any = log.store if not prefix else dist.PrefixStore(prefix[:-1], log.store)  # type: ignore[attr-defined]
    text = gone_text(gone, f"rank{'s' if len(gone) > 1 else ''} {format_ranks(gone)} {said} (seen by its launcher)")
    incident = Incident.next_of(workers, epoch)
    if incident.call(FAILURE, text, range(len(ranks))) != f"{FAILURE} {text}":  # a roll call was open: join it
        workers.append(incident.key("gone"), "".join(f"{rank}\n" for rank in gone))  # (read by its closers)
    return True
