"""A peer's death as one exception: torch's communication errors become ``RankFailure``.

torch reports a dead peer in many shapes: NCCL's ``DistBackendError``, a store's ``DistNetworkError``, gloo's plain
``RuntimeError`` ("Connection closed by peer": its words are read; docs/timing.md says what
decides what). `peer_failures` turns those into ``hypergrid.errors.RankFailure`` (torch's error kept as
``__cause__``); other errors pass through. Every communication call of a grid goes through `communicate` (or
`wait_work`) with its world's alarm, so that failure news from another rank ends the wait at once, on every
backend (`Watched`: an ``async_op`` work whose ``wait()`` does the same). `abort_groups` and
`sever_torch_groups` release groups without blocking on a dead peer. docs/design/recovery.md.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

from hypergrid.binding import waiting
from hypergrid.binding.alarm import Alarm, Job, peer_gone, quoted
from hypergrid.errors import HyperGridError
from hypergrid.launch import sockets

__all__ = [
    "Watched",
    "abort_groups",
    "communicate",
    "is_peer_failure",
    "peer_failures",
    "sever_torch_groups",
    "wait_work",
    "wait_works",
]

#: gloo's words for a peer that is gone (gloo raises a plain RuntimeError: no type or code says it).
_GLOO_WORDS = ("connection closed", "connection reset", "connection refused", "broken pipe", "timed out", "socket")


def is_peer_failure(error: BaseException) -> bool:
    """Whether torch's ``error`` means a peer is gone (or a collective could not finish because of one).

    torch's ``DistError`` family says so by type (NCCL, the store); gloo's
    plain ``RuntimeError`` only by its words.

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
    return any(word in text for word in _GLOO_WORDS)


@contextlib.contextmanager
def peer_failures(alarm: Alarm | None, what: str, dead: Sequence[int] = ()) -> Iterator[None]:
    """Run a torch communication call; raise ``RankFailure`` (from torch's error) if a peer is gone.

    Args:
        alarm: the world's alarm (None: no world to report to; the error names ``dead`` as given).
        what: the call, as the message should name it (``"all_reduce over 'dp'"``).
        dead: ranks known to be gone, for ``RankFailure.dead`` (torch rarely says).

    Raises:
        RankFailure: the call failed because a peer is gone; ``__cause__`` is torch's error.

    Examples:
        >>> with peer_failures(None, "all_reduce over 'dp'"):
        ...     raise RuntimeError("[x/pair.cc:553] Connection closed by peer. GLHF!")
        Traceback (most recent call last):
          ...
        hypergrid.errors.RankFailure: all_reduce over 'dp' failed: a peer is gone (Connection closed by peer.); ...
    """
    try:
        yield
    except RuntimeError as error:
        if not is_peer_failure(error):
            raise
        said = quoted(error)
        raise (peer_gone(what, said, dead) if alarm is None else alarm.failure(what, said, dead)) from error


def wait_work(alarm: Alarm | None, work: Any, what: str, stream: bool = False) -> None:
    """Wait for a torch ``Work``; a peer's failure, or failure news from another rank, raises ``RankFailure``.

    The wait ends as soon as the work completes or this rank learns that the
    world failed, whichever comes first; torch's error, where there is one,
    is kept as ``__cause__``. ``stream=True`` (the work's tensors are on an
    accelerator) never blocks the host (`hypergrid.binding.waiting.wait`).
    """
    with peer_failures(alarm, what):
        waiting.wait(alarm, work, what, stream)


def wait_works(alarm: Alarm | None, works: Iterable[Any], what: str) -> None:
    """`wait_work` for all of ``works`` (a batch of point-to-point requests, say; `hypergrid.binding.waiting`)."""
    with peer_failures(alarm, what):
        waiting.wait_all(alarm, list(works), what)


class Watched:
    """A torch ``Work`` whose ``wait()`` raises ``RankFailure`` on a peer's failure (what ``async_op=True`` returns).

    ``is_completed()``, ``is_success()``, ``exception()``, ``get_future()`` and
    ``result()`` are torch's; ``work`` is the wrapped handle.
    """

    def __init__(self, alarm: Alarm | None, work: Any, what: str, stream: bool = False) -> None:
        self.alarm = alarm
        self.work = work
        self.what = what
        self.stream = stream

    def wait(self, timeout: Any = None) -> bool:
        """Wait for the work (``timeout`` is accepted for torch's signature and ignored); True once it completed."""
        wait_work(self.alarm, self.work, self.what, self.stream)
        return True

    def __getattr__(self, name: str) -> Any:
        return getattr(self.work, name)

    def __repr__(self) -> str:
        return f"Watched({self.what})"


def communicate(
    alarm: Alarm | None, what: str, call: Callable[..., Any], *args: Any, async_op: bool = False, **kwargs: Any
) -> Any:
    """Run torch's collective ``call(*args, **kwargs)``; a peer's failure raises ``RankFailure``.

    The call is issued with ``async_op=True`` and waited on with `wait_work`
    (so failure news ends the wait). Returns ``None``, or with ``async_op=True``
    a `Watched` work. ``alarm``: the world's (None: no world to listen to).

    Examples:
        >>> import torch, torch.distributed as dist
        >>> dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        >>> x = torch.ones(2)
        >>> communicate(None, "all_reduce", dist.all_reduce, x); x.tolist()
        [1.0, 1.0]
        >>> communicate(None, "all_reduce", dist.all_reduce, x, async_op=True).wait()
        True
        >>> dist.destroy_process_group()
    """
    if alarm is not None:
        alarm.check(what)
    with peer_failures(alarm, what):
        work = call(*args, async_op=True, **kwargs)
    stream = on_accelerator(args, kwargs)
    if async_op:
        return Watched(alarm, work, what, stream)
    if work is not None:
        wait_work(alarm, work, what, stream)
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


def abort_groups(groups: Iterable[Any], job: Job | None) -> None:
    """Abort each group (never waiting on a peer), then drop it from torch's registry.

    Groups that torch no longer knows, or that have no ``abort``, are skipped
    quietly: the point is to return, whatever state they are in. While a work
    that a grid wait gave up on still runs (its peer stopped, not dead: gloo
    cannot cancel it), the aborted groups whose connections could not be
    severed are kept alive in ``job``'s graveyard, because destroying a gloo
    group joins the threads that run its works; they go once every such work
    has ended (a later call looks again).
    """
    for group in groups:
        severed = sockets.sever(group)  # gloo: every operation pending on the group fails now, here and at the peers
        abort = getattr(group, "abort", None)
        if abort is not None:
            with contextlib.suppress(RuntimeError):
                abort()
        with contextlib.suppress(ValueError, RuntimeError):
            dist.destroy_process_group(group)
        if not severed and job is not None:
            job.graveyard.append(group)
    if job is not None and not waiting.abandoned(job):
        job.graveyard.clear()


def sever_torch_groups() -> None:
    """End every operation pending on the groups torch holds now, at once (a world's failure, while it is torch's).

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
