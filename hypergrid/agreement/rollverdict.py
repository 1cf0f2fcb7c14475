"""What a roll call (`hypergrid.agreement.liveness`) decides: its `Verdict`, and the majority rule behind it.

A verdict is published once per incident (one ``compare_set`` of ``I/verdict``, as JSON) and read by every
live rank: which expected ranks did not answer in time, or that the ranks that answered are the smaller side.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["FAILURE", "PROBE", "Verdict", "majority"]

#: The incident kinds a caller can open.
FAILURE, PROBE = "failure", "probe"


def majority(alive: Sequence[int], expected: Sequence[int]) -> bool:
    """Whether ``alive`` may declare the rest of ``expected`` dead: more than half, or half with the lowest rank.

    Examples:
        >>> majority([0, 1, 2], [0, 1, 2, 3]), majority([0, 1], [0, 1, 2, 3]), majority([2, 3], [0, 1, 2, 3])
        (True, True, False)
        >>> majority([7], range(8))
        False
    """
    alive_set = set(alive)
    if 2 * len(alive_set) > len(expected):
        return True
    return 2 * len(alive_set) == len(expected) and len(expected) > 0 and min(expected) in alive_set


@dataclass(frozen=True)
class Verdict:
    """How an incident ended.

    Attributes:
        kind: ``"failure"`` or ``"probe"`` (what was called), or ``"minority"``: the ranks that answered
            are the smaller side and are excluded.
        dead: the expected ranks that did not answer in time (sorted); empty for a minority.
        text: what the caller said.
        alive: for a minority, the ranks that answered (they fence themselves).
        absent: expected ranks that did not answer and are not dead: *late* ones (they never joined the world's
            watch: `hypergrid.agreement.rollkeys.members_key`) and those that left it; they do not read the verdict.
        readers: how many ranks read the verdict (those that answered in time); None: every expected rank not dead.
    """

    kind: str
    dead: tuple[int, ...] = ()
    text: str = ""
    alive: tuple[int, ...] = ()
    absent: tuple[int, ...] = ()
    readers: int | None = None

    @property
    def failed(self) -> bool:
        """The world's collectives must end: a failure was reported, or a probe found dead ranks."""
        return self.kind == FAILURE or bool(self.dead)

    def excludes(self, rank: int) -> bool:
        """Whether ``rank`` is out: declared dead, or on the minority side."""
        return rank in self.dead or (self.kind == "minority" and rank in self.alive)

    def encode(self) -> str:
        fields = {"kind": self.kind, "dead": list(self.dead), "text": self.text, "alive": list(self.alive)}
        return json.dumps({**fields, "absent": list(self.absent), "readers": self.readers})

    @classmethod
    def decode(cls, data: bytes) -> Verdict:
        f = json.loads(data)
        return cls(f["kind"], tuple(f["dead"]), f["text"], tuple(f["alive"]), tuple(f["absent"]), f["readers"])
