"""What the workers of ``hypergrid.run`` tell their agent: the deaths a shrink accounted for, and a worker's exception.

A worker's death is *accounted for* when the survivors' ``shrink`` excluded it; the survivors write it down in a
*ledger* the agent names in the workers' environment (`LEDGER_ENV`), on the workers' raw store, which outlives
every worker (`record_shrink`; the agent reads it with `read_shrunk`). A worker that raised says what in
torchelastic's error file (`record_uncaught_exceptions`). The keys and who writes them: docs/design/launcher.md
("The ledger").
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
import uuid
from collections.abc import Callable, Iterable, Mapping
from types import TracebackType
from typing import Any

__all__ = [
    "LEDGER_ENV",
    "agree_ledger",
    "current_world",
    "parse_ranks",
    "publish_liveness",
    "raised",
    "read_shrunk",
    "record_shrink",
    "record_uncaught_exceptions",
]

#: The environment variable that names the ledger's key prefix (set by the agent for its workers).
LEDGER_ENV = "HYPERGRID_RUN_LEDGER"
_ERROR_FILE_ENV = "TORCHELASTIC_ERROR_FILE"


def raw_store(store: Any) -> Any:
    """The store under every ``PrefixStore`` around ``store`` (the agents' TCPStore, for a worker's or agent's store).

    Examples:
        >>> import torch.distributed as dist
        >>> base = dist.HashStore()
        >>> raw_store(dist.PrefixStore("a", dist.PrefixStore("b", base))) is base
        True
    """
    while hasattr(store, "underlying_store"):
        store = store.underlying_store
    return store


def agree_ledger(store: Any, restart: int) -> str:
    """The ledger's key prefix for one round of the job, the same for every agent (the first to ask picks it).

    Args:
        store: the agent's store for the round (torchelastic's ``worker_group.store``).
        restart: how many restarts the job has made (a static rendezvous keeps one store prefix).

    Examples:
        >>> import torch.distributed as dist
        >>> store = dist.HashStore()
        >>> first, second = agree_ledger(store, 0), agree_ledger(store, 0)
        >>> first == second and first.startswith("hypergrid/run/ledger/") and agree_ledger(store, 1) != first
        True
    """
    token = store.compare_set(f"hypergrid/run/{restart}/ledger", "", uuid.uuid4().hex)
    return f"hypergrid/run/ledger/{token.decode() if isinstance(token, bytes) else token}/"


def _world_table(store: Any, ledger: str, epoch: int) -> Callable[[int], int | None] | None:
    """World ``epoch``'s rank -> the launcher's rank (None: a rank it does not know); None when the table is missing."""
    if epoch == 0:
        return lambda rank: rank
    key = f"{ledger}world/{epoch}"
    if not store.check([key]):
        return None
    text = store.get(key).decode()
    table = [int(rank) for rank in text.split(",")] if text else []
    return lambda rank: table[rank] if 0 <= rank < len(table) else None


def record_shrink(
    old_epoch: int,
    new_epoch: int,
    new_rank: int | None,
    old_to_new: Mapping[int, int],
    dead: Iterable[int],
    store: Any = None,
    joined: Mapping[int, int | None] | None = None,
) -> bool:
    """After a shrink, on the new world's rank 0 under ``hypergrid.run``: note whom it excluded; whether it wrote.

    Does nothing (False) outside ``hypergrid.run`` (no ``HYPERGRID_RUN_LEDGER``), on any
    other rank, or when the old world's table is missing (its rank 0 died before writing it).

    Args:
        old_epoch: the world the shrink started from.
        new_epoch: the world it formed.
        new_rank: this process's rank there (None: retired).
        old_to_new: old rank -> new rank, for every rank of the new world.
        dead: the old world's ranks the shrink excluded.
        store: where to write (default: torch's default store, whose raw store the agents host).
        joined: the processes that arrived and were taken in (old ranks from the old world's size, see
            `hypergrid.layout.grow.plan_regrow`) -> their launcher rank (None: not started by the launcher).

    Examples:
        >>> import os, torch.distributed as dist
        >>> store, os.environ["HYPERGRID_RUN_LEDGER"] = dist.HashStore(), "L/"
        >>> record_shrink(0, 1, 0, {0: 0, 1: 1, 2: 2}, [3], store)  # world 0: ranks are the launcher's
        True
        >>> record_shrink(1, 2, 0, {0: 0, 2: 1}, [1], store)  # world 1's rank 1 is the launcher's rank 1
        True
        >>> parse_ranks(read_shrunk(store, "L/")), store.get("L/world/2")
        ({1, 3}, b'0,2')
        >>> del os.environ["HYPERGRID_RUN_LEDGER"]
    """
    ledger = os.environ.get(LEDGER_ENV, "")
    if not ledger or new_rank != 0:
        return False
    try:
        return _record(ledger, old_epoch, new_epoch, old_to_new, dead, store, joined or {})
    except Exception:  # never fail a shrink over its report: the agent counts the deaths as unaccounted
        return False


def _record(
    ledger: str,
    old_epoch: int,
    new_epoch: int,
    old_to_new: Mapping[int, int],
    dead: Iterable[int],
    store: Any,
    joined: Mapping[int, int | None],
) -> bool:
    if store is None:
        from torch.distributed import distributed_c10d as c10d

        store = c10d._get_default_store()
    store = raw_store(store)
    launcher_rank = _world_table(store, ledger, old_epoch)
    if launcher_rank is None:
        return False
    gone = [launcher_rank(rank) for rank in dead]
    listed = "".join(f"{rank}," for rank in gone if rank is not None)
    if listed:
        store.append(f"{ledger}shrunk", listed)
    by_new = {new: joined[old] if old in joined else launcher_rank(old) for old, new in old_to_new.items()}
    known = [by_new.get(new) for new in range(len(by_new))]
    if all(rank is not None for rank in known):
        store.set(f"{ledger}world/{new_epoch}", ",".join(str(rank) for rank in known))
    return True


def read_shrunk(store: Any, ledger: str) -> str:
    """The launcher's ranks that shrinks excluded, as the ledger lists them (``"3,5,"``; ``""``: none).

    Examples:
        >>> import torch.distributed as dist
        >>> read_shrunk(dist.HashStore(), "L/")
        ''
    """
    key = f"{ledger}shrunk"
    store = raw_store(store)
    return store.get(key).decode() if store.check([key]) else ""


def publish_liveness(base_store: Any) -> bool:
    """On the job's first world's rank 0 under ``hypergrid.run``: tell the agents where its roll calls' keys live.

    The workers' store is the agents' under torch's prefixes (``default_pg/0//`` under ``env://``); the agents write
    a call into a roll call when a worker dies (`hypergrid.agreement.sentinel`), so they need that prefix: found
    once by a probe key and a listing, then kept in the ledger (``liveness``). Whether it wrote (False outside the
    launcher, or where the store cannot list its keys).

    Examples:
        >>> import os, torch.distributed as dist
        >>> raw = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
        >>> os.environ["HYPERGRID_RUN_LEDGER"] = "L/"
        >>> publish_liveness(dist.PrefixStore("default_pg/0/", raw)), raw.get("L/liveness")
        (True, b'default_pg/0//')
        >>> del os.environ["HYPERGRID_RUN_LEDGER"]
    """
    ledger = os.environ.get(LEDGER_ENV, "")
    if not ledger:
        return False
    probe = f"hypergrid/probe/{uuid.uuid4().hex}"
    try:
        raw = raw_store(base_store)
        if raw.check([f"{ledger}liveness"]):
            return True  # (published by this job's first join: a world reopened finds it)
        base_store.set(probe, "")
        found = [key for key in raw.list_keys() if key.endswith(probe)]
        base_store.delete_key(probe)
        if len(found) != 1:
            return False
        raw.set(f"{ledger}liveness", found[0][: -len(probe)])
    except (RuntimeError, AttributeError, NotImplementedError):  # a store without a listing: the agents stay blind
        return False
    return True


def current_world(store: Any, ledger: str) -> tuple[str, int, list[int] | None] | None:
    """For an agent: the workers' roll-call prefix, their current world's number and its rank -> launcher rank table
    (None for the job's first world, whose ranks are the launcher's); None before a worker published the prefix."""
    raw = raw_store(store)
    if not raw.check([f"{ledger}liveness"]):
        return None
    prefix, epoch = raw.get(f"{ledger}liveness").decode(), 0
    while raw.check([f"{ledger}world/{epoch + 1}"]):
        epoch += 1
    if epoch == 0:
        return prefix, 0, None
    text = raw.get(f"{ledger}world/{epoch}").decode()
    return prefix, epoch, [int(rank) for rank in text.split(",")] if text else []


def parse_ranks(listed: str) -> set[int]:
    """The ranks of a ledger's list (``"3,5,"`` -> ``{3, 5}``); what is not a rank is ignored.

    Examples:
        >>> parse_ranks("3,5,"), parse_ranks("")
        ({3, 5}, set())
    """
    return {int(item) for item in listed.split(",") if item.strip().isdigit()}


def record_uncaught_exceptions() -> bool:
    """Make an uncaught exception write torchelastic's error file, as ``@record`` would; whether one is set up.

    Only under a torchelastic launcher (``TORCHELASTIC_ERROR_FILE`` set); the previous ``sys.excepthook`` still runs
    (the traceback is printed as before). An error file already written (by ``@record``) is kept. Calling it again
    changes nothing.

    Examples:
        >>> import os
        >>> record_uncaught_exceptions() == ("TORCHELASTIC_ERROR_FILE" in os.environ)
        True
    """
    path = os.environ.get(_ERROR_FILE_ENV, "")
    if not path:
        return False
    if getattr(sys.excepthook, "hypergrid_error_file", None) == path:
        return True
    previous = sys.excepthook

    def hook(kind: type[BaseException], error: BaseException, trace: TracebackType | None) -> None:
        if not os.path.exists(path):
            _write_error_file(path, kind, error, trace)
        previous(kind, error, trace)

    hook.hypergrid_error_file = path  # type: ignore[attr-defined]
    sys.excepthook = hook
    return True


def _write_error_file(path: str, kind: type[BaseException], error: BaseException, trace: TracebackType | None) -> None:
    message = {
        "message": f"{kind.__name__}: {error}",
        "extraInfo": {
            "py_callstack": "".join(traceback.format_exception(kind, error, trace)),
            "timestamp": str(int(time.time())),
        },
    }
    try:
        with open(path, "w") as out:
            json.dump({"message": message}, out)
    except OSError:  # the report is a courtesy; the exit code says the rest
        pass


def raised(error_file: str) -> str | None:
    """The first line of what a worker raised, from its error file (None: no file, or not one of torch's).

    Examples:
        >>> raised("/nonexistent") is None
        True
    """
    try:
        with open(error_file) as source:
            data = json.load(source)
    except (OSError, ValueError):
        return None
    message = data.get("message") if isinstance(data, dict) else None
    if isinstance(message, dict):
        message = message.get("message")
    if not isinstance(message, str) or not message.strip():
        return None
    return message.strip().splitlines()[0]
