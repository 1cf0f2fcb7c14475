"""Registry helpers: Megatron-Core's key scheme for a grid's groups, and torch's non-member sentinel.

The registry (``HyperCommGrid._pgs``) maps a key to the calling rank's group of
one family: a dash-joined canonical string (``"dp-tp"``) for the base view and
for a view's families over shared dims only, ``(view_name, dims_tuple)`` for a
view's own families. The two halves of a hierarchical family add the half
to a string key (``"dp-tp|within=node"``, ``"dp-tp|across=node"``). A later
key kind (a tagged communicator, a shared group) adds a key shape here; identical group objects under several keys are
destroyed once.
"""

from __future__ import annotations

from typing import Any, Union

import torch.distributed as dist

from hypergrid.binding.creation import create_family
from hypergrid.errors import NotInitializedError
from hypergrid.layout import KEY_SEPARATOR

__all__ = [
    "SCOPE_SEPARATOR",
    "TAG_SEPARATOR",
    "PgKey",
    "create_uninitialized",
    "for_view",
    "guard_key",
    "member_or_none",
    "scoped",
    "tagged",
    "untagged",
]

#: A registry key: ``"dp-tp"`` for the base view, ``("expert", ("ep", "expt_tp"))`` for a view; a tagged
#: communicator's: ``"dp-tp@ag"``, ``("expert", ("ep", "expt_tp"), "ag")``.
PgKey = Union[str, tuple[str, tuple[str, ...]], tuple[str, tuple[str, ...], str]]  # noqa: UP007 - a runtime alias must work on Python 3.10

#: Joins a base key and its communicator tag (``"dp-tp@ag"``); dim names and tags cannot contain it.
TAG_SEPARATOR = "@"


#: Joins a family key and the half of its hierarchy (``"dp-tp|within=node"``); dim names cannot contain it.
SCOPE_SEPARATOR = "|"


def scoped(key: PgKey, scope: str | None) -> PgKey:
    """The registry key of the ``scope`` half (``"within"``/``"across"``) of a family (``key`` for None).

    The half is written after the dims: ``"dp-tp|within=node"``; for a view's
    own family, after its last dim: ``("expert", ("edp", "ep|within=node"))``,
    so that its dims read ``"edp-ep|within=node"`` as the grid's do.

    Examples:
        >>> scoped("dp-tp", "within"), scoped("dp", None)
        ('dp-tp|within=node', 'dp')
        >>> scoped(("expert", ("edp", "ep")), "across")
        ('expert', ('edp', 'ep|across=node'))
    """
    if scope is None:
        return key
    suffix = f"{SCOPE_SEPARATOR}{scope}=node"
    if isinstance(key, str):
        return f"{key}{suffix}"
    *inner, last = key[1]
    return (key[0], (*inner, last + suffix))


def tagged(key: PgKey, tag: str | None) -> PgKey:
    """The registry key of the communicator ``tag`` over the family of ``key`` (``key`` itself for no tag).

    Examples:
        >>> tagged("dp-tp", "ag"), tagged(("expert", ("ep",)), "cpu"), tagged("dp", None)
        ('dp-tp@ag', ('expert', ('ep',), 'cpu'), 'dp')
    """
    if tag is None:
        return key
    if isinstance(key, str):
        return f"{key}{TAG_SEPARATOR}{tag}"
    return (key[0], key[1], tag)


def untagged(key: PgKey) -> tuple[PgKey, str | None]:
    """The family key and the tag of a registry key.

    Examples:
        >>> untagged("dp-tp@ag"), untagged(("expert", ("ep",), "cpu")), untagged("dp")
        (('dp-tp', 'ag'), (('expert', ('ep',)), 'cpu'), ('dp', None))
    """
    if isinstance(key, str):
        family, _, tag = key.partition(TAG_SEPARATOR)
        return family, tag or None
    if len(key) == 3:
        return (key[0], key[1]), key[2]
    return key, None


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
        "creating a family needs torch.distributed to be initialized: call torch.distributed.init_process_group "
        "first (get_rank_enum works offline)"
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
    """A registry key as one string, for the guard's comparison across ranks and the report.

    Examples:
        >>> guard_key("dp@ag"), guard_key(("expert", ("edp", "ep"))), guard_key(("expert", ("ep",), "ag"))
        ('dp@ag', 'expert:edp-ep', 'expert:ep@ag')
    """
    if isinstance(key, str):
        return key
    family, tag = untagged(key)
    text = f"{family[0]}:{KEY_SEPARATOR.join(family[1])}"
    return text if tag is None else f"{text}{TAG_SEPARATOR}{tag}"
