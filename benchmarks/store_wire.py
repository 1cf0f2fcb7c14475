"""torch's TCPStore wire protocol, client side, for pipelined simulated ranks (`benchmarks.rollcall`).

A simulated rank must send the very requests a real rank sends, but a Python
``TCPStore`` client serves one call at a time and costs ~10 µs of client CPU
per call: 131,072 ranks times 12 calls would measure the simulation, not the
store. This module writes the same bytes torch's client writes
(``torch/csrc/distributed/c10d/TCPStore.cpp``, torch 2.13: a ``QueryType``
byte, strings as a little-endian ``size_t`` length and the bytes, every key
prefixed by ``/``), so one socket can carry the requests of many simulated
ranks back to back, and their fixed-size answers are read in one go.

Examples:
    >>> add("k", 1)
    b'\\x04\\x02\\x00\\x00\\x00\\x00\\x00\\x00\\x00/k\\x01\\x00\\x00\\x00\\x00\\x00\\x00\\x00'
"""

from __future__ import annotations

import selectors
import socket
import struct
import time
from collections.abc import Sequence

__all__ = ["add", "append", "check", "compare_set", "connect", "delete_key", "get", "receive", "set_key", "wait"]

# torch's QueryType (TCPStoreBackend.hpp), in order.
VALIDATE, SET, COMPARE_SET, GET, ADD, CHECK, WAIT, _NUM_KEYS, DELETE_KEY, APPEND = range(10)
PING = 13
MAGIC = 0x3C85F7CE  # validationMagicNumber
#: The sizes of the answers: a check's and a wait's are one byte, an add's and a delete's an int64.
FLAG, INT = 1, 8


def _text(value: str | bytes) -> bytes:
    data = value.encode() if isinstance(value, str) else value
    return struct.pack("<Q", len(data)) + data


def _key(key: str) -> bytes:
    return _text("/" + key)


def add(key: str, value: int) -> bytes:
    return bytes([ADD]) + _key(key) + struct.pack("<q", value)


def set_key(key: str, value: str) -> bytes:
    return bytes([SET]) + _key(key) + _text(value)  # no answer


def append(key: str, value: str) -> bytes:
    return bytes([APPEND]) + _key(key) + _text(value)  # no answer


def check(keys: Sequence[str]) -> bytes:
    return bytes([CHECK]) + struct.pack("<Q", len(keys)) + b"".join(_key(key) for key in keys)


def wait(keys: Sequence[str]) -> bytes:
    return bytes([WAIT]) + struct.pack("<Q", len(keys)) + b"".join(_key(key) for key in keys)


def get(key: str) -> bytes:
    """The read that follows the wait of torch's ``get`` (its answer: an int64 length, then the value)."""
    return bytes([GET]) + _key(key)


def delete_key(key: str) -> bytes:
    return bytes([DELETE_KEY]) + _key(key)


def compare_set(key: str, expected: str, desired: str) -> bytes:
    return bytes([COMPARE_SET]) + _key(key) + _text(expected) + _text(desired)


def receive(sock: socket.socket, size: int) -> bytes:
    """Exactly ``size`` bytes from ``sock`` (blocking)."""
    chunks, left = [], size
    while left:
        chunk = sock.recv(min(left, 1 << 20))
        if not chunk:
            raise ConnectionError(f"the store closed the connection with {left} of {size} bytes unread")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def connect(
    port: int, count: int, host: str = "127.0.0.1", window: int = 256, timeout_s: float = 300.0
) -> list[socket.socket]:
    """``count`` connections to a TCPStore server, validated and pinged as torch's client does.

    Up to ``window`` connections await their ping's answer at once: on this
    host about one new connection in 60 gets its first answer 5 s late (with
    torch's own client too, and either server backend), so opening them one at
    a time would take minutes, and all at once overflows the server's accept
    queue.
    """
    socks: list[socket.socket] = []
    pending = 0
    until = time.monotonic() + timeout_s
    with selectors.DefaultSelector() as selector:
        while len(socks) < count:
            while pending < window and len(socks) + pending < count:
                sock = socket.create_connection((host, port))
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                sock.sendall(bytes([VALIDATE]) + struct.pack("<I", MAGIC) + bytes([PING]) + struct.pack("<I", 7))
                selector.register(sock, selectors.EVENT_READ)
                pending += 1
            if time.monotonic() > until:
                raise ConnectionError(f"{count - len(socks)} of {count} connections to {host}:{port} not ready")
            for key, _ in selector.select(1.0):
                sock = key.fileobj  # type: ignore[assignment]
                if receive(sock, 4) != struct.pack("<I", 7):
                    raise ConnectionError(f"the store at {host}:{port} answered the ping with something else")
                selector.unregister(sock)
                socks.append(sock)
                pending -= 1
    return socks
