"""Moving a planned transfer (`hypergrid.layout.bridge_plan`): the wire header and the point-to-point pieces.

A header is one int64 row that every sender of a transfer posts to every other
participant, on every call: what the sender sends (the global shape, padded,
and a dtype code) or that it refused its tensor, and why. Every participant
reads the same headers, so every one reaches the same verdict
(`check_headers`), and a transfer that cannot be right raises on all of them
together, nothing delivered. `pieces_ops` turns a plan into the ``P2POp`` list
of the calling rank (sends of views of its own slice, receives into fresh
buffers) and `place` puts the received pieces into the rank's slice. Every rank
walks the headers and then the plan in the same order, so the messages between
two ranks pair up in the order they were posted.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist

from hypergrid.errors import CollectiveMismatchError, InvalidArgumentError
from hypergrid.layout.bridge_plan import Piece

__all__ = [
    "HEADER_DIMS",
    "REASONS",
    "Meta",
    "Refusal",
    "Slicer",
    "carried",
    "check_headers",
    "decode_header",
    "device_for",
    "encode_header",
    "header_ops",
    "pieces_ops",
    "place",
    "read_inbox",
    "verdict",
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
#: Why a sender refused its tensor, by the code its header carries (0: it did not refuse).
REASONS = (
    "",
    "it is not a tensor with the bridge's batch_dim (and seq_dim)",
    "its dtype is not one a bridge carries",
    f"it has more than {HEADER_DIMS} dims",
    "its shape or dtype is not the one the bridge's first transfer fixed",
    "its global batch (or sequence) is not one both grids' dp (cp) divide",
)
_WIDTH = 3 + HEADER_DIMS  # reason, ndim, dtype code, the shape


@dataclass(frozen=True)
class Meta:
    """The global tensor of a transfer: its shape and dtype."""

    shape: tuple[int, ...]
    dtype: torch.dtype

    def describe(self) -> str:
        """``shape [6, 4] float32``."""
        return f"shape {list(self.shape)} {str(self.dtype).removeprefix('torch.')}"

    def says(self) -> str:
        """What a sender of this tensor said, in an error: ``sent the global shape [6, 4] float32``."""
        return f"sent the global {self.describe()}"


@dataclass(frozen=True)
class Refusal:
    """A sender that refused its tensor: the code of why (an index of `REASONS`), and its tensor where carried."""

    reason: int
    meta: Meta | None = None

    def says(self) -> str:
        """``refused its tensor (of the global shape [6, 4] float32): <why>``.

        Examples:
            >>> Refusal(2).says()
            'refused its tensor: its dtype is not one a bridge carries'
        """
        of = f" (of the global {self.meta.describe()})" if self.meta is not None else ""
        return f"refused its tensor{of}: {REASONS[self.reason]}"


def carried(meta: Meta) -> int:
    """0 when a header can carry ``meta``, else the code (in `REASONS`) of why not.

    Examples:
        >>> carried(Meta((2, 3), torch.float32)), carried(Meta((2,), torch.uint16)), carried(Meta((1,) * 9, torch.int8))
        (0, 2, 3)
    """
    if meta.dtype not in _DTYPES:
        return 2
    return 3 if len(meta.shape) > HEADER_DIMS else 0


def encode_header(said: Meta | Refusal, device: torch.device) -> torch.Tensor:
    """``said`` as one int64 row on ``device``: the reason (0 for a tensor sent), ndim, dtype code, padded shape.

    Examples:
        >>> encode_header(Meta((6, 4), torch.float32), torch.device("cpu")).tolist()
        [0, 2, 0, 6, 4, -1, -1, -1, -1, -1, -1]
        >>> encode_header(Refusal(2), torch.device("cpu")).tolist()[:3]
        [2, -1, -1]
    """
    reason, meta = (0, said) if isinstance(said, Meta) else (said.reason, said.meta)
    if meta is None:
        row = [reason]
    else:
        if carried(meta):
            raise InvalidArgumentError(f"bridge: {meta.describe()}: {REASONS[carried(meta)]}")
        row = [reason, len(meta.shape), _DTYPES.index(meta.dtype), *meta.shape]
    row += [-1] * (_WIDTH - len(row))
    return torch.tensor(row, dtype=torch.int64, device=device)


def decode_header(row: torch.Tensor) -> Meta | Refusal:
    """What a header row says.

    Examples:
        >>> decode_header(encode_header(Meta((3,), torch.bfloat16), torch.device("cpu")))
        Meta(shape=(3,), dtype=torch.bfloat16)
        >>> decode_header(encode_header(Refusal(4, Meta((3,), torch.int8)), torch.device("cpu")))
        Refusal(reason=4, meta=Meta(shape=(3,), dtype=torch.int8))
    """
    values = [int(v) for v in row.tolist()]
    meta = None if values[1] < 0 else Meta(tuple(values[3 : 3 + values[1]]), _DTYPES[values[2]])
    if values[0] == 0 and meta is not None:
        return meta
    return Refusal(values[0], meta)


def header_ops(
    routes: dict[str, tuple[list[int], list[int]]],
    sends: dict[str, Meta | Refusal],
    rank: int,
    device: torch.device,
) -> tuple[list[dist.P2POp], dict[str, list[tuple[int, torch.Tensor]]]]:
    """The header ops of this rank for each direction (its senders, its receivers), and the rows it will receive.

    Every sender's header goes to every other rank of its direction (senders
    and receivers), in one order that every rank walks the same way.
    """
    ops: list[dist.P2POp] = []
    inbox: dict[str, list[tuple[int, torch.Tensor]]] = {}
    for direction, (senders, receivers) in routes.items():
        everyone = sorted(set(senders) | set(receivers))
        inbox[direction] = []
        header = encode_header(sends[direction], device) if direction in sends else None  # one row for all
        for sender, receiver in ((s, r) for s in senders for r in everyone if s != r):
            if sender == rank:
                assert header is not None
                ops.append(dist.P2POp(dist.isend, header, receiver))
            elif receiver == rank:
                row = torch.empty(_WIDTH, dtype=torch.int64, device=device)
                ops.append(dist.P2POp(dist.irecv, row, sender))
                inbox[direction].append((sender, row))
    return ops, inbox


def read_inbox(inbox: dict[str, list[tuple[int, torch.Tensor]]]) -> dict[str, dict[int, Meta | Refusal]]:
    """The received header rows of `header_ops`, decoded, per direction and sender (one copy to the host)."""
    every = [row for received in inbox.values() for _, row in received]
    rows: Iterator[torch.Tensor] = iter(torch.stack(every).cpu() if every else [])
    return {direction: {sender: decode_header(next(rows)) for sender, _ in got} for direction, got in inbox.items()}


def check_headers(what: str, seen: dict[int, Meta | Refusal], fixed: Meta | None) -> None:
    """Raise `CollectiveMismatchError` if a sender refused, or unless every sender sent the same (and ``fixed``).

    Examples:
        >>> check_headers("send_forward", {0: Meta((4,), torch.int8), 1: Meta((6,), torch.int8)}, None)
        Traceback (most recent call last):
          ...
        hypergrid.errors.CollectiveMismatchError: send_forward: rank(s) [0] sent the global shape [4] int8; ...
    """
    distinct = set(seen.values())
    if len(distinct) == 1 and isinstance(first := next(iter(distinct)), Meta) and fixed in (None, first):
        return  # the every-call case, without building the message
    groups: dict[str, list[int]] = {}
    for sender, said in sorted(seen.items()):
        groups.setdefault(said.says(), []).append(sender)
    refused = any(isinstance(said, Refusal) for said in seen.values())
    if refused or len(groups) > 1 or (fixed is not None and fixed.says() not in groups):
        listed = "; ".join(f"rank(s) {ranks} {text}" for text, ranks in groups.items())
        expected = f" (the bridge carries {fixed.describe()})" if fixed is not None else ""
        raise CollectiveMismatchError(f"{what}{expected}: {listed}; nothing was delivered", groups)


def device_for(chosen: torch.device | None, tensors: dict[str, torch.Tensor]) -> torch.device:
    """Where a bridge places received tensors: ``chosen``, else a sent tensor's device, else NCCL's GPU, else CPU.

    Examples:
        >>> device_for(None, {"forward": torch.zeros(1)})
        device(type='cpu')
    """
    if chosen is not None:
        return chosen
    for tensor in tensors.values():
        return tensor.device
    if "nccl" in str(dist.get_backend()).lower() and torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def verdict(
    what: str,
    rank: int,
    said: dict[str, Meta | Refusal],
    inbox: dict[str, list[tuple[int, torch.Tensor]]],
    fixed: dict[str, Meta | None],
    own: InvalidArgumentError | None,
) -> dict[str, Meta]:
    """Every sender's header of each direction of ``fixed`` checked, as on every participant: each one's `Meta`.

    ``said``: what ``rank`` itself sent; ``inbox``: the header rows it received
    (`header_ops`); ``fixed``: each direction's shape where it is fixed. A
    refusal, senders that differ, or a shape other than the fixed one raise
    ``CollectiveMismatchError``, but on a refusing sender its own error ``own``.

    Examples:
        >>> verdict("send_forward", 0, {"forward": Meta((4,), torch.int8)}, {}, {"forward": None}, None)
        {'forward': Meta(shape=(4,), dtype=torch.int8)}
    """
    agreed: dict[str, Meta] = {}
    received = read_inbox(inbox)
    for direction, carries in fixed.items():
        seen = received.get(direction, {})
        if direction in said:
            seen[rank] = said[direction]
        try:
            check_headers(f"{what}, {direction}", seen, carries)
        except CollectiveMismatchError:
            if own is not None:
                raise own from None
            raise
        meta = next(iter(seen.values()))
        assert isinstance(meta, Meta)
        agreed[direction] = meta
    assert own is None  # a refusing sender's own header is among the ones checked
    return agreed


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
