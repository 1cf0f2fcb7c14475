"""Where the ranks really are: real hosts against the assumed node blocks and a topology's tiers.

Pure: numpy and the standard library only, no torch. ``build_report`` takes what a
collective gathered (every rank's hostname and ``LOCAL_RANK``) and the families'
groups; every rank computes the same report. An *assumed node* is a block of
``ranks_per_node`` consecutive global ranks; a unit of tier ``k`` of a `Topology`
is a block of ``unit_ranks[k]`` consecutive ranks.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields
from typing import Any

import numpy as np
import numpy.typing as npt

from hypergrid.cluster.tiers import Topology
from hypergrid.errors import InvalidArgumentError
from hypergrid.values import shown

__all__ = ["FamilyPlacement", "PlacementReport", "build_report"]

_SHOWN = 3  # items named in a problem line before "... and N more"


def _plural(count: int, word: str) -> str:
    return f"{count} {word}{'' if count == 1 else 's'}"


def _ranks_text(ranks: npt.ArrayLike, runs_shown: int = 4) -> str:
    """``"ranks 0-3, 8, ... and 5 more"``: sorted runs of consecutive ranks, the first few."""
    values = np.unique(np.asarray(ranks, dtype=np.int64))
    starts = np.flatnonzero(np.diff(values, prepend=values[0] - 2) != 1)
    ends = np.append(starts[1:], values.size) - 1
    parts = [f"{values[a]}" if a == b else f"{values[a]}-{values[b]}" for a, b in zip(starts[:runs_shown], ends)]
    rest = int(values.size - ends[min(runs_shown, starts.size) - 1] - 1)
    return ("rank " if values.size == 1 else "ranks ") + ", ".join(parts) + (f", ... and {rest} more" if rest else "")


def _some(items: Sequence[str], total: int, what: str) -> str:
    """The first few ``items`` (of ``total``) joined by ``"; "``, then ``"... and N more <what>s"``."""
    more = total - min(len(items), _SHOWN)
    return "; ".join(items[:_SHOWN]) + (f"; ... and {more} more {what}{'s' if more > 1 else ''}" if more > 0 else "")


def _as_int(value: object) -> int | None:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        return None
    return int(value)


@dataclass(frozen=True)
class FamilyPlacement:
    """How the groups of one family sit on the real hosts (and, with a topology, which tier it is priced on).

    Attributes:
        key: the family's registry key (``"dp-tp"``).
        group_size: ranks per group.
        num_groups: groups in the family.
        min_hosts: the fewest distinct hosts one group touches.
        max_hosts: the most distinct hosts one group touches.
        groups_inside_one_host: how many groups lie on one host.
        tier: the tier the planner prices the family on, by the topology's assumed units
            (``None`` without a topology and for single-rank groups).
        line: one readable line saying the above.

    Examples:
        >>> tp = np.arange(8).reshape(2, 4)
        >>> build_report(["a"] * 4 + ["b"] * 4, [None] * 8, [("tp", tp), ("dp", tp.T)], 4).families[1].line
        'dp: 4 groups of 2 ranks, each across 2 hosts'
    """

    key: str
    group_size: int
    num_groups: int
    min_hosts: int
    max_hosts: int
    groups_inside_one_host: int
    tier: str | None
    line: str

    @property
    def groups_crossing_hosts(self) -> int:
        """How many groups touch two hosts or more."""
        return self.num_groups - self.groups_inside_one_host

    def to_dict(self) -> dict[str, Any]:
        """Plain data (for JSON output)."""
        return asdict(self)


@dataclass(frozen=True)
class PlacementReport:
    """Real hosts against the assumed node blocks, and where each family's groups sit.

    Attributes:
        hosts: ``(hostname, ranks)`` per host, in the order of each host's first rank.
        ranks_per_node: the assumed node size (``None``: not known, no block check).
        ranks_per_host: ranks on every host when all hosts hold the same number of
            consecutive ranks, else ``None``.
        node_blocks_match: whether node blocks were assumed and the real hosts and
            ``LOCAL_RANK`` agree with them (``False`` when nothing was assumed).
        problems: one line per kind of mismatch with the assumed node blocks.
        families: one `FamilyPlacement` per family, in the order given.
        warnings: the problems, then what the real hosts contradict in the pricing.
        notes: what could not be checked.
        topology: the topology's tier names, innermost first, or ``None``.

    Examples:
        >>> report = build_report(["a", "a", "b", "b"], [0, 1, 0, 1], [("tp", [[0, 1], [2, 3]])], 2)
        >>> report.node_blocks_match, report.ranks_per_host, report.to_dict()["hosts"][1]
        (True, 2, {'host': 'b', 'ranks': [2, 3]})
    """

    hosts: tuple[tuple[str, tuple[int, ...]], ...]
    ranks_per_node: int | None
    ranks_per_host: int | None
    node_blocks_match: bool
    problems: tuple[str, ...]
    families: tuple[FamilyPlacement, ...]
    warnings: tuple[str, ...]
    notes: tuple[str, ...]
    topology: tuple[str, ...] | None

    @property
    def world_size(self) -> int:
        """Ranks in the world (every rank is on one host)."""
        return sum(len(ranks) for _, ranks in self.hosts)

    def __str__(self) -> str:
        per_host = f" ({self.ranks_per_host} ranks per host)" if self.ranks_per_host is not None else ""
        head = f"placement: {self.world_size} ranks on {_plural(len(self.hosts), 'host')}{per_host}; "
        if self.ranks_per_node is None:
            head += "node size not assumed"
        else:
            verdict = "match" if self.node_blocks_match else "mismatch"
            head += f"assumed {self.ranks_per_node} ranks per node: {verdict}"
        if self.topology is not None:
            head += f"; topology tiers {', '.join(map(repr, self.topology))}"
        lines = [head]
        lines += [f"  host {shown(name)}: {_ranks_text(ranks)}" for name, ranks in self.hosts[:8]]
        if len(self.hosts) > 8:
            lines.append(f"  ... and {len(self.hosts) - 8} more host{'s' if len(self.hosts) > 9 else ''}")
        lines += [f"  {family.line}" for family in self.families]
        lines += [f"warning: {text}" for text in self.warnings] + [f"note: {text}" for text in self.notes]
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        """Plain data (for JSON output): hosts as ``{"host": name, "ranks": [...]}``, tuples as lists."""
        data = {field.name: getattr(self, field.name) for field in fields(self)}
        data["hosts"] = [{"host": name, "ranks": list(ranks)} for name, ranks in self.hosts]
        data["families"] = [family.to_dict() for family in self.families]
        return {"world_size": self.world_size, **{k: list(v) if isinstance(v, tuple) else v for k, v in data.items()}}


def _distinct(keys: np.ndarray, values: np.ndarray) -> np.ndarray:
    """For each key ``0..keys.max()``: how many distinct values it goes with (one sort, O(n log n))."""
    width = int(values.max()) + 1
    return np.bincount(np.unique(keys * width + values) // width)


def _check_blocks(host_ids: np.ndarray, names: list[str], local: Sequence[int | None], per_node: int) -> list[str]:
    """One problem line per kind of disagreement between the assumed node blocks and the real hosts."""
    ranks = np.arange(host_ids.size)
    blocks, problems = ranks // min(per_node, host_ids.size), []
    split = np.flatnonzero(_distinct(blocks, host_ids) > 1)
    if split.size:
        items = [
            f"assumed node {b} ({_ranks_text(ranks[blocks == b])}) is on hosts "
            + ", ".join(repr(names[h]) for h in np.unique(host_ids[blocks == b]))
            for b in split[:_SHOWN]
        ]
        problems.append(f"assumed {per_node} ranks per node, but {_some(items, split.size, 'assumed node')}")
    nodes = _distinct(host_ids, blocks)
    shared = np.flatnonzero(nodes > 1)
    if shared.size:
        items = [
            f"host {shown(names[h])} holds {_ranks_text(ranks[host_ids == h])} ({nodes[h]} assumed nodes)"
            for h in shared[:_SHOWN]
        ]
        problems.append(f"assumed {per_node} ranks per node, but {_some(items, shared.size, 'host')}")
    wrong = [r for r, value in enumerate(local) if value is not None and value != r % per_node]
    if wrong:
        items = [f"rank {r} on host {names[host_ids[r]]!r} has {local[r]}, expected {r % per_node}" for r in wrong]
        text = _some(items[:_SHOWN], len(wrong), "rank")
        problems.append(f"LOCAL_RANK is not rank % {per_node} on {_plural(len(wrong), 'rank')}: {text}")
    return problems


def _validate(
    hosts: Sequence[str], local_ranks: Sequence[int | None], families: object, ranks_per_node: object, topology: object
) -> tuple[int | None, list[tuple[str, np.ndarray]]]:
    """The node size as an int (or None) and each family's groups as an int64 array; raise on bad input."""
    if isinstance(hosts, str) or not isinstance(hosts, Sequence) or not hosts:
        raise InvalidArgumentError(f"hosts must be a non-empty list of hostnames, one per rank, got {shown(hosts)}")
    if isinstance(local_ranks, str) or not isinstance(local_ranks, Sequence) or len(local_ranks) != len(hosts):
        raise InvalidArgumentError(
            f"local_ranks must hold one LOCAL_RANK (or None) per host ({len(hosts)}), got {shown(local_ranks)}"
        )
    for rank, (host, local) in enumerate(zip(hosts, local_ranks)):
        if not isinstance(host, str):
            raise InvalidArgumentError(f"hosts[{rank}] must be a str (a hostname), got {shown(host)}")
        if local is not None and _as_int(local) is None:
            raise InvalidArgumentError(f"local_ranks[{rank}] must be an int or None, got {shown(local)}")
    per_node = _as_int(ranks_per_node)
    if ranks_per_node is not None and (per_node is None or per_node < 1):
        raise InvalidArgumentError(f"ranks_per_node must be a positive int or None, got {shown(ranks_per_node)}")
    if topology is not None and not isinstance(topology, Topology):
        raise InvalidArgumentError(f"topology must be a Topology or None, got {shown(topology)}")
    if isinstance(families, str) or not isinstance(families, Sequence):
        raise InvalidArgumentError(f"families must be a list of (key, groups), got {shown(families)}")
    arrays = []
    for family in families:
        key, groups = family if isinstance(family, tuple) and len(family) == 2 else (None, None)
        if not isinstance(key, str):
            raise InvalidArgumentError(f"each family must be a (str key, groups) pair, got {shown(family)}")
        try:
            array = np.asarray(groups) if isinstance(groups, (np.ndarray, list, tuple)) else np.empty(0)
        except ValueError:  # ragged lists
            array = np.empty(0)
        if array.ndim != 2 or array.size == 0 or array.dtype.kind not in "iu":
            raise InvalidArgumentError(
                f"family {shown(key)}: groups must be a non-empty 2-D int array, got {shown(groups)}"
            )
        bad = array[(array < 0) | (array >= len(hosts))]
        if bad.size:
            raise InvalidArgumentError(f"family {shown(key)}: rank {bad[0]} is outside the world of {len(hosts)} ranks")
        arrays.append((key, array.astype(np.int64)))
    return per_node, arrays


