"""The schedule of a bridge between two grids: who sends which piece of the global tensor to whom (pure).

A tensor crosses from a *sender* grid to a *receiver* grid, both cut as `hypergrid.grid.bridge.Bridge` says (``dp``
slices the batch, ``cp`` the sequence, other dims hold copies); only the *boundary* ranks take part: the sender's
last pipeline stage (dim ``pp``) and the receiver's first (either may be chosen).

`plan_transfer` lists the pieces: for every receiving rank, the rectangles
(batch rows x sequence positions, in global indices) that together make its
slice, each with the sending rank that holds it. Each piece comes from one of
the ranks that hold that data (the copies of one sender block); the pieces of
one block are dealt to its holders greedily, least-loaded first, so no holder
sends more than the block's requested bytes divided by the number of holders
plus one piece (a request is split along the batch when there are more holders
than requests), and a receiver that holds the data itself takes it from itself.
The same function plans the gradients' way back, with the roles swapped.

Examples:
    >>> from hypergrid.layout import GridLayout
    >>> enc = GridLayout([1, 2], ["tp", "dp"])  # ranks 0, 1
    >>> dec = GridLayout([3], ["dp"], rank_offset=2)  # ranks 2, 3, 4
    >>> for piece in plan_transfer(enc, dec, batch=6):
    ...     print(piece)
    Piece(sender=0, receiver=2, batch=(0, 2), seq=None)
    Piece(sender=0, receiver=3, batch=(2, 3), seq=None)
    Piece(sender=1, receiver=3, batch=(3, 4), seq=None)
    Piece(sender=1, receiver=4, batch=(4, 6), seq=None)
"""

from __future__ import annotations

from dataclasses import dataclass

from hypergrid.errors import InvalidArgumentError
from hypergrid.layout.grid_layout import GridLayout

__all__ = ["Piece", "Roles", "boundary_ranks", "global_shape", "held_slice", "local_shape", "plan_transfer"]

Range = tuple[int, int]


@dataclass(frozen=True)
class Roles:
    """The names of the dims with a role in a bridge; a grid without one of them has size 1 there.

    Examples:
        >>> Roles().size(GridLayout([2, 3], ["tp", "dp"]), "cp")
        1
    """

    dp: str = "dp"
    cp: str = "cp"
    pp: str = "pp"

    def size(self, layout: GridLayout, role: str) -> int:
        """The size of the dim playing ``role`` (``"dp"``, ``"cp"`` or ``"pp"``), 1 where the grid has none."""
        name = getattr(self, role)
        return layout.dim_size(name) if name in layout.dim_names else 1

    def coord(self, layout: GridLayout, rank: int, role: str) -> int:
        """The coordinate of ``rank`` along the dim playing ``role``, 0 where the grid has none."""
        name = getattr(self, role)
        if name not in layout.dim_names:
            return 0
        return int(layout.coords_of(rank)[layout.dim_names.index(name)])


@dataclass(frozen=True)
class Piece:
    """One transfer: ``sender`` sends rows ``batch`` (and positions ``seq``, or all) of the global tensor."""

    sender: int
    receiver: int
    batch: Range
    seq: Range | None

    def numel_rows(self) -> int:
        """Rows x sequence positions (the whole sequence counts as 1): the piece's size in (row, position) cells."""
        rows = self.batch[1] - self.batch[0]
        return rows * (1 if self.seq is None else self.seq[1] - self.seq[0])


def boundary_ranks(layout: GridLayout, stage: str, roles: Roles = Roles()) -> list[int]:
    """The ranks of ``layout`` on its first or last pipeline stage (``stage`` ``"first"``/``"last"``), sorted.

    Examples:
        >>> boundary_ranks(GridLayout([2, 2], ["tp", "pp"]), "last")
        [2, 3]
    """
    if stage not in ("first", "last"):
        raise InvalidArgumentError(f"boundary_ranks: stage must be 'first' or 'last', got {stage!r}")
    index = 0 if stage == "first" else roles.size(layout, "pp") - 1
    ranks = range(layout.rank_offset, layout.rank_offset + layout.size)
    return [rank for rank in ranks if roles.coord(layout, rank, "pp") == index]


def held_slice(
    layout: GridLayout, rank: int, batch: int, seq: int | None, roles: Roles = Roles()
) -> tuple[Range, Range | None]:
    """The rows (and positions, with ``seq``) of the global tensor that ``rank`` of ``layout`` holds.

    Examples:
        >>> held_slice(GridLayout([2, 3], ["cp", "dp"]), 5, batch=6, seq=8)
        ((4, 6), (4, 8))
    """
    rows = batch // roles.size(layout, "dp")
    start = roles.coord(layout, rank, "dp") * rows
    if seq is None:
        return (start, start + rows), None
    positions = seq // roles.size(layout, "cp")
    first = roles.coord(layout, rank, "cp") * positions
    return (start, start + rows), (first, first + positions)


