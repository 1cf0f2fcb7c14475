"""The job's ``env://`` store: the one a rank forms its first world on (`env_store`), and a client of it for a
process that arrives later (`job_store`), under the same prefixes."""

from __future__ import annotations

import datetime
import os
from typing import Any

from torch.distributed import PrefixStore, TCPStore  # type: ignore[attr-defined]  # public, not re-exported in stubs
from torch.distributed.rendezvous import rendezvous

from hypergrid.errors import InvalidArgumentError, public
from hypergrid.values import check_timeout

__all__ = ["env_store", "job_store"]


@public
def job_store(timeout_s: float = 600.0) -> Any:
    """The running job's store as its ranks' default group holds it, for a process that arrives later.

    From the environment ``hypergrid.run`` and torchrun give a worker (``env://``: ``MASTER_ADDR``, ``MASTER_PORT``,
    ``TORCHELASTIC_RESTART_COUNT``): a client of the job's TCPStore (never its host), under the prefixes torch and
    `init_from_env` put the job's first default group's keys (``default_pg`` or its restart's, then the group's
    name ``0/``). ``HyperCommGrid.arrive`` uses it by default.

    Raises:
        InvalidArgumentError: ``MASTER_ADDR`` or ``MASTER_PORT`` is not set (or not a port), or a bad ``timeout_s``.
    """
    timeout = datetime.timedelta(seconds=check_timeout(timeout_s, "timeout_s"))
    host, port = os.environ.get("MASTER_ADDR", ""), os.environ.get("MASTER_PORT", "")
    if not host or not port.isdigit():
        raise InvalidArgumentError(
            f"job_store: MASTER_ADDR={host!r} and MASTER_PORT={port!r}; expected the job's store address (a host "
            "and a port), as hypergrid.run and torchrun set them"
        )
    client = TCPStore(host, int(port), is_master=False, timeout=timeout)
    return PrefixStore("0/", PrefixStore(_default_prefix(), client))


def env_store(timeout: datetime.timedelta) -> tuple[Any, int, int]:
    """torch's ``env://`` store, rank and world size; the default group's prefix, one per torchelastic restart."""
    store, rank, world_size = next(rendezvous("env://", timeout=timeout))
    store.set_timeout(timeout)
    return PrefixStore(_default_prefix(), store), rank, world_size


def _default_prefix() -> str:
    """The first default group's store prefix: torch's own (``default_pg``), then one per torchelastic restart."""
    restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or "0"
    return "default_pg" if restart == "0" else f"default_pg/restart{restart}"
