"""What the consistency guard compares (`CreationRequest`), what it concludes (`Verdict`), and its words.

No store and no torch here: `hypergrid.agreement.protocol` runs the protocol and
`hypergrid.agreement.guard` decides who takes part.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import cached_property

from hypergrid.errors import DesyncError, GuardTimeoutError, OutOfStepError, RankFailure

__all__ = [
    "CreationRequest",
    "RECOVERY",
    "Verdict",
    "differences",
    "failure_verdict",
    "foreign_verdict",
    "mismatch_verdict",
    "timeout_verdict",
    "shown_ranks",
]

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
    errors: a new field with a default extends what must agree. ``settings``
    holds every constructor setting of the grid (built in one place,
    ``hypergrid.grid.batch``, from the constructor's signature, so a new
    setting takes part without being listed), ``views`` each registered view
    the creation enumerates (name, shape, dim order, shared dims), and
    ``reuses`` for each key the key whose group this rank would share, or
    ``""`` where it creates a new one (so a rank that released a group on its
    own cannot create while the others share).

    Examples:
        >>> request = CreationRequest("tp2 dp4", ("dp", "tp"), "enumerate", 0)
        >>> request.call(), len(request.digest)
        ("create_pgs(['dp', 'tp'])", 16)
        >>> CreationRequest.decode(request.encoded) == request
        True
        >>> request.describe(["strategy"])
        "create_pgs(['dp', 'tp']) on grid tp2 dp4 as its creation #0, strategy='enumerate'"
    """

    grid: str
    keys: tuple[str, ...]
    strategy: str
    grid_sequence: int
    held_groups: int | None = None
    options: tuple[tuple[str, str], ...] = ()
    grid_ordinal: int = 0
    epoch: int = 0
    settings: tuple[tuple[str, str], ...] = ()
    views: tuple[str, ...] = ()
    reuses: tuple[str, ...] = ()

    def call(self) -> str:
        """The creation as the user wrote it: ``create_pg('tp')`` or ``create_pgs(['tp', 'dp'])``."""
        if len(self.keys) == 1:
            return f"create_pg({self.keys[0]!r})"
        return f"create_pgs({list(self.keys)!r})"

    def position(self) -> str:
        """Where in its grid's life the request stands: the grid, its ordinal, epoch and creation number."""
        grid = self.grid if not self.grid_ordinal else f"{self.grid} (the #{self.grid_ordinal} grid of that shape)"
        after = f" after destroy #{self.epoch}" if self.epoch else ""
        return f"grid {grid} as its creation #{self.grid_sequence}{after}"

    def describe(self, fields: Iterable[str] = ()) -> str:
        """The request in words, for error messages, with the values of ``fields`` spelled out.

        ``fields`` are names as `differences` gives them: fields of the request,
        or option and setting names inside ``options`` and ``settings``.
        """
        text = f"{self.call()} on {self.position()}"
        options, settings = dict(self.options), dict(self.settings)
        for name in dict.fromkeys(fields):
            if name in ("keys", *_POSITION):
                continue  # already in the call and the position
            if name in options:
                text += f", {name}={options[name]}"
            if name in settings:  # a constructor setting; the grid's, where a call option has the same name
                text += f", {'grid ' if name in options else ''}{name}={settings[name]}"
            if name == "held_groups" and self.held_groups is not None:
                text += f", holding {self.held_groups} process groups"
            elif name not in options and name not in settings and hasattr(self, name) and name not in _PAIRED:
                text += f", {name}={getattr(self, name)!r}"
        return text

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
        for name in ("keys", "views", "reuses"):
            data[name] = tuple(data.get(name, ()))
        for name in _PAIRED:
            data[name] = tuple(tuple(pair) for pair in data.get(name, ()))
        return cls(**data)


#: Fields that hold (name, value) pairs: a difference is named by the pair's name.
_PAIRED = ("options", "settings")


