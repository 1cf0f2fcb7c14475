"""Registry helpers: Megatron-Core's key scheme for a grid's groups, and torch's non-member sentinel.

The registry (``HyperCommGrid._pgs``) maps a key to the calling rank's group of
one family: a dash-joined canonical string (``"dp-tp"``) for the base view and
for a view's families over shared dims only, ``(view_name, dims_tuple)`` for a
view's own families. A later key kind (a tagged communicator, a shared group)
adds a key shape here; identical group objects under several keys are
destroyed once.
"""

from __future__ import annotations

from typing import Any, Union

import torch.distributed as dist

from hypergrid.creation import create_family
from hypergrid.errors import NotInitializedError
from hypergrid.layout import KEY_SEPARATOR

__all__ = ["PgKey", "create_uninitialized", "for_view", "guard_key", "member_or_none"]

#: A registry key: ``"dp-tp"`` for the base view, ``("expert", ("ep", "expt_tp"))`` for a view.
PgKey = Union[str, tuple[str, tuple[str, ...]]]  # noqa: UP007 - a runtime alias must work on Python 3.10


def member_or_none(group: Any) -> dist.ProcessGroup | None:
    """The group, or None where the caller is not a member (torch's NON_GROUP_MEMBER sentinel)."""
    if group is None or group is dist.GroupMember.NON_GROUP_MEMBER:
        return None
    member: dist.ProcessGroup = group
    return member


def create_uninitialized(strategy: str, rank_enum: list[list[int]], options: dict[str, Any]) -> Any:
    """Creation before ``init_process_group``: hand it to torch as Megatron does; torch's refusal becomes ours.

    Only ``new_subgroups_by_enumeration`` is asked (it is what Megatron calls, and
    what tests stand in for); it raises without a default group, which is
    reported as ``NotInitializedError``.
    """
    problem = (
        "create_pg needs torch.distributed to be initialized: call torch.distributed.init_process_group first "
        "(get_rank_enum works offline)"
    )
    if strategy != "enumerate":
        raise NotInitializedError(problem)
    try:
        return create_family(strategy, rank_enum, None, options)
    except (ValueError, RuntimeError) as error:
        raise NotInitializedError(f"{problem}; torch said: {error}") from error


def for_view(key: PgKey) -> str:
    return f" for view {key[0]!r}" if isinstance(key, tuple) else ""


def guard_key(key: PgKey) -> str:
    """A registry key as one string, for the guard's comparison across ranks."""
    return key if isinstance(key, str) else f"{key[0]}:{KEY_SEPARATOR.join(key[1])}"
