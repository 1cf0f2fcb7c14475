"""``python -m hypergrid show``: a grid's layout, families and node report, without any process group.

    python -m hypergrid show --shape 2,2,2 --dims tp,cp,dp [--offset N] [--ranks-per-node N]
        [--family dp,cp] [--limit 64] [--json] [--communicators]

Readable for a 16-rank job; summarized for a large one: the first and last
rows of the rank table, and family lines of at most ``FAMILY_LINE_WIDTH``
(100) characters, ending in "… and N more groups"; ``--json`` gives
everything, for tools, up to `FULL_RANKS` ranks (above, the same summary as
the text, marked ``"complete": false``). Any legal grid (up to 2**31-1 ranks)
is shown in bounded time and memory: the summary computes only the rows and
groups it prints, and the node report (which enumerates every group) is left
out above `NODE_REPORT_RANKS` ranks, saying so. Without ``--ranks-per-node``
or ``LOCAL_WORLD_SIZE`` the text says how to get the node report.
"""

from __future__ import annotations

import json
import math
import os
import sys
from collections.abc import Iterator, Sequence
from typing import Any

from hypergrid.cli.arguments import OneLineParser, parse_int
from hypergrid.errors import HyperGridError, InvalidArgumentError, name_the_call
from hypergrid.layout import GridLayout
from hypergrid.layout.economy import plan_communicators
from hypergrid.values import shown

#: The widest family line of the text report: groups that do not fit are counted ("… and N more groups").
FAMILY_LINE_WIDTH = 100
#: Described in full (every rank, every group of every family) up to this many ranks x families; else summarized.
FULL_RANKS = 2**20
#: The node report enumerates every group of every family: left out (saying so) above this many ranks x families.
NODE_REPORT_RANKS = 2**22
#: Families shown at most (a grid of n dims has 2**n - 1): the first ones, fewest dims first; the rest are counted.
MOST_FAMILIES = 256
#: Members shown of a group in a summary: the first and last half of this many, around "...".
SHOWN_MEMBERS = 16

__all__ = [
    "FAMILY_LINE_WIDTH",
    "FULL_RANKS",
    "MOST_FAMILIES",
    "NODE_REPORT_RANKS",
    "first_families",
    "first_groups",
    "parse_grid_arguments",
    "show",
    "main",
]


def _parse_list(text: str, what: str) -> list[str]:
    items = [item.strip() for item in text.split(",")]
    if not all(items):
        raise InvalidArgumentError(f"{what} must be a comma-separated list, got {shown(text)}")
    return items


def parse_grid_arguments(shape_text: str, dims_text: str, offset: int = 0) -> GridLayout:
    """``"2,2,2"``, ``"tp,cp,dp"`` -> a validated ``GridLayout``.

    Raises:
        HyperGridError: a bad list, a size that is not an int, or a bad grid.

    Examples:
        >>> parse_grid_arguments("2,4", "tp,dp")
        GridLayout(shape=[2, 4], dim_names=['tp', 'dp'], rank_offset=0)
    """
    sizes = _parse_list(shape_text, "--shape")
    try:
        shape = [parse_int(size, "--shape") for size in sizes]
    except InvalidArgumentError:
        raise InvalidArgumentError(f"--shape must be comma-separated ints, got {shown(shape_text)}") from None
    dims = _parse_list(dims_text, "--dims")
    try:
        return GridLayout(shape, dims, offset)
    except HyperGridError as error:  # say it in the words the user typed, not the class the CLI called
        name_the_call(error, f"--shape {shown(shape_text)} --dims {shown(dims_text)}")
        raise


