"""Store connections made ahead of need, so that recovery never opens one on its critical path.

A watcher needs two connections of its own to the job's store
(`hypergrid.agreement.watcher`), and a world re-formed by ``shrink`` needs a
new watcher at once. Opening a connection (``Store.clone()``) is usually a
millisecond, but torch's client looks up its own host name on every connect
(``getnameinfo``, for its log lines): where that lookup goes to a DNS server
that drops a packet, the connect takes the resolver's timeout, 5 s by default
(measured here: about 1 connect in 50 with 9 processes connecting at once, each
5.0 s, with ``The hostname of the client socket cannot be retrieved`` in torch's
log). Inside ``shrink`` that is a whole recovery's time, and long enough for
torch's group timeouts to give up on the slow rank.

So connections are made in the background, after a watcher starts, for the
next one (`prepare`), and `take` hands them out, opening only what is missing.
The price: each rank holds two more idle connections to the store than it uses.

Examples:
    >>> import torch.distributed as dist
    >>> store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    >>> prepare(store, 2); settle()
    >>> spare_count(store)
    2
    >>> len(take(store, 2)), spare_count(store) <= 2
    (2, True)
    >>> settle(); spare_count(store)
    2
    >>> discard(store); spare_count(store)
    0
"""

from __future__ import annotations

import atexit
import threading
from typing import Any

__all__ = ["discard", "prepare", "settle", "spare_count", "take"]

_lock = threading.Lock()
#: id(base store) -> (the store, its spare connections); the store is kept so that its id stays its own.
_spares: dict[int, tuple[Any, list[Any]]] = {}
_threads: list[threading.Thread] = []
_registered = {"atexit": False}


def prepare(base_store: Any, count: int) -> None:
    """Open connections to ``base_store`` in a background thread until ``count`` spares wait (no-op if they do)."""
    with _lock:
        held = len(_spares.get(id(base_store), (None, []))[1])
        _threads[:] = [thread for thread in _threads if thread.is_alive()]
        if held >= count or _threads:
            return
        thread = threading.Thread(target=_fill, args=(base_store, count), name="hypergrid-connections", daemon=True)
        _threads.append(thread)
        if not _registered["atexit"]:
            _registered["atexit"] = True
            atexit.register(settle, 10.0)
    thread.start()


def _fill(base_store: Any, count: int) -> None:
    while True:
        with _lock:
            entry = _spares.setdefault(id(base_store), (base_store, []))
            if len(entry[1]) >= count:
                return
        try:
            connection = base_store.clone()
        except (RuntimeError, AttributeError):  # the store is gone (the job ends) or cannot clone
            return
        with _lock:
            _spares.setdefault(id(base_store), (base_store, []))[1].append(connection)


def take(base_store: Any, count: int) -> list[Any]:
    """``count`` connections to ``base_store``: prepared ones first, the rest opened here; then refill.

    Raises what ``base_store.clone()`` raises (``RuntimeError``, or
    ``AttributeError`` for a store that cannot clone) when one must be opened
    here and cannot.
    """
    with _lock:
        held = _spares.get(id(base_store), (base_store, []))[1]
        taken = [held.pop() for _ in range(min(count, len(held)))]
    taken += [base_store.clone() for _ in range(count - len(taken))]
    prepare(base_store, count)
    return taken


def spare_count(base_store: Any) -> int:
    """How many prepared connections to ``base_store`` wait."""
    with _lock:
        return len(_spares.get(id(base_store), (None, []))[1])


def settle(timeout_s: float = 30.0) -> None:
    """Wait (at most ``timeout_s``) until no connection is being opened in the background.

    Registered at exit: a thread that returns from torch's connect while the
    interpreter finalizes can end the process with ``std::terminate``.
    """
    with _lock:
        threads = list(_threads)
    for thread in threads:
        thread.join(timeout_s)


def discard(base_store: Any) -> None:
    """Forget the prepared connections to ``base_store`` (its job or world ended)."""
    settle()
    with _lock:
        _spares.pop(id(base_store), None)