def _spread(ids: np.ndarray) -> npt.NDArray[np.int64]:
    """Distinct values per row (sort, count changes)."""
    return np.asarray(1 + (np.diff(np.sort(ids, axis=1), axis=1) != 0).sum(axis=1), dtype=np.int64)


def _line(key: str, size: int, spread: np.ndarray, tier: str | None) -> str:
    """``"dp: 4 groups of 2 ranks, 3 of them across 2 to 4 hosts; priced on tier 'ib'"``."""
    count, crossing = spread.size, spread[spread > 1]
    text = f"{key}: {_plural(count, 'group')} of {_plural(size, 'rank')}, "
    lead = "" if count == 1 else "each " if crossing.size in (0, count) else f"{crossing.size} of them "
    if not crossing.size:
        text += f"{lead}inside one host"
    else:
        low, high = int(crossing.min()), int(crossing.max())
        text += f"{lead}across {low} hosts" if low == high else f"{lead}across {low} to {high} hosts"
    return text + (f"; priced on tier {shown(tier)}" if tier is not None else "")


def build_report(
    hosts: Sequence[str],
    local_ranks: Sequence[int | None],
    families: Sequence[tuple[str, npt.ArrayLike]],
    ranks_per_node: int | None,
    topology: Topology | None = None,
) -> PlacementReport:
    """Check the assumed node blocks against the real hosts, and place each family's groups on them.

    Args:
        hosts: the hostname of every global rank ``0..world-1``.
        local_ranks: the ``LOCAL_RANK`` of every rank (``None``: unset or unparsable).
        families: ``(key, groups)`` per family: ``groups`` an int array
            ``[num_groups, group_size]`` of global ranks below ``len(hosts)``.
        ranks_per_node: the assumed node size (``None``: not known, no block check).
        topology: the topology the layout was priced on, to name each family's tier
            and check it against the hosts.

    Returns:
        A `PlacementReport` (``str()`` reads as a report, ``to_dict()`` is plain data).

    Raises:
        InvalidArgumentError: ``hosts`` empty, ``local_ranks`` of another length, a
            ``ranks_per_node`` that is not a positive int, a family rank out of range,
            a ``topology`` that is not a `Topology`.

    Examples:
        >>> tp = np.arange(16).reshape(4, 4)  # tp=4 x dp=4, 8 ranks per host
        >>> print(build_report(["a"] * 8 + ["b"] * 8, list(range(8)) * 2, [("tp", tp), ("dp", tp.T)], 8))
        placement: 16 ranks on 2 hosts (8 ranks per host); assumed 8 ranks per node: match
          host 'a': ranks 0-7
          host 'b': ranks 8-15
          tp: 4 groups of 4 ranks, each inside one host
          dp: 4 groups of 4 ranks, each across 2 hosts
    """
    per_node, arrays = _validate(hosts, local_ranks, families, ranks_per_node, topology)
    world = len(hosts)
    index: dict[str, int] = {}
    host_ids = np.array([index.setdefault(host, len(index)) for host in hosts], dtype=np.int64)
    names, counts = list(index), np.bincount(host_ids)
    members = np.split(np.argsort(host_ids, kind="stable"), np.cumsum(counts)[:-1])
    consecutive = int((np.diff(host_ids) != 0).sum()) == len(names) - 1
    per_host = int(counts[0]) if consecutive and (counts == counts[0]).all() else None
    problems: list[str] = []
    notes = ["node blocks were not assumed (ranks_per_node / LOCAL_WORLD_SIZE unknown): not checked"]
    if per_node is not None:
        problems, notes = _check_blocks(host_ids, names, local_ranks, per_node), []
        if world % per_node:
            notes.append(f"{world} ranks are not a multiple of {per_node}: the last assumed node is partial")
        unknown = sum(local is None for local in local_ranks)
        if unknown:
            notes.append(f"LOCAL_RANK unknown on {_plural(unknown, 'rank')}: not checked there")
    warnings, placed, spanning = list(problems), [], {}
    units = tuple(min(unit, world) for unit in topology.unit_ranks) if topology else ()
    for key, groups in arrays:
        (count, size), spread = groups.shape, _spread(host_ids[groups])
        crossing = int((spread > 1).sum())
        crossed = [k for k, unit in enumerate(units) if (groups // unit != groups[:, :1] // unit).any()]
        at = None if topology is None or size == 1 else (crossed[-1] + 1 if crossed else 0)
        tier = None if at is None or topology is None else topology.names[at]
        line = _line(key, size, spread, tier)
        placed.append(
            FamilyPlacement(key, size, count, int(spread.min()), int(spread.max()), count - crossing, tier, line)
        )
        verb = "crosses" if crossing == 1 else "cross"
        of_groups = "its only group crosses hosts" if count == 1 else f"{crossing} of its {count} groups {verb} hosts"
        if topology is not None and at is not None and at < len(units):
            unit = topology.unit_ranks[at]
            if units[at] > counts.max():  # a unit holds more ranks than any host: it spans hosts
                spanning[at] = (topology.names[at], unit)
            elif crossing:
                warnings.append(
                    f"{key}: priced on tier {shown(tier)} (units of {unit} ranks, inside one host) but {of_groups}"
                )
        elif topology is None and per_node is not None and crossing:
            block = min(per_node, world)
            if (groups // block == groups[:, :1] // block).all():
                warnings.append(f"{key}: every group fits one assumed node of {per_node} ranks, but {of_groups}")
    for at, (name, unit) in spanning.items():
        notes.append(f"tier {shown(name)} units of {unit} ranks span hosts: cannot be verified from hostnames")
        straddling = np.flatnonzero(_distinct(host_ids, np.arange(world) // units[at]) > 1)
        if straddling.size:
            items = [f"host {shown(names[h])} holds {_ranks_text(members[h])}" for h in straddling[:_SHOWN]]
            text = _some(items, straddling.size, "host")
            warnings.append(f"hosts straddle two units of tier {shown(name)} ({unit} ranks each): {text}")
    return PlacementReport(
        hosts=tuple((name, tuple(int(r) for r in ranks)) for name, ranks in zip(names, members)),
        ranks_per_node=per_node,
        ranks_per_host=per_host,
        node_blocks_match=per_node is not None and not problems,
        problems=tuple(problems),
        families=tuple(placed),
        warnings=tuple(warnings),
        notes=tuple(notes),
        topology=None if topology is None else topology.names,
    )
