"""Creation strategies: how the process groups of one family come into being.

- ``"enumerate"`` (default): ``torch.distributed.new_subgroups_by_enumeration``.
  Every rank of the world calls ``new_group`` once per group of the family:
  O(number of groups) calls per rank.
- ``"local"``: each member creates only its own group with
  ``new_group(ranks, use_local_synchronization=True)``; non-members do
  nothing. One call per rank per family, whatever the world size. Rule: the
  members of a group must create the same families in the same order, and hold
  the same number of process groups when they do (torch names such groups from
  that count; the consistency guard checks it).
- ``"split"``: ``torch.distributed.split_group`` — one ``ncclCommSplit`` of the
  default group per family. Needs a default group bound to a device
  (``init_process_group(..., device_id=...)``) whose backend can split (NCCL);
  anything else is refused up front with ``BackendError``
  (gloo cannot split), never a fallback that would silently change the cost.
"""

from __future__ import annotations

import datetime
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

from hypergrid.binding.options import unavailable_backend
from hypergrid.errors import BackendError, CreationRefusedError, InvalidArgumentError
from hypergrid.launch import sockets
from hypergrid.values import first_line, shown

__all__ = ["STRATEGIES", "check_strategy", "check_can_split", "check_creatable", "create_family", "held_group_count"]

STRATEGIES = ("enumerate", "local", "split")

#: The torch function each strategy creates with (looked up on torch.distributed when called).
_CREATORS = {"enumerate": "new_subgroups_by_enumeration", "local": "new_group", "split": "split_group"}


def check_strategy(strategy: object) -> str:
    """Validate a strategy name.

    Examples:
        >>> check_strategy("local")
        'local'
    """
    if not isinstance(strategy, str) or strategy not in STRATEGIES:
        raise InvalidArgumentError(f"strategy must be one of {list(STRATEGIES)}, got {shown(strategy)}")
    return str(strategy)


def check_can_split(backend: str | None) -> None:
    """Refuse ``"split"`` where torch cannot split the default group.

    Raises:
        BackendError: the default group is not bound to a device, its backend
            cannot split, or ``backend`` asks for another backend than the default's.
    """
    default = dist.group.WORLD
    default_backend = dist.get_backend()
    if backend is not None and backend != default_backend:
        raise BackendError(
            f"strategy 'split' makes groups of the default group's backend {shown(default_backend)}; "
            f"it cannot make {shown(backend)} groups (use strategy 'enumerate' or 'local')"
        )
    device = None if default is None else default.bound_device_id
    if device is None or default_backend != "nccl":
        bound = "without a bound device" if device is None else f"bound to {device}"
        raise BackendError(
            "strategy 'split' needs the default group to be NCCL bound to a device "
            f"(init_process_group('nccl', device_id=...)); this one is {shown(default_backend)} {bound}; "
            "use strategy 'enumerate' or 'local'"
        )


def check_creatable(strategy: str, backend: str | None, what: str) -> None:
    """Refuse, before any wait, a backend torch cannot create here with ``strategy`` (``what``: the call, families).

    Checked where torch's own function will create the groups: a test that
    stands in for it (Megatron-Core's mocked ``new_subgroups_by_enumeration``
    naming NCCL on a CPU machine) creates nothing, so nothing is refused. A
    backend this torch was built without (``torch.distributed.is_mpi_available()``,
    ...), plain ``"nccl"`` without a CUDA device, and MPI members-only groups
    (torch has no ``use_local_synchronization`` for MPI) are refused.

    Raises:
        BackendError: one line naming the backend, the call and what this machine lacks.

    Examples:
        >>> check_creatable("enumerate", "gloo", "create_pg 'dp'")
        >>> check_creatable("local", "mpi", "create_pg 'dp'")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
          ...
        hypergrid.errors.BackendError: create_pg 'dp' with backend 'mpi': torch makes no members-only MPI groups ...
    """
    names = set() if backend is None else {pair.rpartition(":")[2] for pair in backend.split(",")}
    if strategy == "local" and "mpi" in names:
        raise BackendError(
            f"{what} with backend {shown(backend)}: torch makes no members-only MPI groups "
            "(no use_local_synchronization for MPI); use strategy 'enumerate'"
        )
    creator = _CREATORS[strategy]
    if getattr(dist, creator) is not getattr(c10d, creator):
        return  # stood in for: nothing is created here, so nothing is refused
    missing = unavailable_backend(backend)
    why = f"torch.distributed.is_{missing}_available() is not True"
    if missing is None and backend == "nccl" and not torch.cuda.is_available():
        missing, why = "nccl", "NCCL groups need CUDA devices and torch.cuda.is_available() is False"
    if missing is not None:
        raise BackendError(
            f"{what} with backend {shown(backend)}: backend {missing!r} is not available on this machine ({why}); "
            "refused before any rank waits: use another backend or a machine and torch built with it"
        )