def _clip(items: list[Any], limit: int) -> list[Any]:
    """At most ``limit`` items: the first and last halves around an ``"..."``."""
    if len(items) <= limit:
        return items
    half = max(limit // 2, 1)
    return [*items[:half], "...", *items[-half:]]


def _group_text(group: list[int], members: int) -> str:
    return "[" + ",".join(map(str, _clip(group, members))) + "]"


def _groups_text(groups: list[list[Any]], most: int, width: int, total: int | None = None) -> str:
    """The first groups (at most ``most``) that fit in ``width`` characters, then "… and N more groups".

    A group is written whole up to 16 members, else first and last members
    around ``...``; a long group is cut further so that at least one fits.
    ``total``: how many groups the family has (default: ``len(groups)``).

    Examples:
        >>> _groups_text([[0, 1], [2, 3], [4, 5]], most=8, width=40)
        '[0,1] [2,3] [4,5]'
        >>> _groups_text([[i, i + 1] for i in range(0, 20, 2)], most=8, width=40)
        '[0,1] [2,3] [4,5] … and 7 more groups'
        >>> _groups_text([list(range(1000, 1040))], most=8, width=20)
        '[1000,...,1039]'
    """
    count = len(groups) if total is None else total
    everything = " ".join(_group_text(group, 16) for group in groups[:most])
    if count <= most and len(groups) == count and len(everything) <= width:
        return everything
    reserve = len(f" … and {count} more groups")
    parts: list[str] = []
    for group in groups[:most]:
        fitting = [
            text
            for text in (_group_text(group, members) for members in (16, 8, 4, 2))
            if len(" ".join([*parts, text])) + reserve <= width
        ]
        if not fitting:
            break
        parts.append(fitting[0])
    parts = parts or [_group_text(groups[0], 2)]  # always one group, however narrow the line
    rest = count - len(parts)
    return " ".join(parts) + (f" … and {rest} more group{'s' if rest > 1 else ''}" if rest else "")


def first_groups(
    layout: GridLayout, family: Sequence[str], count: int, members: int = SHOWN_MEMBERS
) -> list[list[Any]]:
    """The first ``count`` groups of a family, in ``rank_enum``'s order, each cut to ``members`` members.

    Computed from the strides, without enumerating the family: O(count x
    members) whatever the grid's size. A group longer than ``members`` keeps
    its first and last ``members // 2`` around ``"..."``.

    Examples:
        >>> layout = GridLayout([2, 3, 4], ["tp", "cp", "dp"])
        >>> first_groups(layout, ("dp", "tp"), 2) == layout.rank_enum(("dp", "tp"))[:2]
        True
        >>> first_groups(GridLayout([64, 2], ["tp", "dp"]), ("tp",), 1, members=4)
        [[0, 1, '...', 62, 63]]
    """
    chosen = set(layout.dim_indices(list(family)))
    others = [i for i in range(layout.ndim) if i not in chosen]
    inner = sorted(chosen)
    size = math.prod(layout.shape[i] for i in inner)

    def offset(index: int, dims: list[int]) -> int:  # index as coordinates of dims, innermost fastest
        total = 0
        for i in dims:
            index, coordinate = divmod(index, layout.shape[i])
            total += coordinate * layout.strides[i]
        return total

    picked = range(size) if size <= members else [*range(members // 2), -1, *range(size - members // 2, size)]
    groups = []
    for group in range(min(count, layout.size // size)):
        base = layout.rank_offset + offset(group, others)
        groups.append(["..." if m < 0 else base + offset(m, inner) for m in picked])
    return groups


def first_families(layout: GridLayout, most: int = MOST_FAMILIES) -> list[tuple[str, ...]]:
    """The first ``most`` families of ``layout.all_families()`` (fewest dims first), without listing them all.

    Examples:
        >>> layout = GridLayout([2] * 4, ["a", "b", "c", "d"])
        >>> first_families(layout, 7) == layout.all_families()[:7]
        True
        >>> len(first_families(GridLayout([1] * 40, [f"d{i}" for i in range(40)]), 3))
        3
    """

    def subsets(size: int, below: int) -> Iterator[tuple[int, ...]]:  # k-subsets of range(below) by mask value
        if size == 0:
            yield ()
            return
        for top in range(size - 1, below):
            for rest in subsets(size - 1, top):
                yield (*rest, top)

    out: list[tuple[str, ...]] = []
    for size in range(1, layout.ndim + 1):
        for chosen in subsets(size, layout.ndim):
            if len(out) == most:
                return out
            out.append(tuple(layout.dim_names[i] for i in reversed(chosen)))
    return out


def describe(
    layout: GridLayout, families: list[tuple[str, ...]], ranks_per_node: int | None, limit: int = 64, total: int = 0
) -> dict[str, Any]:
    """Everything ``show`` knows, as plain data (the ``--json`` output); a summary above `FULL_RANKS`.

    ``families`` are the ones shown, of ``total`` (default: as many). The
    summary (``"complete": false``, when ranks x families exceed `FULL_RANKS`)
    holds the first and last ``limit // 2`` rows of the rank table and the
    first ``max(limit // 8, 2)`` groups of each family, cut to 16 members
    (`first_groups`): bounded whatever the size.
    """
    complete = layout.size * max(len(families), 1) <= FULL_RANKS
    start = layout.rank_offset
    if complete:
        ranks: list[int] = list(range(start, start + layout.size))
    else:
        half = max(limit // 2, 1)
        ranks = [*range(start, start + half), *range(start + layout.size - half, start + layout.size)]
    coords = layout.coords_array(ranks).tolist()
    rows: list[Any] = [{"rank": r, **dict(zip(layout.dim_names, c))} for r, c in zip(ranks, coords)]
    if not complete:
        rows.insert(len(rows) // 2, "...")
    data: dict[str, Any] = {
        "shape": list(layout.shape),
        "dim_names": list(layout.dim_names),
        "rank_offset": layout.rank_offset,
        "size": layout.size,
        "complete": complete,
        "num_families": max(total, len(families)),
        "ranks": rows,
        "families": [
            {
                "key": layout.key(family),
                "group_size": layout.group_size(family),
                "num_groups": layout.num_groups(family),
                "groups": layout.rank_enum(family) if complete else first_groups(layout, family, max(limit // 8, 2)),
            }
            for family in families
        ],
    }
    if ranks_per_node is not None:
        data["ranks_per_node"] = ranks_per_node
        if layout.size * (2**layout.ndim - 1) <= NODE_REPORT_RANKS:
            wanted = {layout.key(family) for family in families}
            data["nodes"] = [row for row in layout.node_report(ranks_per_node) if row["key"] in wanted]
        else:
            data["nodes_left_out"] = (
                f"the node report enumerates every group of every family: left out above {NODE_REPORT_RANKS:,} "
                f"ranks x families (this grid: {layout.size:,} ranks, {2**layout.ndim - 1:,} families)"
            )
    return data


def render(data: dict[str, Any], limit: int) -> str:
    """The ``show`` report as text, clipped to ``limit`` rows / groups per section."""
    names = data["dim_names"]
    width = max(4, len(str(data["rank_offset"] + data["size"] - 1)))
    lines = [
        f"grid {data['shape']} over {names}: {data['size']} ranks "
        f"({data['rank_offset']}..{data['rank_offset'] + data['size'] - 1}), {names[0]} innermost",
        "",
        f"{'rank':>{width}}  " + "  ".join(f"{name:>4}" for name in names),
    ]
    for row in _clip(data["ranks"], limit) if data["complete"] else data["ranks"]:
        if row == "...":
            lines.append(f"{'...':>{width}}")
        else:
            lines.append(f"{row['rank']:>{width}}  " + "  ".join(f"{row[n]:>4}" for n in names))
    lines += ["", f"{'family':<16} {'groups':>7} {'size':>6}  groups"]
    for family in data["families"]:
        head = f"{family['key']:<16} {family['num_groups']:>7} {family['group_size']:>6}  "
        width = FAMILY_LINE_WIDTH - len(head)
        lines.append(head + _groups_text(family["groups"], max(limit // 8, 2), width, family["num_groups"]))
    hidden = data["num_families"] - len(data["families"])
    if hidden:
        lines.append(f"… and {hidden:,} more families (give --family to see one)")
    if "nodes" in data:
        lines += [
            "",
            f"nodes of {data['ranks_per_node']} consecutive ranks:",
            f"{'family':<16} {'nodes/group':>11}  placement",
        ]
        for row in data["nodes"]:
            spread = (
                f"{row['min_nodes']}"
                if row["min_nodes"] == row["max_nodes"]
                else f"{row['min_nodes']}-{row['max_nodes']}"
            )
            where = "inside one node" if row["intra_node"] else "crosses nodes"
            lines.append(f"{row['key']:<16} {spread:>11}  {where}")
    elif "nodes_left_out" in data:
        lines += ["", f"nodes of {data['ranks_per_node']} consecutive ranks: {data['nodes_left_out']}"]
    else:
        lines += [
            "",
            "node report: give --ranks-per-node N (or set LOCAL_WORLD_SIZE) to see which families cross nodes",
        ]
    return "\n".join(lines)


def _family(layout: GridLayout, text: str) -> tuple[str, ...]:
    """``--family``'s dims in canonical order; an error names the flag and the value the user gave.

    Examples:
        >>> _family(GridLayout([2, 2], ["tp", "dp"]), "tp,dp")
        ('dp', 'tp')
        >>> _family(GridLayout([2, 2], ["tp", "dp"]), "dpp")
        Traceback (most recent call last):
          ...
        hypergrid.errors.DimsError: --family 'dpp': unknown dim 'dpp' in dims 'dpp'; valid dims are ['tp', 'dp']
    """
    dims = _parse_list(text, "--family") if "," in text else text
    try:
        return layout.canonical_dims(dims)
    except HyperGridError as error:
        name_the_call(error, f"--family {shown(text)}")
        raise


def show(argv: Sequence[str] | None = None) -> int:
    """Run ``show``; exit status 0, or 2 with a friendly message for bad arguments."""
    parser = OneLineParser(prog="python -m hypergrid show", description=__doc__.splitlines()[0])
    parser.add_argument("--shape", required=True, help="dim sizes, innermost first, e.g. 2,2,2")
    parser.add_argument("--dims", required=True, help="dim names, innermost first, e.g. tp,cp,dp")
    parser.add_argument("--offset", default="0", help="the grid's first rank (default 0)")
    parser.add_argument("--ranks-per-node", help="ranks per node for the node report (default: LOCAL_WORLD_SIZE)")
    parser.add_argument("--family", help="show one family only: names separated by ',' or a key like dp-cp")
    parser.add_argument("--limit", default="64", help="rows and groups shown before summarizing (default 64)")
    parser.add_argument("--json", action="store_true", help="print everything as JSON")
    parser.add_argument(
        "--communicators", action="store_true", help="which families share one communicator, and the counts per rank"
    )
    args = parser.parse_args(argv)
    try:
        offset, limit = parse_int(args.offset, "--offset", 0), parse_int(args.limit, "--limit", 2)
        layout = parse_grid_arguments(args.shape, args.dims, offset)
        per_node_text = args.ranks_per_node or os.environ.get("LOCAL_WORLD_SIZE")
        what = "--ranks-per-node" if args.ranks_per_node else "LOCAL_WORLD_SIZE (the default of --ranks-per-node)"
        per_node = None if per_node_text is None else parse_int(per_node_text, what, 1)
        if args.family is None:
            families, total = first_families(layout), 2**layout.ndim - 1
        else:
            families, total = [_family(layout, args.family)], 1
        if args.communicators:  # the communicator economy instead of the layout report
            plan = plan_communicators(layout, families)
            cut = f"\n(planned for the first {len(families)} of {total:,} families; give --family to plan one)"
            report = plan.render() + (cut if total > len(families) else "")
            print(json.dumps({**plan.to_dict(), "num_families": total}) if args.json else report)
            return 0
        data = describe(layout, families, per_node, limit, total)
    except HyperGridError as error:
        parser.error(str(error))
    print(json.dumps(data) if args.json else render(data, limit))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return show(argv)


if __name__ == "__main__":
    sys.exit(main())
