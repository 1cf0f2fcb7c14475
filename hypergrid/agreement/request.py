"""What the consistency guard compares (`CreationRequest`), what it concludes (`Verdict`), and its words.

No store and no torch here: `hypergrid.agreement.protocol` runs the protocol and
`hypergrid.agreement.guard` decides who takes part.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import cached_property

from hypergrid.errors import DesyncError, GuardTimeoutError

__all__ = ["CreationRequest", "Verdict", "mismatch_verdict", "timeout_verdict", "shown_ranks"]

#: Runs of consecutive ranks a message lists per request, and distinct requests it lists, before "... and N more".
SHOWN = 20
#: Runs of ranks a verdict carries for the error's attributes: every participant reads the verdict,
#: so its size must not grow with the world.
_STORED_RUNS = 1000

Runs = list[list[int]]  # [[first, last], ...] runs of consecutive ranks


@dataclass(frozen=True)
class CreationRequest:
    """What one rank is about to create; equal on every participant, or the guard refuses.

    Every field is compared (through the digest of ``encoded``) and described in
    errors: a new field with a default extends what must agree.

    Examples:
        >>> request = CreationRequest("tp2 dp4", ("dp", "tp"), "enumerate", 0)
        >>> request.call(), len(request.digest)
        ("create_pgs(['dp', 'tp'])", 16)
        >>> CreationRequest.decode(request.encoded) == request
        True
    """

    grid: str
    keys: tuple[str, ...]
    strategy: str
    grid_sequence: int
    held_groups: int | None = None
    options: tuple[tuple[str, str], ...] = ()

    def call(self) -> str:
        """The creation as the user wrote it: ``create_pg('tp')`` or ``create_pgs(['tp', 'dp'])``."""
        if len(self.keys) == 1:
            return f"create_pg({self.keys[0]!r})"
        return f"create_pgs({list(self.keys)!r})"

    def describe(self) -> str:
        """The whole request in words, for error messages."""
        text = f"{self.call()} on grid {self.grid} as its creation #{self.grid_sequence}, strategy {self.strategy!r}"
        if self.held_groups is not None:
            text += f", holding {self.held_groups} process groups"
        return text + "".join(f", {name}={value}" for name, value in self.options)

    @cached_property
    def encoded(self) -> str:
        """The request as one line of JSON (equal requests give equal text)."""
        return json.dumps(dataclasses.asdict(self), sort_keys=True)

    @cached_property
    def digest(self) -> str:
        """A short hash of ``encoded``: the key under which agreeing ranks count."""
        return hashlib.sha1(self.encoded.encode(), usedforsecurity=False).hexdigest()[:16]

    @classmethod
    def decode(cls, text: str) -> CreationRequest:
        """The request ``encoded`` came from."""
        data = json.loads(text)
        data["keys"] = tuple(data["keys"])
        data["options"] = tuple(tuple(pair) for pair in data.get("options", ()))
        return cls(**data)


def _runs(ranks: Iterable[int]) -> Runs:
    runs: Runs = []
    for rank in sorted(set(ranks)):
        if runs and rank == runs[-1][1] + 1:
            runs[-1][1] = rank
        else:
            runs.append([rank, rank])
    return runs


def _expand(runs: Runs) -> list[int]:
    return [rank for first, last in runs for rank in range(first, last + 1)]


def shown_ranks(ranks: Iterable[int], limit: int = SHOWN) -> str:
    """Ranks for a message: runs of consecutive ranks, at most ``limit`` of them, then how many more.

    Examples:
        >>> shown_ranks([5, 0, 1, 2])
        '0-2,5'
        >>> shown_ranks(range(0, 10, 2), limit=2)
        '0,2 ... and 3 more'
    """
    runs = _runs(ranks)
    text = ",".join(str(first) if first == last else f"{first}-{last}" for first, last in runs[:limit])
    hidden = sum(last - first + 1 for first, last in runs[limit:])
    return f"{text} ... and {hidden} more" if hidden else text


@dataclass(frozen=True)
class Verdict:
    """The outcome of a guard round, the same on every participant: ``ok``, ``mismatch`` or ``timeout``."""

    kind: str
    message: str = ""
    requests: dict[str, Runs] = field(default_factory=dict)  # mismatch: each request in words -> its ranks
    missing: Runs = field(default_factory=list)  # timeout: the ranks that did not arrive

    def encode(self) -> str:
        return "ok" if self.kind == "ok" else json.dumps(dataclasses.asdict(self))

    @classmethod
    def decode(cls, data: bytes) -> Verdict:
        return cls("ok") if data == b"ok" else cls(**json.loads(data))

    def raise_if_failed(self) -> None:
        """Raise the error this verdict stands for (nothing for ``ok``).

        Raises:
            DesyncError: the participants asked for different things.
            GuardTimeoutError: some participants did not arrive in time.
        """
        if self.kind == "mismatch":
            raise DesyncError(self.message, requests={text: _expand(runs) for text, runs in self.requests.items()})
        if self.kind == "timeout":
            raise GuardTimeoutError(self.message, missing=_expand(self.missing))


def timeout_verdict(request: CreationRequest, participants: int, missing: list[int], timeout_s: float) -> Verdict:
    """The verdict when ``missing`` did not arrive within ``timeout_s`` (quoted exactly)."""
    what = f"{request.call()} on grid {request.grid}"
    if missing:
        message = (
            f"rank(s) {shown_ranks(missing)} of the {participants} ranks that must create {what} did not "
            f"arrive within {timeout_s:g} s: dead, hung, or creating something else "
            f"({participants - len(missing)} arrived)"
        )
    else:
        message = (
            f"all {participants} ranks that must create {what} arrived, but no verdict came within "
            f"{timeout_s:g} s: the rank that arrived last stopped before deciding (dead or hung)"
        )
    return Verdict("timeout", message, missing=_runs(missing)[:_STORED_RUNS])


def mismatch_verdict(participants: int, digests: dict[int, str], encoded: dict[str, str]) -> Verdict:
    """The verdict when ranks sent different requests.

    Args:
        participants: how many ranks take part.
        digests: each rank's request digest.
        encoded: each digest's request, as `CreationRequest.encoded`.
    """
    by_digest: dict[str, list[int]] = {}
    for rank, digest in digests.items():
        by_digest.setdefault(digest, []).append(rank)
    groups = sorted(by_digest.items(), key=lambda item: min(item[1]))
    requests = {digest: CreationRequest.decode(encoded[digest]) for digest, _ in groups if digest in encoded}
    texts = {
        digest: requests[digest].describe() if digest in requests else f"a request not recorded (digest {digest})"
        for digest, _ in groups
    }
    lines = [f"ranks disagree on a collective group creation ({participants} ranks take part; none waited in torch):"]
    lines += [f"  rank(s) {shown_ranks(ranks)} asked for {texts[digest]}" for digest, ranks in groups[:SHOWN]]
    if len(groups) > SHOWN:
        lines.append(f"  ... and {len(groups) - SHOWN} more distinct requests")
    lines += _hints(list(requests.values()))
    runs = {texts[digest]: _runs(ranks)[:_STORED_RUNS] for digest, ranks in groups}
    return Verdict("mismatch", "\n".join(lines), requests=runs)


def _hints(requests: list[CreationRequest]) -> list[str]:
    """What the distinct requests differ in, and advice for the one torch trap that reveals."""
    names = [item.name for item in dataclasses.fields(CreationRequest)]
    differ = [name for name in names if len({getattr(request, name) for request in requests}) > 1]
    if not differ:
        return []
    lines = [f"They differ in: {', '.join(differ)}."]
    if differ == ["held_groups"]:
        lines.append(
            "They agree on the family but hold different numbers of process groups: torch names a "
            "members-only group (use_local_synchronization=True) from that count, so they would wait on "
            "different keys and hang. Create 'local' families before groups that only some ranks hold, "
            "or use strategy='enumerate' for this family."
        )
    return lines
