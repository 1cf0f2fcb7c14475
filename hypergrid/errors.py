"""The exceptions hypergrid raises.

Every error hypergrid raises on bad input is a ``HyperGridError``, and also
the builtin exception a caller would expect (``ValueError`` for a bad value,
``TypeError`` for a bad type, ``KeyError`` for a missing or duplicate group), so
``except ValueError`` keeps working in code written for other libraries.
Messages name the bad value and what was expected.
"""

from __future__ import annotations

__all__ = [
    "BackendError",
    "CollectiveMismatchError",
    "CreationRefusedError",
    "DependencyError",
    "DesyncError",
    "DimsError",
    "FencedError",
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


class GroupExistsError(HyperGridError, KeyError):
    """A process group for this combination of dims was already created."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class GroupNotFoundError(HyperGridError, KeyError):
    """No process group was created for this combination of dims."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class WorldSizeError(HyperGridError, ValueError):
    """The grid does not fit in the world (``rank_offset + size > world``)."""


class GridTooLargeError(WorldSizeError, RuntimeError):
    """The grid needs more ranks than the world has (a ``RuntimeError`` too, as Megatron-Core raises)."""


class ViewNotFoundError(HyperGridError, KeyError):
    """A ``view=`` names no registered view."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


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