def create_family(
    strategy: str,
    rank_enum: list[list[int]] | None,
    my_ranks: list[int] | None,
    options: dict[str, Any],
    bound_s: float | None = None,
    family: str = "",
    local_names: dict[tuple[tuple[int, ...], int], str] | None = None,
) -> dist.ProcessGroup | None:
    """Create one family's groups with ``strategy``; return the caller's group or None.

    ``rank_enum`` (the whole family) is needed by ``enumerate`` and ``split``;
    ``my_ranks`` (the caller's group, None outside the grid) by ``local``.
    ``bound_s``: torch waits at most this long for the other members while it
    creates (a dead peer fails the creation instead of hanging it); the group
    then gets its own timeout (``options["timeout"]``, else torch's default) for
    its collectives. ``family`` names the family in errors (default: its groups). ``local_names``: the world's
    record of the members-only groups this rank created (``"local"``; see `_create`).

    Raises:
        BackendError: torch refused the backend because this machine's build
            lacks it (the name was checked when the grid or call was made; whether
            it is built in is torch's to say, here): one line naming both.
    """
    try:
        return _bounded(strategy, rank_enum, my_ranks, options, bound_s, {} if local_names is None else local_names)
    except (RuntimeError, AssertionError) as error:
        backend = options.get("backend")
        missing = unavailable_backend(backend)
        if missing is None:
            raise
        named = family or f"over groups {shown(rank_enum if rank_enum is not None else [my_ranks])}"
        raise BackendError(
            f"creating family {named} with backend {shown(backend)}: backend {shown(missing)} is not "
            f"available in this torch "
            f"build on this machine (torch.distributed.is_{missing}_available() is not True; torch said: "
            f"{first_line(error)}); use another backend or a torch built with it"
        ) from error


def _bounded(
    strategy: str,
    rank_enum: list[list[int]] | None,
    my_ranks: list[int] | None,
    options: dict[str, Any],
    bound_s: float | None,
    names: dict[tuple[tuple[int, ...], int], str],
) -> dist.ProcessGroup | None:
    before = sockets.snapshot()  # the connections this creation opens are the group's (severed if it aborts)
    if bound_s is None or dist.get_backend() == "fake":
        group = _create(strategy, rank_enum, my_ranks, options, names)
    else:
        backend = options.get("backend") or dist.get_backend()
        operational = options.get("timeout") or c10d._get_default_timeout(backend)
        bounded = min(operational, datetime.timedelta(seconds=bound_s))
        group = _create(strategy, rank_enum, my_ranks, {**options, "timeout": bounded}, names)
        if (
            bounded != operational and isinstance(group, dist.ProcessGroup)  # NON_GROUP_MEMBER is no ProcessGroup
        ):
            c10d._set_pg_timeout(operational, group)
    if isinstance(group, dist.ProcessGroup):
        sockets.track(group, sockets.opened(before))
    return group


def held_group_count() -> int:
    """How many process groups this rank holds, as torch counts them.

    torch names a group created with ``use_local_synchronization=True`` from its
    ranks *and* this count (``len(_world.pg_names)`` in torch 2.4 to 2.13), so members
    that hold different numbers of groups would wait on different store keys.
    """
    return len(c10d._world.pg_names)


def _create(
    strategy: str,
    rank_enum: list[list[int]] | None,
    my_ranks: list[int] | None,
    options: dict[str, Any],
    used: dict[tuple[tuple[int, ...], int], str],
) -> dist.ProcessGroup | None:
    if strategy == "local":
        if my_ranks is None:
            return None
        identity = (tuple(my_ranks), held_group_count())
        if identity in used:
            raise CreationRefusedError(
                f"strategy 'local' would create a group over ranks {my_ranks} while this rank holds "
                f"{identity[1]} process groups, as when it created group {shown(used[identity])} over the same "
                "ranks: torch would give the new group that same name and reuse its rendezvous keys in "
                "the store, left behind when it was destroyed, so the members would connect to stale "
                "addresses (connection refused) or hang. Create this family with strategy='enumerate', "
                "or create it before destroying the earlier group."
            )
        group: dist.ProcessGroup = dist.new_group(my_ranks, use_local_synchronization=True, **options)
        used[identity] = group.group_name
        return group
    assert rank_enum is not None
    if strategy == "split":
        options = {name: value for name, value in options.items() if name != "backend"}
        split: dist.ProcessGroup | None = dist.split_group(split_ranks=rank_enum, **options)
        return split
    mine: dist.ProcessGroup | None
    mine, _ = dist.new_subgroups_by_enumeration(rank_enum, **options)  # type: ignore[no-untyped-call]
    return mine
