"""Where the roll call (`hypergrid.agreement.liveness`) keeps its state in the store: the key of each thing.

Keys of world ``w`` live under ``hypergrid/live/<w>`` (`PREFIX`), those of its incident ``k`` under
`incident_prefix` (``hypergrid/live/<w>/<k>``); the table of every key is in docs/design/rollcall.md
("Keys and costs").
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
    "gone_of",
    "gone_text",
    "incident_prefix",
    "member_status",
    "members_key",
    "said_of",
    "wake_key",
    "wake_keys",
]

PREFIX = "hypergrid/live"

#: Consecutive ranks whose watchers share one wake key: a node's GPUs in torchrun's numbering (a roll call writes one
#: key per block; a closing world's watcher wakes its block's others, `hypergrid.agreement.watcher.Watcher.halt`).
WAKE_BLOCK = 8

#: What starts a call's text that declares ranks dead (`gone_text`).
GONE = "[gone "

#: The call that ends a world (its ranks moved to the next one): ``end [dead, readers]``.
END = "end "


def end_text(dead: Sequence[int], world_size: int, caller: int | None = None) -> str:
    """The call that ends a world of ``world_size`` ranks whose ``dead`` were left behind.

    Every other rank's watcher reads it once (the last deletes it); a rank it names fences itself. ``caller`` makes each
    survivor's end differ: only the one whose end opened the incident wakes the watchers (a second wake would stay).

    Examples:
        >>> end_text([3], 8), end_text([3], 8, caller=0)
        ('end [[3], 7]', 'end [[3], 7, 0]')
    """
    return END + json.dumps([sorted(dead), world_size - len(set(dead)), *([] if caller is None else [caller])])


def gone_text(gone: Sequence[int], text: str) -> str:
    """A call's text that declares ``gone`` dead: ranks whose process a launcher's agent saw exit (`gone_of`).

    Examples:
        >>> gone_text([3, 5], "rank 3 died"), gone_of("failure " + gone_text([3], "x")), gone_of("failure x")
        ('[gone 3,5] rank 3 died', (3,), ())
    """
    return f"{GONE}{','.join(str(rank) for rank in sorted(gone))}] {text}"


def gone_of(call: str) -> tuple[int, ...]:
    """The ranks a call (``kind text``) declares dead (`gone_text`); () for a call that declares none."""
    text = call.partition(" ")[2]
    if not text.startswith(GONE):
        return ()
    listed = text[len(GONE) :].partition("]")[0]
    return tuple(int(rank) for rank in listed.split(",") if rank)


def said_of(text: str) -> str:
    """A call's text without its declaration of the dead (`gone_text`): what the verdict says.

    Examples:
        >>> said_of(gone_text([2, 3], "ranks 2-3 died")), said_of("rank 1 raised")
        ('ranks 2-3 died', 'rank 1 raised')
    """
    return text[len(GONE) :].partition("] ")[2] if text.startswith(GONE) else text


def members_key(world: int) -> str:
    """The key that says who joined world ``world``'s watch (``+<rank>`` lines) and who left it (``-<rank>``).

    A rank joins when it first holds a grid of the world and leaves when its world closes; it may join again.
    ``<key>-count`` counts joins minus leaves: the rank that brings it back to 0 deletes the world's keys. Who a
    roll call names dead, late or gone: docs/design/rollcall.md ("Joining, and late ranks").

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

    Written by the survivors before the end's call, deleted by the next shrink's commit or the destroy of the grid
    the shrink made: a rank stopped through the whole shrink reads it whenever it resumes, and fences itself.

    Examples:
        >>> ended_key(0)
        'hypergrid/live/0/ended'
    """
    return f"{PREFIX}/{world}/ended"


def done_key(world: int) -> str:
    """The number of world ``world``'s last incident that every live rank read (written by its last reader).

    A watcher woken without a call tells from it whether the others finished that incident without it (it is
    fenced) or a neighbour's close woke it (it waits again). One key per world, overwritten; deleted by the last
    reader of the world's end, or with the world's members when the last of them left (`members_key`).

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

    One key per `WAKE_BLOCK` consecutive ranks, and the incident's: a watcher that read the verdict waits on the next
    incident's at once. The block's lowest live rank deletes it once it read the verdict (a world's end: its last
    reader deletes every block's), never before the caller's ``I/woken`` (docs/design/rollcall.md, "Problems
    found on the way").

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