def differences(requests: Sequence[CreationRequest]) -> list[str]:
    """The names in which ``requests`` differ: fields, and inside ``options``/``settings`` the option names.

    Examples:
        >>> a = CreationRequest("g", ("tp",), "enumerate", 0, settings=(("share_groups", "True"),))
        >>> differences([a, dataclasses.replace(a, strategy="local", settings=(("share_groups", "False"),))])
        ['strategy', 'share_groups']
    """
    names: list[str] = []
    for item in dataclasses.fields(CreationRequest):
        values = [getattr(request, item.name) for request in requests]
        if len(set(values)) < 2:
            continue
        if item.name not in _PAIRED:
            names.append(item.name)
            continue
        mappings = [dict(value) for value in values]
        for key in sorted({key for mapping in mappings for key in mapping}):
            if len({mapping.get(key) for mapping in mappings}) > 1 and key not in names:
                names.append(key)
    return names


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
    """The outcome of a guard round, the same on every participant.

    ``kind`` is ``ok``, ``mismatch`` (same point, different requests),
    ``outofstep`` (ranks at different points of a grid's creation sequence),
    ``timeout`` (some participants never arrived, or stopped before deciding)
    or ``failure`` (the world failed meanwhile: its roll call named the dead).
    ``about`` holds the digests of the requests it was decided on: a rank that
    reads it with another request of its own is out of step instead.
    """

    kind: str
    message: str = ""
    requests: dict[str, Runs] = field(default_factory=dict)  # each request in words -> its ranks
    missing: Runs = field(default_factory=list)  # timeout: the ranks that did not arrive
    dead: Runs = field(default_factory=list)  # timeout: the ranks that answered no roll call
    about: list[str] = field(default_factory=list)  # digests of the requests it was decided about
    epoch: int = 0  # the latest epoch among those requests

    def encode(self) -> str:
        return "ok" if self.kind == "ok" else json.dumps(dataclasses.asdict(self))

    @classmethod
    def decode(cls, data: bytes) -> Verdict:
        return cls("ok") if data == b"ok" else cls(**json.loads(data))

    def raise_if_failed(self) -> None:
        """Raise the error this verdict stands for (nothing for ``ok``).

        Raises:
            DesyncError: the participants asked for different things.
            OutOfStepError: (a ``DesyncError``) participants are at different creations.
            GuardTimeoutError: (a ``RankFailure``) some participants did not arrive or stopped in time.
            RankFailure: the world failed during the round.
        """
        if self.kind == "failure":
            raise RankFailure(self.message, _expand(self.dead))
        requests = {text: _expand(runs) for text, runs in self.requests.items()}
        if self.kind == "mismatch":
            raise DesyncError(self.message, requests=requests, epoch=self.epoch)
        if self.kind == "outofstep":
            raise OutOfStepError(self.message, requests=requests, epoch=self.epoch)
        if self.kind == "timeout":
            missing, dead = _expand(self.missing), _expand(self.dead)
            raise GuardTimeoutError(self.message, missing=missing, dead=dead, epoch=self.epoch)


#: The fields that say where in its grid's creation sequence a request stands.
_POSITION = ("grid", "grid_ordinal", "epoch", "grid_sequence")

#: How to get back in step, in every out-of-step message.
RECOVERY = (
    "A rank skipped or repeated a creation, or created on another grid first. To go on, call "
    "grid.destroy() on every rank of the grid, then create again (docs/reliability.md)."
)


def failure_verdict(message: str, dead: Iterable[int]) -> Verdict:
    """The verdict of a round that the world's failure ended (``dead``: the ranks its roll call found dead).

    Examples:
        >>> verdict = failure_verdict("creating 'dp' failed: rank 3 stopped answering", [3])
        >>> Verdict.decode(verdict.encode().encode()) == verdict, verdict.dead
        (True, [[3, 3]])
    """
    return Verdict("failure", message, dead=_runs(sorted(dead))[:_STORED_RUNS])


def _missing_spares(request: CreationRequest, participants: int, missing: list[int]) -> list[int]:
    """The missing ranks that are the grid's spares (the world's last ``spares`` ranks), where every rank of the
    world takes part (not ``"local"``).

    Examples:
        >>> request = CreationRequest("tp2 dp2", ("dp",), "enumerate", 0, settings=(("spares", "2"),))
        >>> _missing_spares(request, 6, [3, 4, 5])
        [4, 5]
    """
    spares = dict(request.settings).get("spares", "0")
    count = int(spares) if request.strategy != "local" and spares.isdigit() else 0
    return [rank for rank in missing if rank >= participants - count] if count else []


