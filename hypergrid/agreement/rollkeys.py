"""Where the roll call (`hypergrid.agreement.liveness`) keeps its state in the store: the key of each thing.

Keys of world ``w`` (``hypergrid/live/<w>``) and of its incident ``k`` (``I = hypergrid/live/<w>/<k>``):

- ``I/call``, ``I/woken``, ``I/alive``, ``I/count``, ``I/verdict``, ``I/read``: the incident
  (`hypergrid.agreement.liveness`);
- ``I/wake/<block>``: what the watchers of the block's ranks block on (`wake_key`: one key per `WAKE_BLOCK`
  consecutive ranks);
- ``hypergrid/live/<w>/done``: the last incident whose every live rank read its verdict (`done_key`);
- ``hypergrid/live/<w>/members``: who joined the world's watch and who left it (`members_key`), and its count;
- ``hypergrid/live/<w>/ended``: the ranks a shrink left behind (`ended_key`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence

__all__ = [
    "END",
    "PREFIX",
    "WAKE_BLOCK",
    "done_key",
    "end_text",
    "ended_key",
    "incident_prefix",
    "member_status",
    "members_key",
    "wake_key",
    "wake_keys",
]

PREFIX = "hypergrid/live"

#: Consecutive ranks whose watchers share one wake key: a node's GPUs in torchrun's numbering. A roll call writes
#: one key per block (16,384 at 131,072 ranks); a rank whose world closes wakes its block's other watchers, which
#: look once and wait again (`hypergrid.agreement.watcher.Watcher.halt`).
WAKE_BLOCK = 8

#: The call that ends a world (its ranks moved to the next one): ``end [dead, readers]``.
END = "end "


def end_text(dead: Sequence[int], world_size: int, caller: int | None = None) -> str:
    """The call that ends a world of ``world_size`` ranks whose ``dead`` were left behind.

    Every other rank's watcher reads it once (the last deletes it); a rank it
    names fences itself. ``caller`` makes each survivor's end differ: only the
    one whose end opened the incident wakes the watchers (a second wake would stay).

    Examples:
        >>> end_text([3], 8), end_text([3], 8, caller=0)
        ('end [[3], 7]', 'end [[3], 7, 0]')
    """
    return END + json.dumps([sorted(dead), world_size - len(set(dead)), *([] if caller is None else [caller])])


def members_key(world: int) -> str:
    """The key that says who joined world ``world``'s watch (``+<rank>`` lines) and who left it (``-<rank>``).

    A rank joins when it first holds a grid of the world, and leaves when its
    world closes (its last grid's ``destroy()``, ``destroy_process_group()``,
    exit); it may join again. A roll call names dead only a rank whose last
    line is a join: one that never joined is *late* (never dead), one that
    left is gone normally. ``<key>-count`` counts joins minus leaves: the rank
    that brings it back to 0 deletes the world's keys.

    Examples:
        >>> members_key(0)
        'hypergrid/live/0/members'
    """
    return f"{PREFIX}/{world}/members"


def member_status(data: bytes | None) -> dict[int, bool]:
    """rank -> whether it is in the watch now (its last line a join), from `members_key`'s value.

    Examples:
        >>> member_status(b" ".join([b"+0", b"+1", b"-1", b"+2"]))
        {0: True, 1: False, 2: True}
    """
    status: dict[int, bool] = {}
    for line in (data or b"").decode().split():
        status[int(line[1:])] = line[0] == "+"
    return status


def ended_key(world: int) -> str:
    """The record that world ``world`` ended, and who was left behind (JSON list): a key that stays.

    Written by the survivors before the end's call, deleted by the next shrink's
    commit or the destroy of the grid the shrink made: a rank stopped through
    the whole shrink reads it whenever it resumes, and fences itself.

    Examples:
        >>> ended_key(0)
        'hypergrid/live/0/ended'
    """
    return f"{PREFIX}/{world}/ended"


def done_key(world: int) -> str:
    """The number of world ``world``'s last incident that every live rank read (written by its last reader).

    A watcher woken without a call in its incident tells from it whether the
    others finished that incident without it (it is fenced) or a neighbour's
    close woke it (it waits again). One key per world, overwritten; deleted
    by the last reader of the world's end, or with the world's members when the
    last of them left (`members_key`).

    Examples:
        >>> done_key(0)
        'hypergrid/live/0/done'
    """
    return f"{PREFIX}/{world}/done"


def incident_prefix(world: int, number: int) -> str:
    """The key prefix of incident ``number`` of world ``world``.

    Examples:
        >>> incident_prefix(2, 0)
        'hypergrid/live/2/0'
    """
    return f"{PREFIX}/{world}/{number}"


def wake_key(world: int, number: int, rank: int) -> str:
    """The key ``rank``'s watcher in world ``world`` blocks on while it waits for incident ``number``.

    One key per `WAKE_BLOCK` consecutive ranks: a roll call writes N / 8 keys,
    not N, and a rank whose world closes wakes at most 7 other watchers (with a
    read of the absent key, which wakes its waiters and writes nothing). The key
    is the incident's: a watcher that read the verdict waits on the next
    incident's at once, which a call written meanwhile has set already. The
    block's lowest live rank deletes it once it read the verdict (every live
    rank of the block answered, so was woken, by then; a world's end is read
    without answers: its last reader deletes every block's), never before
    the caller's ``I/woken``: torch 2.13's server applies the first keys of a
    ``multi_set`` that reaches it in parts once per part (1 of 20 deletions made
    while a 1,024-key ``multi_set`` arrived was undone).

    Examples:
        >>> wake_key(0, 2, 3), wake_key(0, 2, 9)
        ('hypergrid/live/0/2/wake/0', 'hypergrid/live/0/2/wake/1')
    """
    return f"{incident_prefix(world, number)}/wake/{rank // WAKE_BLOCK}"


def wake_keys(world: int, number: int, ranks: Iterable[int]) -> list[str]:
    """The wake keys of ``ranks`` (sorted) in incident ``number``: one per block that holds any of them.

    Examples:
        >>> wake_keys(0, 1, [0, 3, 7, 8, 20])
        ['hypergrid/live/0/1/wake/0', 'hypergrid/live/0/1/wake/1', 'hypergrid/live/0/1/wake/2']
    """
    blocks = sorted({rank // WAKE_BLOCK for rank in ranks})
    return [f"{incident_prefix(world, number)}/wake/{block}" for block in blocks]
