"""A world's store connections for threads other than the watcher's: `CallStore`, and `Within` under a prefix.

A store client serves one call at a time, and a thread blocked in it holds it: the main thread's (torch's default
store) may be blocked in a guard round or a barrier while another thread (a prober, the watcher's report, a timer
that ends a wait) must call the store. Each world keeps one `CallStore`, closed with the world.
"""

from __future__ import annotations

import threading
from typing import Any

import torch.distributed as dist

__all__ = ["CallStore", "Within"]


class CallStore:
    """The store a short call uses: the rank's own connection on the main thread, else one opened on first need.

    The main thread's connection (torch's default store) is free whenever the
    main thread itself calls; a thread that calls while the main thread may be
    blocked on it (a prober in a slow barrier) gets a connection of its own,
    opened once and kept until the world closes. The watcher's thread calls
    through its own connection (`lend`): the failure it reports opens none
    (torch: two threads of one process that open a client at once, one may
    wait 5 s; docs/design/rollcall.md, "Connections opened on the way").
    """

    def __init__(self, base: Any) -> None:
        self.base = base
        self._own: Any = None
        self._lent: tuple[threading.Thread, Any] | None = None
        self._closed = False
        self._lock = threading.Lock()

    def lend(self, thread: threading.Thread, connection: Any) -> None:
        """``thread`` calls through ``connection`` (one that no other thread uses while ``thread`` runs)."""
        self._lent = (thread, connection)

    def connection(self) -> Any:
        current = threading.current_thread()
        if current is threading.main_thread():
            return self.base
        lent = self._lent
        if lent is not None and lent[0] is current and not self._closed:
            return lent[1]
        with self._lock:
            if self._closed:  # (a thread still finishing, a prober say: it stops on a store error)
                raise RuntimeError("this world's store connections are closed")
            if self._own is None:
                self._own = self.base.clone()
            return self._own

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._own, self._lent = None, None  # torch closes the socket with the object

    def __getattr__(self, name: str) -> Any:
        return getattr(self.connection(), name)


class Within:
    """`CallStore`'s connections seen under a key prefix (the default group's store of a re-formed world).

    ``namespace`` None: the connections as they are.
    """

    def __init__(self, calls: CallStore, namespace: str | None) -> None:
        self.calls = calls
        self.namespace = namespace

    def __getattr__(self, name: str) -> Any:
        connection = self.calls.connection()
        store = connection if self.namespace is None else dist.PrefixStore(self.namespace, connection)  # type: ignore[attr-defined]
        return getattr(store, name)
