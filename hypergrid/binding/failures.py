"""A peer's death as one exception: torch's communication errors become ``RankFailure``.

torch reports a dead peer in many shapes: gloo's ``RuntimeError`` ("Connection
closed by peer", "Timed out waiting ... for recv"), NCCL's ``DistBackendError``
(a communicator aborted, a remote error), a store's ``DistNetworkError``.
`peer_failures` wraps one torch call and turns those into
``hypergrid.errors.RankFailure`` (torch's error kept as ``__cause__``), so a
training loop catches one exception and calls ``grid.shrink``. Errors that are
not about a peer (a bad argument, a wrong shape) pass through unchanged.

`abort_groups` releases groups without blocking on a dead peer: ``abort()``
where the backend has it (gloo and NCCL do), else nothing to abort, then
torch's ``destroy_process_group`` to drop them from its registry.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import torch.distributed as dist

from hypergrid.errors import HyperGridError, RankFailure

__all__ = ["abort_groups", "is_peer_failure", "peer_failures"]

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
        raise RankFailure(
            f"{what} failed: a peer is gone ({first_line}); catch RankFailure and call grid.shrink() on every "
            "survivor to carry on",
            list(dead),
        ) from error


def abort_groups(groups: Iterable[Any]) -> None:
    """Abort each group (never waiting on a peer), then drop it from torch's registry.

    Groups that torch no longer knows, or that have no ``abort``, are skipped
    quietly: the point is to return, whatever state they are in.
    """
    for group in groups:
        abort = getattr(group, "abort", None)
        if abort is not None:
            with contextlib.suppress(RuntimeError):
                abort()
        with contextlib.suppress(ValueError, RuntimeError):
            dist.destroy_process_group(group)
