"""Moving a planned transfer (`hypergrid.layout.bridge_plan`): the wire header and the point-to-point pieces.

A header is one int64 row (the global shape, padded, and a dtype code) that a
sender posts before the data when the receivers do not know the shape yet.
`pieces_ops` turns a plan into the ``P2POp`` list of the calling rank (sends of
views of its own slice, receives into fresh buffers) and `assemble` places the
received pieces into the rank's slice. Every rank walks the plan in the same
order, so the messages between two ranks pair up in the order they were posted.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist

from hypergrid.errors import CollectiveMismatchError, InvalidArgumentError
from hypergrid.layout.bridge_plan import Piece
from hypergrid.ops.pipeline import run_p2p

__all__ = [
    "HEADER_DIMS",
    "Meta",
    "Slicer",
    "check_headers",
    "decode_header",
    "encode_header",
    "exchange_headers",
    "pieces_ops",
    "place",
]

#: The most tensor dims a header carries.
HEADER_DIMS = 8
_DTYPES = (
    torch.float32,
    torch.float64,
    torch.float16,
    torch.bfloat16,
    torch.int64,
    torch.int32,
    torch.int16,
    torch.int8,
    torch.uint8,
    torch.bool,
    torch.complex64,
    torch.complex128,
)


@dataclass(frozen=True)
class Meta:
    """The global tensor of a transfer: its shape and dtype."""

    shape: tuple[int, ...]
    dtype: torch.dtype

    def describe(self) -> str:
        """``shape [6, 4] float32``."""
        return f"shape {list(self.shape)} {str(self.dtype).removeprefix('torch.')}"


def encode_header(meta: Meta, device: torch.device) -> torch.Tensor:
    """``meta`` as one int64 row on ``device``: ndim, dtype code, the shape padded with -1.

    Examples:
        >>> encode_header(Meta((6, 4), torch.float32), torch.device("cpu")).tolist()
        [2, 0, 6, 4, -1, -1, -1, -1, -1, -1]
    """
    if meta.dtype not in _DTYPES:
        raise InvalidArgumentError(f"bridge: dtype {meta.dtype} is not one of the dtypes a bridge carries {_DTYPES}")
    if len(meta.shape) > HEADER_DIMS:
        raise InvalidArgumentError(f"bridge: a tensor of {len(meta.shape)} dims; at most {HEADER_DIMS} are carried")
    row = [len(meta.shape), _DTYPES.index(meta.dtype), *meta.shape]
    row += [-1] * (2 + HEADER_DIMS - len(row))
    return torch.tensor(row, dtype=torch.int64, device=device)


def decode_header(row: torch.Tensor) -> Meta:
    """The `Meta` of a header row.

    Examples:
        >>> decode_header(encode_header(Meta((3,), torch.bfloat16), torch.device("cpu")))
        Meta(shape=(3,), dtype=torch.bfloat16)
    """
    values = [int(v) for v in row.tolist()]
    return Meta(tuple(values[2 : 2 + values[0]]), _DTYPES[values[1]])


def exchange_headers(
    what: str,
    routes: dict[str, tuple[list[int], list[int]]],
    sends: dict[str, Meta],
    rank: int,
    device: torch.device,
    everyone: bool,
) -> dict[str, dict[int, Meta]]:
    """Move the headers of each direction (its senders, its receivers) in one batch; what this rank received.

    Receiver ``i`` gets the header of sender ``i mod len(senders)``; with
    ``everyone`` each sender's header goes to every other rank of the
    direction (the checked mode: every participant sees every sender's).
    """
    ops: list[dist.P2POp] = []
    inbox: dict[str, list[tuple[int, torch.Tensor]]] = {}
    for direction, (senders, receivers) in routes.items():
        if everyone:
            pairs = [(s, r) for s in senders for r in sorted(set(senders) | set(receivers))]
        else:
            pairs = [(senders[i % len(senders)], r) for i, r in enumerate(receivers)]
        inbox[direction] = []
        for sender, receiver in (pair for pair in pairs if pair[0] != pair[1]):
            if sender == rank:
                ops.append(dist.P2POp(dist.isend, encode_header(sends[direction], device), receiver))
            elif receiver == rank:
                row = torch.empty(2 + HEADER_DIMS, dtype=torch.int64, device=device)
                ops.append(dist.P2POp(dist.irecv, row, sender))
                inbox[direction].append((sender, row))
    run_p2p(ops, what)
    return {direction: {sender: decode_header(row) for sender, row in rows} for direction, rows in inbox.items()}


def check_headers(what: str, seen: dict[int, Meta], fixed: Meta | None) -> None:
    """Raise `CollectiveMismatchError` unless every sender's header is the same (and ``fixed``, if given).

    Examples:
        >>> check_headers("send_forward", {0: Meta((4,), torch.int8), 1: Meta((6,), torch.int8)}, None)
        Traceback (most recent call last):
          ...
        hypergrid.errors.CollectiveMismatchError: send_forward: rank(s) [0] sent the global shape [4] int8; ...
    """
    groups: dict[str, list[int]] = {}
    for sender, meta in sorted(seen.items()):
        groups.setdefault(meta.describe(), []).append(sender)
    if len(groups) > 1 or (fixed is not None and fixed.describe() not in groups):
        said = "; ".join(f"rank(s) {ranks} sent the global {text}" for text, ranks in groups.items())
        expected = f" (the bridge carries {fixed.describe()})" if fixed is not None else ""
        raise CollectiveMismatchError(f"{what}{expected}: {said}", groups)


@dataclass(frozen=True)
class Slicer:
    """Where the batch and sequence dims are, to cut a piece out of a rank's slice or place one in it."""

    batch_dim: int
    seq_dim: int | None

    def view(self, local: torch.Tensor, piece: Piece, origin: tuple[int, int]) -> torch.Tensor:
        """The part of ``local`` (a slice starting at global row/position ``origin``) that ``piece`` covers."""
        out = local.narrow(self.batch_dim, piece.batch[0] - origin[0], piece.batch[1] - piece.batch[0])
        if self.seq_dim is not None and piece.seq is not None:
            out = out.narrow(self.seq_dim, piece.seq[0] - origin[1], piece.seq[1] - piece.seq[0])
        return out


def pieces_ops(
    pieces: Sequence[Piece],
    rank: int,
    slicer: Slicer,
    sent: tuple[torch.Tensor, tuple[int, int]] | None,
    received: tuple[torch.Tensor, tuple[int, int]] | None,
) -> tuple[list[dist.P2POp], list[tuple[torch.Tensor, Piece]]]:
    """The calling rank's ops for ``pieces`` and the buffers to place (own pieces copied, contiguous ones in place).

    ``sent``: the rank's slice and its origin (global row, position) where it
    sends; ``received``: the slice to fill and its origin where it receives.
    """
    ops: list[dist.P2POp] = []
    buffers: list[tuple[torch.Tensor, Piece]] = []
    for piece in pieces:
        if piece.sender == rank and piece.receiver == rank:
            assert sent is not None and received is not None
            slicer.view(received[0], piece, received[1]).copy_(slicer.view(sent[0], piece, sent[1]))
        elif piece.sender == rank:
            assert sent is not None
            ops.append(dist.P2POp(dist.isend, slicer.view(sent[0], piece, sent[1]).contiguous(), piece.receiver))
        elif piece.receiver == rank:
            assert received is not None
            view = slicer.view(received[0], piece, received[1])
            if view.is_contiguous():  # rows of a contiguous slice: received in place
                ops.append(dist.P2POp(dist.irecv, view, piece.sender))
                continue
            buffer = torch.empty(view.shape, dtype=view.dtype, device=view.device)
            ops.append(dist.P2POp(dist.irecv, buffer, piece.sender))
            buffers.append((buffer, piece))
    return ops, buffers


def place(
    buffers: Sequence[tuple[torch.Tensor, Piece]], slicer: Slicer, target: torch.Tensor, origin: tuple[int, int]
) -> None:
    """Copy each received buffer into its place in ``target`` (a slice starting at ``origin``)."""
    for buffer, piece in buffers:
        slicer.view(target, piece, origin).copy_(buffer)