def global_shape(
    layout: GridLayout, shape: tuple[int, ...], batch_dim: int, seq_dim: int | None, roles: Roles = Roles()
) -> tuple[int, ...]:
    """The global shape of which a boundary rank holds a slice of ``shape`` (batch times dp, sequence times cp).

    Examples:
        >>> global_shape(GridLayout([2, 3], ["cp", "dp"]), (2, 4, 5), batch_dim=0, seq_dim=1)
        (6, 8, 5)
    """
    out = list(shape)
    out[batch_dim] *= roles.size(layout, "dp")
    if seq_dim is not None:
        out[seq_dim] *= roles.size(layout, "cp")
    return tuple(out)


def local_shape(
    layout: GridLayout, rank: int, shape: tuple[int, ...], batch_dim: int, seq_dim: int | None, roles: Roles = Roles()
) -> list[int]:
    """The shape of ``rank``'s slice of a global tensor of ``shape`` (the inverse of `global_shape`).

    Examples:
        >>> local_shape(GridLayout([2, 3], ["cp", "dp"]), 5, (6, 8, 5), batch_dim=0, seq_dim=1)
        [2, 4, 5]
    """
    seq = None if seq_dim is None else shape[seq_dim]
    rows, positions = held_slice(layout, rank, shape[batch_dim], seq, roles)
    out = list(shape)
    out[batch_dim] = rows[1] - rows[0]
    if seq_dim is not None and positions is not None:
        out[seq_dim] = positions[1] - positions[0]
    return out


def _check_divides(what: str, layout: GridLayout, side: str, batch: int, seq: int | None, roles: Roles) -> None:
    dp = roles.size(layout, "dp")
    if batch <= 0 or batch % dp:
        raise InvalidArgumentError(
            f"{what}: the global batch {batch} must be a positive multiple of the {side}'s {roles.dp} size {dp}"
        )
    cp = roles.size(layout, "cp")
    if seq is not None and (seq <= 0 or seq % cp):
        raise InvalidArgumentError(
            f"{what}: the global sequence length {seq} must be a positive multiple of the {side}'s {roles.cp} size {cp}"
        )


def _overlap(a: Range, b: Range) -> Range | None:
    start, stop = max(a[0], b[0]), min(a[1], b[1])
    return (start, stop) if start < stop else None


def _split(rows: Range, parts: int) -> list[Range]:
    """``rows`` cut into ``parts`` consecutive near-equal ranges (fewer if there are fewer rows)."""
    count = rows[1] - rows[0]
    parts = max(1, min(parts, count))
    bounds = [rows[0] + count * k // parts for k in range(parts + 1)]
    return [(bounds[k], bounds[k + 1]) for k in range(parts)]


def plan_transfer(
    sender: GridLayout,
    receiver: GridLayout,
    *,
    batch: int,
    seq: int | None = None,
    sender_stage: str = "last",
    receiver_stage: str = "first",
    roles: Roles = Roles(),
    what: str = "plan_transfer",
) -> tuple[Piece, ...]:
    """Every piece that moves when a global tensor crosses from ``sender`` to ``receiver``.

    Args:
        sender: the layout whose boundary ranks hold the tensor.
        receiver: the layout whose boundary ranks receive it.
        batch: the global batch size (the size of the batch dim of the whole tensor).
        seq: the global sequence length when the sequence dim is sharded over ``cp``; ``None``: not sharded.
        sender_stage: the sender's pipeline stage that holds the tensor (``"last"`` or ``"first"``).
        receiver_stage: the receiver's stage that takes it.
        roles: the names of the ``dp``, ``cp`` and ``pp`` dims.
        what: the call to name in errors.

    Returns:
        The pieces, grouped by receiver (ascending), each receiver's in ascending (rows, positions) order;
        the same tuple on every process given the same arguments.

    Raises:
        InvalidArgumentError: ``batch`` (or ``seq``) is not a positive multiple of both sides' ``dp`` (``cp``) size.
    """
    _check_divides(what, sender, "source", batch, seq, roles)
    _check_divides(what, receiver, "destination", batch, seq, roles)
    holders: dict[tuple[Range, Range | None], list[int]] = {}
    for rank in boundary_ranks(sender, sender_stage, roles):
        holders.setdefault(held_slice(sender, rank, batch, seq, roles), []).append(rank)
    wanted: dict[tuple[Range, Range | None], list[tuple[int, Range, Range | None]]] = {block: [] for block in holders}
    for rank in boundary_ranks(receiver, receiver_stage, roles):
        rows, positions = held_slice(receiver, rank, batch, seq, roles)
        for block in holders:
            common = _overlap(rows, block[0])
            common_seq = None if seq is None else _overlap(positions, block[1])  # type: ignore[arg-type]
            if common is not None and (seq is None or common_seq is not None):
                wanted[block].append((rank, common, common_seq))
    pieces: list[Piece] = []
    for block, requests in wanted.items():
        candidates = holders[block]
        load = dict.fromkeys(candidates, 0)
        parts = max(1, len(candidates) // max(1, len(requests)))
        for rank, rows, positions in requests:
            if rank in load:  # the receiver holds this data itself
                pieces.append(Piece(rank, rank, rows, positions))
                continue
            for chunk in _split(rows, parts):
                piece = Piece(min(candidates, key=lambda c: (load[c], candidates.index(c))), rank, chunk, positions)
                load[piece.sender] += piece.numel_rows()
                pieces.append(piece)
    pieces.sort(key=lambda p: (p.receiver, p.batch, p.seq or (0, 0)))
    return tuple(pieces)
