"""A store whose waits another thread can end: torch's formation of a world, which no other wait of ours reaches.

``init_process_group`` waits inside torch for every member's rendezvous keys (gloo: each rank's address), bounded
only by its timeout: a member that dies there holds the others until then (at ``shrink``'s default, 5 s a slice on
gloo; 30 s at 0.3.0). `InterruptibleStore` is the store torch forms the world on: its waits are the inner store's
own (no polling, no timed slice), and `InterruptibleStore.interrupt` ends them from another thread (a roll call's
verdict, heard by the shrink's vigil): it reads each awaited key through a second connection, which wakes torch's
waiters of that key, and the wait raises. Once the world is formed, `InterruptibleStore.disarm` makes it a plain
pass-through (torch keeps it as the world's store).

Group creation waits the same way, on the default group's store (gloo: each member's address, under the group's
prefix): `interruptible_default_store` makes torch's default store an `InterruptibleStore` for the time of a creation,
so that the world's failure ends a creation a dead member holds (issue 53, "churn").
"""

from __future__ import annotations

import contextlib
import datetime
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

__all__ = ["Formation", "InterruptibleStore", "interruptible_default_store"]

#: torch's answer to a `compare_set` on an absent key whose expected value is not empty (the key stays absent).
_ABSENT = "\x00hypergrid-absent"


class InterruptibleStore(dist.Store):  # type: ignore[misc,name-defined]  # torch's Store (a pybind class) is untyped
    """``inner`` for torch, with waits that `interrupt` ends; ``waker``: a connection other than ``inner``'s with
    the same key space (the interrupting thread's own).

    Examples:
        >>> import datetime, threading, torch.distributed as dist
        >>> inner = dist.HashStore()
        >>> store = InterruptibleStore(inner, inner)
        >>> store.set("a", "1"); store.get("a")
        b'1'
        >>> timer = threading.Timer(0.2, store.interrupt, (RuntimeError("rank 3 died while forming world 1"),))
        >>> timer.start(); store.wait(["never"], datetime.timedelta(seconds=1))
        Traceback (most recent call last):
        ...
        RuntimeError: rank 3 died while forming world 1
    """

    def __init__(self, inner: Any, waker: Any) -> None:
        super().__init__()
        self.inner = inner
        self.waker = waker
        self._timeout: datetime.timedelta = inner.timeout
        self._error: BaseException | None = None
        self._armed = True
        self._waiting: set[str] = set()
        self._lock = threading.Lock()

    def interrupt(self, error: BaseException) -> None:
        """End every wait of the store now and later with ``error`` (once; nothing once disarmed)."""
        with self._lock:
            if not self._armed or self._error is not None:
                return
            self._error = error
            waiting = sorted(self._waiting)
        for key in waiting:  # a read of an absent key wakes its waiters (they find it absent, and raise)
            with contextlib.suppress(RuntimeError):
                self.waker.compare_set(key, _ABSENT, _ABSENT)

    def disarm(self) -> None:
        """The world is formed: waits are the inner store's from now on."""
        with self._lock:
            self._armed = False

    def _raise(self) -> None:
        if self._error is not None and self._armed:
            raise self._error

    def wait(self, keys: Sequence[str], timeout: datetime.timedelta | None = None) -> None:
        keys = list(keys)
        timeout = timeout or self._timeout
        deadline = time.monotonic() + timeout.total_seconds()
        with self._lock:
            self._waiting.update(keys)
        try:
            while True:
                self._raise()
                left = deadline - time.monotonic()
                if left <= 0:
                    raise dist.DistStoreError(f"timed out after {timeout} waiting for {keys}")
                try:
                    self.inner.wait(keys, datetime.timedelta(seconds=left))
                except dist.DistStoreError:  # (a store whose waits an absent key's read does not wake: at the timeout)
                    self._raise()
                    raise
                self._raise()
                if self.inner.check(keys):
                    return
        finally:
            with self._lock:
                self._waiting.difference_update(keys)

    def get(self, key: str) -> bytes:
        self.wait([key])
        return bytes(self.inner.get(key))

    def set(self, key: str, value: str | bytes) -> None:
        self.inner.set(key, value)

    def add(self, key: str, value: int) -> int:
        return int(self.inner.add(key, value))

    def append(self, key: str, value: str | bytes) -> None:
        self.inner.append(key, value)

    def check(self, keys: Sequence[str]) -> bool:
        return bool(self.inner.check(list(keys)))

    def compare_set(self, key: str, expected: str | bytes, desired: str | bytes) -> bytes:
        return bytes(self.inner.compare_set(key, expected, desired))

    def delete_key(self, key: str) -> bool:
        return bool(self.inner.delete_key(key))

    def num_keys(self) -> int:
        return int(self.inner.num_keys())

    def clone(self) -> Any:
        """Another connection to the same keys: the inner store's clone (its waits are plain)."""
        return self.inner.clone()

    def set_timeout(self, timeout: datetime.timedelta) -> None:
        self._timeout = timeout
        self.inner.set_timeout(timeout)


class Formation:
    """One attempt at forming a world: the `InterruptibleStore` torch forms it on (`on`), once it was asked for.

    ``waker``: where `interrupt` reads the awaited keys, from the interrupting thread (the same key space).
    """

    def __init__(self, waker: Any) -> None:
        self.waker = waker
        self.store: InterruptibleStore | None = None

    def on(self, store: Any) -> InterruptibleStore:
        """The store to form the world on: ``store``, with waits that `interrupt` ends."""
        self.store = InterruptibleStore(store, self.waker)
        return self.store

    def interrupt(self, error: BaseException) -> None:
        """End torch's waits of this formation with ``error`` (nothing before `on` or after `disarm`)."""
        if self.store is not None:
            self.store.interrupt(error)

    def disarm(self) -> None:
        """The world is formed (or formed in place, without a store)."""
        if self.store is not None:
            self.store.disarm()


@contextlib.contextmanager
def interruptible_default_store(waker: Any) -> Iterator[InterruptibleStore | None]:
    """While inside, torch's default group's store (``_get_default_store()``, where every new group's keys go) is an
    armed `InterruptibleStore`, interrupted through ``waker`` (the same key space, another connection); yields it,
    or None where torch has no default group.

    torch's own store is back in place afterwards: the groups made inside keep the wrapper under their prefixes,
    disarmed (a plain pass-through, as after a shrink's formation); every other use of the default store stays
    torch's (no Python in its path).

    Examples:
        >>> import torch.distributed as dist
        >>> dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        >>> with interruptible_default_store(dist.HashStore()) as store:
        ...     group = dist.new_group([0])
        >>> type(store).__name__, store._armed, dist.distributed_c10d._get_default_store() is store
        ('InterruptibleStore', False, False)
        >>> dist.destroy_process_group()
    """
    default = dist.group.WORLD
    entry = c10d._world.pg_map.get(default) if default is not None else None
    if entry is None:
        yield None
        return
    backend, store = entry
    # A store of its own: a shrink's world keeps its formation's store, whose late interrupt (a verdict on the
    # attempt) must not reach this creation.
    wrapper = InterruptibleStore(store, waker)
    c10d._world.pg_map[default] = (backend, wrapper)  # type: ignore[index]  # (not None: found above)
    try:
        yield wrapper
    finally:
        wrapper.disarm()
        c10d._world.pg_map[default] = (backend, store)  # type: ignore[index]