def timeout_verdict(
    request: CreationRequest,
    participants: int,
    missing: list[int],
    timeout_s: float,
    dead: Iterable[int] = (),
    last_seen: dict[int, str] | None = None,
    answering: Iterable[int] | None = None,
) -> Verdict:
    """The verdict when ``missing`` did not arrive within ``timeout_s`` (quoted exactly).

    ``dead``: participants that arrived but answered no roll call afterwards;
    ``last_seen``: for some missing ranks, the last creation they took part in;
    ``answering``: where the world's roll call ran, the ranks it did not find
    dead (their watchers answer: alive, elsewhere): they are never named dead.
    """
    what = f"{request.call()} on grid {request.grid}"
    dead = sorted(dead)
    if missing:
        message = (
            f"rank(s) {shown_ranks(missing)} of the {participants} ranks that must create {what} did not "
            f"arrive within {timeout_s:g} s: dead, hung, or creating something else "
            f"({participants - len(missing)} arrived)"
        )
        for rank, text in sorted((last_seen or {}).items())[:SHOWN]:
            message += f"; rank {rank} last took part in {text}"
        spares = _missing_spares(request, participants, missing)
        if spares:
            message += (
                f"; rank(s) {shown_ranks(spares)} are the grid's spares: every rank of the world, spares included, "
                "creates every family (a spare calls the same create_pg/create_pgs, then standby)"
            )
    elif dead:
        message = (
            f"all {participants} ranks that must create {what} arrived, but no verdict came within "
            f"{timeout_s:g} s: rank(s) {shown_ranks(dead)} stopped answering after arriving (dead or hung; "
            "the last to arrive decides)"
        )
    else:
        message = (
            f"all {participants} ranks that must create {what} arrived, but no verdict came within "
            f"{timeout_s:g} s: the rank that arrived last stopped before deciding (dead or hung)"
        )
    unreachable = sorted((set(missing) | set(dead)) - set(answering or ()))
    alive = sorted(set(missing) & set(answering or ()))
    if alive:
        message += f"; rank(s) {shown_ranks(alive)} still answer the world's roll call (alive, busy elsewhere)"
    return Verdict(
        "timeout",
        message,
        missing=_runs(missing)[:_STORED_RUNS],
        dead=_runs(unreachable)[:_STORED_RUNS],
        about=[request.digest],
        epoch=request.epoch,
    )


def mismatch_verdict(participants: int, digests: dict[int, str], encoded: dict[str, str]) -> Verdict:
    """The verdict when ranks sent different requests, or stand at different points (out of step).

    Args:
        participants: how many ranks take part.
        digests: each rank's request digest.
        encoded: each digest's request, as `CreationRequest.encoded`.
            Ranks found stuck in another round of the guard are listed with the
            request they announced there.

    Returns:
        An ``outofstep`` verdict when the requests differ in where they stand
        (grid, its ordinal, epoch or creation number), else a ``mismatch``.
    """
    by_digest: dict[str, list[int]] = {}
    for rank, digest in digests.items():
        by_digest.setdefault(digest, []).append(rank)
    groups = sorted(by_digest.items(), key=lambda item: min(item[1]))
    requests = {digest: CreationRequest.decode(encoded[digest]) for digest, _ in groups if digest in encoded}
    differ = differences(list(requests.values()))
    texts = {
        digest: requests[digest].describe(differ) if digest in requests else f"a request not recorded (digest {digest})"
        for digest, _ in groups
    }
    kind = "outofstep" if any(name in differ for name in _POSITION) else "mismatch"
    head = "ranks are out of step on" if kind == "outofstep" else "ranks disagree on"
    lines = [f"{head} a collective group creation ({participants} ranks take part; none waited in torch):"]
    for digest, ranks in groups[:SHOWN]:
        lines.append(f"  rank(s) {shown_ranks(ranks)} asked for {texts[digest]}")
    if len(groups) > SHOWN:
        lines.append(f"  ... and {len(groups) - SHOWN} more distinct requests")
    lines += _hints(list(requests.values()), differ)
    if kind == "outofstep":
        lines.append(RECOVERY)
    runs = {texts[digest]: _runs(ranks)[:_STORED_RUNS] for digest, ranks in groups}
    epoch = max((request.epoch for request in requests.values()), default=0)
    return Verdict(kind, "\n".join(lines), requests=runs, about=sorted(by_digest), epoch=epoch)


def foreign_verdict(request: CreationRequest, rank: int, verdict: Verdict) -> Verdict:
    """What a rank that reads a verdict decided about another request raises: it is out of step.

    A late rank must never be told about a request it did not make; it gets its
    own request, and the other participants' verdict as the reason.
    """
    message = (
        f"rank {rank} asked for {request.describe()}, but the other participants of that step had "
        f"already ended it without this rank:\n  {verdict.message}"
    )
    if not message.endswith(RECOVERY):
        message += f"\n{RECOVERY}"
    epoch = max(request.epoch, verdict.epoch)
    return Verdict("outofstep", message, requests={request.describe(): [[rank, rank]]}, epoch=epoch)


def _hints(requests: list[CreationRequest], differ: list[str]) -> list[str]:
    """What the distinct requests differ in, and advice for the one torch trap that reveals."""
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
    if "reuses" in differ:
        lines.append(
            "Some ranks would share a group they still hold while others would create a new one (a group "
            "released by destroy() on some ranks only): call destroy() on every rank of the grid."
        )
    return lines
