"""The TCP connections torch opens for a process group, and how to sever them: gloo's missing abort.

gloo cannot cancel a collective in flight; severing the group's connections (``shutdown`` of each connected
socket) ends every pending operation at once, on both sides. `opened` finds the connections a group creation
opened, `track` remembers them with their group and `sever` shuts them down. Why, and where nothing is found:
docs/design/recovery.md ("Severing gloo's connections").
"""

from __future__ import annotations

import contextlib
import os
import socket
import weakref
from typing import Any

__all__ = ["Connections", "hosts", "opened", "sever", "severable", "snapshot", "track"]

_FDS = "/proc/self/fd"

#: Sockets by descriptor: ``fd -> "socket:[inode]"`` (the inode tells a reused descriptor apart).
Connections = dict[int, str]

_tracked: weakref.WeakKeyDictionary[Any, Connections] = weakref.WeakKeyDictionary()


def snapshot() -> Connections:
    """The process's sockets now (empty where ``/proc/self/fd`` does not exist).

    Examples:
        >>> isinstance(snapshot(), dict)
        True
    """
    found: Connections = {}
    try:
        names = os.listdir(_FDS)
    except OSError:
        return found
    for name in names:
        with contextlib.suppress(OSError, ValueError):
            link = os.readlink(f"{_FDS}/{name}")
            if link.startswith("socket:"):
                found[int(name)] = link
    return found


def _connected(fd: int) -> bool:
    """A stream socket that is not listening (a connection, not gloo's listener)."""
    try:
        probe = socket.socket(fileno=os.dup(fd))
    except OSError:
        return False
    try:
        return probe.type == socket.SOCK_STREAM and not probe.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN)
    except OSError:
        return False
    finally:
        probe.close()


def opened(before: Connections) -> Connections:
    """The connected sockets opened since ``before`` (a `snapshot`).

    Examples:
        >>> opened(snapshot())
        {}
    """
    return {fd: link for fd, link in snapshot().items() if before.get(fd) != link and _connected(fd)}


def track(group: Any, connections: Connections) -> None:
    """Remember ``connections`` as ``group``'s (added to what it holds already)."""
    if connections:
        with contextlib.suppress(TypeError):  # an object that cannot be weakly referenced: nothing to track
            _tracked.setdefault(group, {}).update(connections)


def severable(group: Any) -> bool:
    """Whether connections of ``group`` are known (`sever` can end its pending operations)."""
    try:
        return bool(_tracked.get(group))
    except TypeError:
        return False


def sever(group: Any) -> int:
    """Shut down ``group``'s known connections (those still open); how many were shut.

    Every operation pending on them fails at once, here and at the peer.
    The descriptors stay open (torch closes them when it destroys the group).
    """
    try:
        connections = _tracked.pop(group, {})
    except TypeError:
        return 0
    shut = 0
    for fd, link in connections.items():
        try:
            if os.readlink(f"{_FDS}/{fd}") != link:
                continue  # closed, and the descriptor reused for something else
            twin = socket.socket(fileno=os.dup(fd))
        except OSError:
            continue
        with contextlib.suppress(OSError):
            twin.shutdown(socket.SHUT_RDWR)
            shut += 1
        twin.close()
    return shut


def hosts(store: Any) -> bool:
    """Whether this process listens on ``store``'s port: it hosts the store (rank 0 under a plain ``env://``).

    ``store``: a ``TCPStore``, or a ``PrefixStore`` over one. False where it cannot be told (no ``/proc``, another
    kind of store).

    Examples:
        >>> import torch.distributed as dist
        >>> server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
        >>> hosts(dist.PrefixStore("p", server)), hosts(dist.HashStore())
        (True, False)
    """
    while hasattr(store, "underlying_store"):
        store = store.underlying_store
    port = getattr(store, "port", None)
    if not isinstance(port, int):
        return False
    listening = set()
    for table in ("/proc/self/net/tcp", "/proc/self/net/tcp6"):
        try:
            with open(table) as file:
                lines = file.read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) > 9 and fields[3] == "0A" and int(fields[1].rpartition(":")[2], 16) == port:
                listening.add(f"socket:[{fields[9]}]")  # state 0A: LISTEN; field 9: the inode
    return bool(listening & set(snapshot().values()))
