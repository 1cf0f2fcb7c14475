"""A peer's death as one exception: torch's communication errors become ``RankFailure``.

torch reports a dead peer in many shapes: gloo's ``RuntimeError`` ("Connection
closed by peer", "Timed out waiting ... for recv"), NCCL's ``DistBackendError``
(a communicator aborted, a remote error), a store's ``DistNetworkError``.
`peer_failures` wraps one torch call and turns those into
``hypergrid.errors.RankFailure`` (torch's error kept as ``__cause__``), so a
training loop catches one exception and calls ``grid.shrink``. Errors that are
not about a peer (a bad argument, a wrong shape) pass through unchanged.

Every communication call of the grid goes through `communicate` (or
`wait_work` for works it already holds): the call is issued asynchronously and
waited on here, so that failure news from another rank can end the wait at once
(`hypergrid.binding.alarm`), on every backend. With ``async_op=True`` the caller
gets a `Watched` work whose ``wait()`` does the same. `check_live` refuses any
grid call on a rank that the others excluded (fenced).

`abort_groups` releases groups without blocking on a dead peer: ``abort()``
where the backend has it (gloo and NCCL do), else nothing to abort, then
torch's ``destroy_process_group`` to drop them from its registry.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

from hypergrid.binding import alarm, waiting
from hypergrid.binding.worldstate import WORLDS
from hypergrid.errors import HyperGridError
from hypergrid.launch import sockets

__all__ = [
    "Watched",
    "abort_groups",
    "abort_world_groups",
    "check_live",
    "communicate",
    "is_peer_failure",
    "peer_failures",
    "wait_work",
    "wait_works",
]

#: Words of torch's messages that mean a peer is gone or a collective could not complete because of one.
_PEER_WORDS = (
    "connection closed",
    "connection reset",
    "connection refused",
    "broken pipe",
    "timed out",
    "timeout",
    "aborted",
    "remote error",
    "remote process exited",
    "socket",
)


def is_peer_failure(error: BaseException) -> bool:
    """Whether torch's ``error`` means a peer is gone (or a collective could not finish because of one).

    Examples:
        >>> is_peer_failure(RuntimeError("[pair.cc:553] Connection closed by peer [127.0.0.1]:2345"))
        True
        >>> is_peer_failure(RuntimeError("Tensors must be contiguous"))
        False
    """
    if isinstance(error, HyperGridError) or not isinstance(error, RuntimeError):
        return False
    if isinstance(error, dist.DistError):
        return True
    text = str(error).lower()
    return any(word in text for word in _PEER_WORDS)


@contextlib.contextmanager
def peer_failures(what: str, dead: Sequence[int] = ()) -> Iterator[None]:
    """Run a torch communication call; raise ``RankFailure`` (from torch's error) if a peer is gone.

    Args:
        what: the call, as the message should name it (``"all_reduce over 'dp'"``).
        dead: ranks known to be gone, for ``RankFailure.dead`` (torch rarely says).

    Raises:
        RankFailure: the call failed because a peer is gone; ``__cause__`` is torch's error.

    Examples:
        >>> with peer_failures("all_reduce over 'dp'"):
        ...     raise RuntimeError("Connection closed by peer")
        Traceback (most recent call last):
          ...
        hypergrid.errors.RankFailure: all_reduce over 'dp' failed: a peer is gone (Connection closed by peer); ...
    """
    try:
        yield
    except RuntimeError as error:
        if not is_peer_failure(error):
            raise
        first_line = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise alarm.failure(what, first_line, dead) from error


def check_live(what: str) -> None:
    """Refuse a grid call on a rank the others excluded (``FencedError``), or in a world that failed (``RankFailure``).

    A process-local check (no communication): it reads what this rank's
    watcher learned (`hypergrid.binding.alarm`).

    Examples:
        >>> check_live("all_reduce over 'dp'")  # no failure known: nothing happens
    """
    alarm.check(what)


def wait_work(work: Any, what: str, stream: bool = False) -> None:
    """Wait for a torch ``Work``; a peer's failure, or failure news from another rank, raises ``RankFailure``.

    The wait ends as soon as the work completes or this rank learns that the
    world failed (`hypergrid.binding.alarm`), whichever comes first; torch's
    error, where there is one, is kept as ``__cause__``. ``stream=True`` (the
    work's tensors are on an accelerator) never blocks the host (`hypergrid.binding.waiting.wait`).
    """
    with peer_failures(what):
        waiting.wait(work, what, stream)


def wait_works(works: Iterable[Any], what: str) -> None:
    """`wait_work` for all of ``works`` (a batch of point-to-point requests, say).

    gloo's point-to-point works have no future: this thread blocks in torch's
    ``wait()``, and a wait that lasts is probed as a collective's is
    (`hypergrid.binding.waiting.wait_all`), so a peer stopped in the middle of
    a transfer is found, and the verdict ends the wait.
    """
    with peer_failures(what):
        waiting.wait_all(list(works), what)


class Watched:
    """A torch ``Work`` whose ``wait()`` raises ``RankFailure`` on a peer's failure (what ``async_op=True`` returns).

    ``is_completed()``, ``is_success()``, ``exception()``, ``get_future()`` and
    ``result()`` are torch's; ``work`` is the wrapped handle.
    """

    def __init__(self, work: Any, what: str, stream: bool = False) -> None:
        self.work = work
        self.what = what
        self.stream = stream

    def wait(self, timeout: Any = None) -> bool:
        """Wait for the work (``timeout`` is accepted for torch's signature and ignored); True once it completed."""
        wait_work(self.work, self.what, self.stream)
        return True

    def __getattr__(self, name: str) -> Any:
        return getattr(self.work, name)

    def __repr__(self) -> str:
        return f"Watched({self.what})"


def communicate(what: str, call: Callable[..., Any], *args: Any, async_op: bool = False, **kwargs: Any) -> Any:
    """Run torch's collective ``call(*args, **kwargs)``; a peer's failure raises ``RankFailure``.

    The call is issued with ``async_op=True`` and waited on with `wait_work`
    (so failure news ends the wait). Returns ``None``, or with ``async_op=True``
    a `Watched` work.

    Examples:
        >>> import torch, torch.distributed as dist
        >>> dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        >>> x = torch.ones(2)
        >>> communicate("all_reduce", dist.all_reduce, x); x.tolist()
        [1.0, 1.0]
        >>> communicate("all_reduce", dist.all_reduce, x, async_op=True).wait()
        True
        >>> dist.destroy_process_group()
    """
    check_live(what)
    with peer_failures(what):
        work = call(*args, async_op=True, **kwargs)
    stream = on_accelerator(args, kwargs)
    if async_op:
        return Watched(work, what, stream)
    if work is not None:
        wait_work(work, what, stream)
    return None


def on_accelerator(args: Iterable[Any], kwargs: dict[str, Any]) -> bool:
    """Whether the first tensor among a call's arguments (or in a list of them) lives off the host.

    Examples:
        >>> import torch
        >>> on_accelerator([torch.ones(1)], {}), on_accelerator([], {"tensor_list": [torch.ones(1)]})
        (False, False)
    """
    for value in [*args, *kwargs.values()]:
        for item in value if isinstance(value, (list, tuple)) else [value]:
            if isinstance(item, torch.Tensor):
                return item.device.type not in ("cpu", "meta")
    return False


def abort_groups(groups: Iterable[Any]) -> None:
    """Abort each group (never waiting on a peer), then drop it from torch's registry.

    Groups that torch no longer knows, or that have no ``abort``, are skipped
    quietly: the point is to return, whatever state they are in. While a work
    that a grid wait gave up on still runs (its peer stopped, not dead: gloo
    cannot cancel it), the aborted groups are kept alive here, because
    destroying a gloo group joins the threads that run its works; they go once
    every such work has ended (a later call looks again).
    """
    for group in groups:
        severed = sockets.sever(group)  # gloo: every operation pending on the group fails now, here and at the peers
        abort = getattr(group, "abort", None)
        if abort is not None:
            with contextlib.suppress(RuntimeError):
                abort()
        with contextlib.suppress(ValueError, RuntimeError):
            dist.destroy_process_group(group)
        if not severed:
            WORLDS.graveyard.append(group)
    if not waiting.abandoned():
        WORLDS.graveyard.clear()


def abort_world_groups() -> None:
    """The world failed: end every operation pending on this rank's groups at once (its watcher calls this).

    gloo groups whose connections are known (`hypergrid.launch.sockets`) have
    them severed; NCCL communicators are aborted (``ncclCommAbort``). The
    groups stay registered: ``shrink`` tears them down. Torch calls made
    outside the grid on these groups then fail at once too, instead of waiting
    for the group's timeout.
    """
    for group in list(c10d._world.pg_map):
        if sockets.severable(group):
            sockets.sever(group)
            continue
        with contextlib.suppress(RuntimeError, ValueError, AttributeError):
            if dist.get_backend(group) == "nccl":
                group.abort()
