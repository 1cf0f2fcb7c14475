"""The exceptions hypergrid raises.

Every error hypergrid raises on bad input is a ``HyperGridError``, and also
the builtin exception a caller would expect (``ValueError`` for a bad value,
``TypeError`` for a bad type, ``KeyError`` for a missing or duplicate group), so
``except ValueError`` keeps working in code written for other libraries.
Messages name the call the user made (`public`), the bad value and what was
expected.
"""

from __future__ import annotations

import functools
import inspect
import re
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = [
    "BackendError",
    "CollectiveMismatchError",
    "CreationRefusedError",
    "DependencyError",
    "DesyncError",
    "DimsError",
    "FencedError",
    "GridReplacedError",
    "GridSpecError",
    "GridTooLargeError",
    "GroupExistsError",
    "GroupNotFoundError",
    "GuardTimeoutError",
    "HyperGridError",
    "InvalidArgumentError",
    "NotInitializedError",
    "OutOfStepError",
    "RankError",
    "RankFailure",
    "StoreLostError",
    "UnexpectedArgumentError",
    "ViewNotFoundError",
    "WorkerError",
    "WorldSizeError",
]


class HyperGridError(Exception):
    """Base class of every exception hypergrid raises on purpose."""


class GridSpecError(HyperGridError, ValueError):
    """The grid description (shape, dim_names, rank_offset) is invalid."""


class DimsError(HyperGridError, ValueError):
    """A dims request names an unknown dim, repeats one, or is empty."""


class RankError(HyperGridError, ValueError):
    """A rank or coordinate is outside the grid, or not an integer."""


class _UnquotedKeyError(HyperGridError, KeyError):
    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class GroupExistsError(_UnquotedKeyError):
    """A process group for this combination of dims was already created."""


class GroupNotFoundError(_UnquotedKeyError):
    """No process group was created for this combination of dims."""


class WorldSizeError(HyperGridError, ValueError):
    """The grid does not fit in the world (``rank_offset + size > world``)."""


class GridTooLargeError(WorldSizeError, RuntimeError):
    """The grid needs more ranks than the world has (a ``RuntimeError`` too, as Megatron-Core raises)."""


class ViewNotFoundError(_UnquotedKeyError):
    """A ``view=`` names no registered view."""


class BackendError(HyperGridError, ValueError):
    """A backend argument is invalid or conflicts with the grid's backend."""


class InvalidArgumentError(HyperGridError, ValueError):
    """An argument outside the grid description has a bad value (a count, a timeout)."""


class UnexpectedArgumentError(HyperGridError, TypeError):
    """A keyword argument is not one the call accepts."""


class NotInitializedError(HyperGridError, RuntimeError):
    """A call needs ``torch.distributed`` to be initialized and it is not."""


class DependencyError(HyperGridError, ImportError):
    """A call needs an optional package (say, megatron-core) that does not import."""


class WorkerError(HyperGridError, RuntimeError):
    """A process started by ``hypergrid.launch.spawn`` failed or timed out.

    Attributes:
        rank: the rank that failed first (``None`` when several timed out).
        remote_traceback: the formatted traceback from that rank, if any.
    """

    def __init__(self, message: str, rank: int | None = None, remote_traceback: str = "") -> None:
        super().__init__(message)
        self.rank = rank
        self.remote_traceback = remote_traceback


class DesyncError(HyperGridError, RuntimeError):
    """Ranks that must create a family together asked for different things.

    Raised on every participating rank by the consistency guard, before any of
    them waits inside torch. The message names the ranks and what each asked for.

    Attributes:
        requests: each distinct request (as text) mapped to the ranks that made it.
        epoch: the latest guard epoch (count of ``destroy()`` calls) among those
            requests; ``destroy()`` starts the grid's next epoch after it, so that
            ranks that were out of step meet again.
    """

    def __init__(self, message: str, requests: dict[str, list[int]] | None = None, epoch: int = 0) -> None:
        super().__init__(message)
        self.requests = requests or {}
        self.epoch = epoch


class OutOfStepError(DesyncError):
    """Ranks are at different points of a grid's creation sequence (one skipped or repeated a call).

    The message names what each rank called. The way back: ``grid.destroy()`` on
    every rank of the grid, then create again (docs/reliability.md).
    """


class RankFailure(HyperGridError, RuntimeError):
    """A peer is gone: a collective, a point-to-point exchange or a creation failed because of it.

    A training loop catches it (and only it) to recover, e.g. with ``grid.shrink``.
    torch's own error, where there was one, is kept as ``__cause__``.

    Attributes:
        dead: the ranks known to be gone (sorted), where hypergrid can tell; else empty.
    """

    def __init__(self, message: str, dead: list[int] | None = None) -> None:
        super().__init__(message)
        self.dead = sorted(dead or [])


class FencedError(HyperGridError, RuntimeError):
    """This rank was declared dead by the others (it answered no roll call in time) and may not rejoin.

    Raised by every grid call of a rank that was stopped or cut off while the
    others recovered without it. Not a `RankFailure`: a recovery loop that
    catches `RankFailure` lets it through, and the process should exit.
    """


class GridReplacedError(HyperGridError, RuntimeError):
    """The grid was replaced by a ``shrink``: its world ended, so it refuses every call (use the new grid).

    Examples:
        >>> issubclass(GridReplacedError, RuntimeError)
        True
    """


