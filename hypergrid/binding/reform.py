"""The world after a shrink: the default group re-formed over the survivors under a new store prefix.

Every world a shrink makes is numbered: its *epoch* (0 for the world the job started with). `reform_world` tears
the old default group down (`tear_down`: nothing waits on a dead peer) and forms the new one on the epoch-0
world's store under `world_prefix`, or, where the backend can (`can_shrink`: NCCL's ``shrink_group``), shrinks
the default communicator in place. `world_keys` and `forget_keys` delete torch's rendezvous keys once a new world
committed. Why, when, and the store that must outlive every worker: docs/design/recovery.md ("Attempts: forming
the new world", "NCCL's shrink_group", "Store hygiene").
"""

from __future__ import annotations

import datetime
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

from hypergrid.binding.alarm import Job
from hypergrid.binding.failures import abort_groups
from hypergrid.launch import sockets
from hypergrid.launch.memberlog import pin_member

__all__ = [
    "Formed",
    "can_shrink",
    "formed",
    "forget_keys",
    "forget_numbered",
    "numbered_keys",
    "world_keys",
    "reform_world",
    "tear_down",
    "unprefixed_excepthook",
    "world_prefix",
]

#: How a world was formed, for the one after it: its backend and its default group's timeout.
Formed = tuple[str, datetime.timedelta]


def _default_timeout() -> datetime.timedelta:
    """The default group's timeout (the new world keeps it); torch's default where it cannot be read."""
    world: Any = dist.group.WORLD
    try:
        timeout = world._get_backend(world.bound_device_id or torch.device("cpu")).options._timeout
    except (AttributeError, RuntimeError):
        timeout = None
    return timeout if isinstance(timeout, datetime.timedelta) else datetime.timedelta(minutes=30)


def formed() -> Formed:
    """The current default group's backend and timeout (what a world formed after it keeps)."""
    return dist.get_backend(), _default_timeout()


def tear_down(job: Job | None) -> None:
    """Abort the default group (never waiting on a dead peer); torch forgets it and every other group.

    Nothing to do where no world is initialized. ``job``: where a group that cannot be severed waits for the
    works a grid wait gave up on (`hypergrid.binding.failures.abort_groups`).
    """
    if not dist.is_initialized():
        return
    abort_groups([dist.group.WORLD], job)
    if dist.is_initialized():  # abort_groups destroys the world where torch lets it
        dist.destroy_process_group()


def can_shrink() -> bool:
    """Whether the default group's backend shrinks in place (``torch.distributed.shrink_group``; NCCL >= 2.27)."""
    world: Any = dist.group.WORLD
    if world is None or not hasattr(dist, "shrink_group"):
        return False
    device = world.bound_device_id or (torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu"))
    try:
        return bool(world._get_backend(device).supports_shrinking)
    except (AttributeError, RuntimeError):
        return False


def reform_world(
    base_store: Any,
    number: int,
    namespace: str | None,
    rank: int,
    size: int,
    how: Formed,
    job: Job | None,
    timeout: datetime.timedelta | None,
    excluded: list[int] | None = None,
    bound_s: float | None = None,
    forming_on: Callable[[Any], Any] | None = None,
) -> str | None:
    """Tear down the old world and join world ``number`` of ``size`` ranks as ``rank``; the new world's namespace.

    Collective over the new world's ranks (each calls it with its new rank).
    ``RANK`` and ``WORLD_SIZE`` in the environment follow the new world where set.
    ``how``: the old world's backend and timeout (`formed`, read before any teardown); ``job``: `tear_down`'s.
    ``excluded``: the old ranks
    left out, when the others keep their order; then a backend that can shrink (`can_shrink`) shrinks the default
    group in place instead of re-forming it (``namespace``, the old world's, stays). ``bound_s``: torch waits at
    most this long for the other ranks while it forms the world (a death there fails it instead of hanging it);
    the world then gets ``timeout`` (else the old world's) for its collectives. ``forming_on(store)``: the store
    torch forms the world on (`hypergrid.binding.interruptible.InterruptibleStore`: a death there ends torch's wait
    at once), ``store`` itself by default. The namespace returned is where
    the world's default group keeps its keys in ``base_store`` (torch's ``_get_default_store()`` is
    ``base_store`` under it).
    """
    backend, old_timeout = how
    timeout = timeout or old_timeout
    if excluded and dist.is_initialized() and can_shrink():
        dist.shrink_group(sorted(excluded), shrink_flags=c10d.SHRINK_ABORT)
    else:
        tear_down(job)
        bounded = timeout if bound_s is None else min(timeout, datetime.timedelta(seconds=bound_s))
        plain = dist.PrefixStore(world_prefix(number), base_store)  # type: ignore[attr-defined]
        store = plain if forming_on is None else forming_on(plain)
        before = sockets.snapshot()
        # torch names the default group from a counter (its keys in ``store`` go under that name) and counts it
        # before the rendezvous: a member whose last attempt failed inside init_process_group kept the count that a
        # member whose attempt got further had reset (destroy_process_group does), so their names, and keys, would
        # differ in every attempt after. No world is formed here: the count torch's destroy leaves.
        c10d._world.group_count = 0
        sys.excepthook = unprefixed_excepthook(sys.excepthook)  # (torch prefixes it again: once, with the new rank)
        dist.init_process_group(backend, store=store, rank=rank, world_size=size, timeout=bounded)
        sockets.track(dist.group.WORLD, sockets.opened(before))
        # torch keeps the group's keys under "<group name>/" in the store it is given (torch 2.4 to 2.13)
        world: Any = dist.group.WORLD
        namespace = f"{world_prefix(number)}/{c10d._world.pg_names[world]}/"
        backend_name, kept = c10d._world.pg_map[world]
        if store is not plain and getattr(kept, "underlying_store", None) is store:  # the group's later stores: plain
            c10d._world.pg_map[world] = (backend_name, dist.PrefixStore(f"{c10d._world.pg_names[world]}/", plain))  # type: ignore[attr-defined]
        if bounded != timeout:
            c10d._set_pg_timeout(timeout, dist.group.WORLD)
    pin_member()  # (the launcher's RANK names this process for its life: kept before the new world's replaces it)
    for name, value in (("RANK", rank), ("WORLD_SIZE", size)):
        if name in os.environ:
            os.environ[name] = str(value)
    return namespace


def unprefixed_excepthook(hook: Any) -> Any:
    """``hook`` without the ``[rank<N>]:`` wrappers torch's ``init_process_group`` puts around ``sys.excepthook``
    (one more each time a world forms, so a shrunk job's tracebacks would read ``[rank3]: [rank4]: ...``).

    Examples:
        >>> import sys, torch.distributed as dist
        >>> plain = unprefixed_excepthook(sys.excepthook)  # (an earlier world may have wrapped it)
        >>> for _ in range(2):
        ...     dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        ...     dist.destroy_process_group()
        >>> sys.excepthook is plain, unprefixed_excepthook(sys.excepthook) is plain
        (False, True)
        >>> sys.excepthook = plain
    """
    while getattr(hook, "__name__", "") == "_distributed_excepthook" and hook.__closure__:
        cells = dict(zip(hook.__code__.co_freevars, hook.__closure__))
        if "old_hook" not in cells:
            break
        hook = cells["old_hook"].cell_contents
    return hook


def world_prefix(number: int) -> str:
    """The store prefix of world ``number``'s default group (torch's rendezvous keys live under it).

    Examples:
        >>> world_prefix(3)
        'hypergrid/elastic/3/world'
    """
    return f"hypergrid/elastic/{number}/world"


def world_keys(base_store: Any, up_to: int) -> list[str]:
    """Every key under the prefix of a world numbered ``up_to`` or lower (`world_prefix`), at this moment.

    Take the list while no member of world ``up_to`` can write under its
    prefix (they all wait in its commit barrier), delete it once they are past
    (`forget_keys`): keys written after the list was taken (a guard round, a
    group created on the new world) stay. A store that cannot list its keys gives [].

    Examples:
        >>> import torch.distributed as dist
        >>> store = dist.HashStore()
        >>> store.set("hypergrid/elastic/1/world/0//cpu//0/0", "a"); store.set("hypergrid/elastic/2/ready/count", "1")
        >>> keys = world_keys(store, 1); keys
        ['hypergrid/elastic/1/world/0//cpu//0/0']
        >>> forget_keys(store, keys), store.num_keys()
        (1, 1)
    """
    return numbered_keys(base_store, "hypergrid/elastic", up_to, "world/")


def forget_keys(store: Any, keys: Sequence[str]) -> int:
    """Delete ``keys`` from ``store``; how many were there."""
    return sum(bool(store.delete_key(key)) for key in keys)


def numbered_keys(store: Any, prefix: str, up_to: int, part: str = "") -> list[str]:
    """Every key ``<prefix>/<n>/<part>...`` of ``store`` with ``n <= up_to`` ([] when it cannot list its keys)."""
    try:
        keys = store.list_keys()
    except (RuntimeError, AttributeError, NotImplementedError):  # a store without a listing (torch's FakeStore)
        return []
    found = []
    for key in keys:
        head, _, rest = key.partition(f"{prefix}/")
        number, _, tail = rest.partition("/")
        if head == "" and number.isdigit() and int(number) <= up_to and tail.startswith(part):
            found.append(key)
    return found


def forget_numbered(store: Any, prefix: str, up_to: int, part: str = "") -> int:
    """Delete every key ``<prefix>/<n>/<part>...`` of ``store`` with ``n <= up_to``; how many were deleted.

    A store that cannot list its keys is left as it is (0).

    Examples:
        >>> import torch.distributed as dist
        >>> store = dist.HashStore()
        >>> store.set("hypergrid/live/0/wake/3", "1"); store.set("hypergrid/live/1/wake/0", "1")
        >>> forget_numbered(store, "hypergrid/live", 0), store.check(["hypergrid/live/1/wake/0"])
        (1, True)
    """
    return forget_keys(store, numbered_keys(store, prefix, up_to, part))