class StoreLostError(HyperGridError, ConnectionError):
    """The job's store is gone (the process hosting it died, or the connection to it was cut).

    Every rank that meets the loss gets it, from its next grid call or from a
    wait the loss ended; torch's own error is kept as ``__cause__``. Not a
    `RankFailure`: without the store no world can be re-formed, so a recovery
    loop lets it through and the process should exit (the launcher restarts the
    job from its last checkpoint).
    """


class GuardTimeoutError(RankFailure, TimeoutError):
    """Some ranks did not reach a collective creation within the guard's timeout.

    A `RankFailure`: a rank that never arrives is dead or hung, and the job cannot
    go on with it.

    Attributes:
        missing: the ranks that did not arrive (dead, hung, or creating nothing).
        dead: the participants that answered no roll call after the timeout (dead or hung).
        epoch: as for `DesyncError`.
    """

    def __init__(
        self, message: str, missing: list[int] | None = None, dead: list[int] | None = None, epoch: int = 0
    ) -> None:
        super().__init__(message, dead)
        self.missing = missing or []
        self.epoch = epoch


class CreationRefusedError(HyperGridError, RuntimeError):
    """A creation torch would get wrong (fail late or hang), refused before anything starts."""


class CollectiveMismatchError(HyperGridError, RuntimeError):
    """Members of a group called a collective with different ops, shapes, dtypes or devices (checked collectives).

    Raised on every member, before the collective runs, when collectives are
    checked (``HyperCommGrid(..., check_collectives=True)`` or
    ``HYPERGRID_CHECK_COLLECTIVES=1``).

    Attributes:
        signatures: each distinct call (as text) mapped to the ranks that made it.
    """

    def __init__(self, message: str, signatures: dict[str, list[int]] | None = None) -> None:
        super().__init__(message)
        self.signatures = signatures or {}


# -- messages name the call the user made (the machinery of hypergrid.validation's rule) --------------

F = TypeVar("F", bound=Callable[..., Any])
C = TypeVar("C", bound=type)

#: Where the message as raised is kept once a call's name was put in front of it.
_RAISED = "_hypergrid_raised"
_MARK = "_hypergrid_public"


def _starts_with(text: str, call: str) -> bool:
    return re.match(rf"{re.escape(call)}(?![A-Za-z0-9_])", text) is not None


#: Errors about what happened among the ranks (a desync, a dead peer, a mismatch, a worker): their messages say
#: which collective or creation failed in their own words, and are left as raised. Every other error is about an
#: argument or the caller's state, and names the call.
_OUTCOMES: tuple[type[HyperGridError], ...] = (
    DesyncError,
    RankFailure,
    FencedError,
    GridReplacedError,
    StoreLostError,
    CollectiveMismatchError,
    WorkerError,
)


def name_the_call(error: HyperGridError, call: str) -> None:
    """Put ``call: `` in front of ``error``'s message (in place of a name an inner public call put there).

    A message that already starts with the call's name is left as raised, and
    so are errors about what happened among the ranks (`_OUTCOMES`).

    Examples:
        >>> error = InvalidArgumentError("dim must be one dim name, got ['tp', 'dp']")
        >>> name_the_call(error, "shift"); name_the_call(error, "is_first"); str(error)
        "is_first: dim must be one dim name, got ['tp', 'dp']"
    """
    if not error.args or not isinstance(error.args[0], str) or isinstance(error, _OUTCOMES):
        return
    raised = getattr(error, _RAISED, None)
    if raised is None:
        raised = error.args[0]
        setattr(error, _RAISED, raised)
    error.args = (raised if _starts_with(raised, call) else f"{call}: {raised}", *error.args[1:])


def public(function: F, call: str | None = None) -> F:
    """``function`` as a public call: a ``HyperGridError`` leaving it names ``call`` (default: its name).

    Examples:
        >>> def helper(): raise DimsError("unknown dim 'x'")
        >>> @public
        ... def key(dims): helper()
        >>> key("x")
        Traceback (most recent call last):
          ...
        hypergrid.errors.DimsError: key: unknown dim 'x'
    """
    name = call or function.__name__

    @functools.wraps(function)
    def named(*args: Any, **kwargs: Any) -> Any:
        try:
            return function(*args, **kwargs)
        except HyperGridError as error:
            name_the_call(error, name)
            raise

    setattr(named, _MARK, name)
    return named  # type: ignore[return-value]


def public_methods(cls: C) -> C:
    """Make every public method of ``cls`` (inherited ones too) and its constructor a `public` call.

    The constructor's errors name the class. Properties and names starting
    with ``_`` are left as they are; a method already made public is not wrapped twice.
    """
    for name in dir(cls):
        if name.startswith("_") and name != "__init__":
            continue
        raw = inspect.getattr_static(cls, name)
        function = raw.__func__ if isinstance(raw, (staticmethod, classmethod)) else raw
        if not inspect.isfunction(function) or getattr(function, _MARK, None) is not None:
            continue
        named = public(function, cls.__name__ if name == "__init__" else name)
        setattr(cls, name, type(raw)(named) if isinstance(raw, (staticmethod, classmethod)) else named)
    return cls
