"""``Bridge``: activations from one grid's last pipeline stage to another grid's first, gradients back.

Megatron-Core's ``BridgeCommunicator`` under its method names, without its
limits: any data-parallel ratio whose global batch both grids divide (2 -> 3
included), a sequence dim sharded over ``cp`` on either side, grids over
disjoint or overlapping ranks, and no leader: each receiving rank gets the
pieces of its slice straight from source ranks that hold them
(`hypergrid.layout.bridge_plan`), all of a call's transfers posted in one
``batch_isend_irecv`` on the default group (no group of its own), through the
failure API (a dead peer raises ``RankFailure``). See docs/bridge.md.
"""

from __future__ import annotations

import time
from typing import Any

import torch
import torch.distributed as dist

from hypergrid.agreement.guard import CreationRequest, GuardLedger, agree, grid_scope, settle
from hypergrid.errors import InvalidArgumentError, RankError
from hypergrid.grid.grid import HyperCommGrid
from hypergrid.layout import bridge_plan
from hypergrid.layout.bridge_plan import Piece, Roles, boundary_ranks, held_slice, plan_transfer
from hypergrid.ops import transfer
from hypergrid.ops.pipeline import run_p2p
from hypergrid.ops.transfer import HEADER_DIMS, Meta, Refusal, Slicer
from hypergrid.validation import check_bool, check_int, check_str, public_methods, refuse

__all__ = ["Bridge"]

FORWARD, BACKWARD = "forward", "backward"


@public_methods
class Bridge:
    """Sends activations from ``src``'s last pipeline stage to ``dst``'s first, and gradients back.

    The source's data-parallel replicas hold consecutive slices of the global
    batch along ``batch_dim`` (copies over ``tp`` and every other dim, and over
    ``cp`` unless ``seq_dim`` is given: then ``cp`` cuts that dim into
    consecutive chunks); each destination rank gets the same global tensor cut
    by its own ``dp`` (and ``cp``). Gradients go back the same way: each source
    rank gets exactly its slice of the gradient, taken from one destination
    rank that holds it (the destination's copies are expected to hold the same
    gradient, as they do after a tensor-parallel layer's all-reduce; nothing is
    summed). Shapes and dtypes travel in a small header from every sender to
    every participant on every call (before the data on the first transfer of
    each direction, or with ``variable_shapes`` or checked collectives; with
    the data once the shape is fixed), so ``recv_forward()`` takes no
    arguments and a transfer that cannot be right raises on every participant.

    Agreement: before its first transfer, the boundary ranks of both grids
    agree on the bridge (both grids, ``batch_dim``, ``seq_dim``, the role
    names) in one guarded round (off when either grid has ``guard=False``):
    a rank that built another bridge raises ``DesyncError`` with all of them.
    Senders that differ, or a sender that refuses its tensor (it raises
    ``InvalidArgumentError``), raise ``CollectiveMismatchError`` on every
    other participant, checked collectives or not; nothing is delivered.

    Args:
        src: the grid whose last ``pp`` stage sends activations.
        dst: the grid whose first ``pp`` stage receives them (disjoint from
            ``src``, overlapping it, or the same ranks in another layout).
        batch_dim: the tensor dim cut by ``dp``.
        seq_dim: the tensor dim cut by ``cp``; ``None``: ``cp`` ranks hold copies.
        variable_shapes: send a header on every transfer (shapes may change
            between calls); by default the first transfer's shape is fixed.
        dp: name of the data-parallel dim (a grid without it has one replica).
        cp: name of the context-parallel dim.
        pp: name of the pipeline dim.
        device: where received tensors are placed; default: the sent tensor's
            device, else the current CUDA device under NCCL, else the CPU.

    Raises:
        InvalidArgumentError: ``src`` or ``dst`` is not a ``HyperCommGrid``, a bad
            ``batch_dim``/``seq_dim`` (``seq_dim == batch_dim``), or the grids do
            not fit in one world.

    Examples:
        >>> import torch, torch.distributed as dist
        >>> from hypergrid import Bridge, HyperCommGrid
        >>> dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        >>> grid = HyperCommGrid([1, 1], ["tp", "dp"])
        >>> bridge = Bridge(grid, grid)  # one rank on both sides: it sends to itself
        >>> bridge.send_forward(torch.arange(4.0).reshape(2, 2)).tolist()
        [[0.0, 1.0], [2.0, 3.0]]
        >>> bridge.send_backward(torch.ones(2, 2)).sum().item()
        4.0
        >>> bridge.destroy(); dist.destroy_process_group()
    """

    def __init__(
        self,
        src: HyperCommGrid,
        dst: HyperCommGrid,
        *,
        batch_dim: int = 0,
        seq_dim: int | None = None,
        variable_shapes: bool = False,
        dp: str = "dp",
        cp: str = "cp",
        pp: str = "pp",
        device: torch.device | str | None = None,
    ) -> None:
        for name, grid in (("src", src), ("dst", dst)):
            if not isinstance(grid, HyperCommGrid):
                raise refuse("Bridge", name, grid, "a HyperCommGrid")
        batch_dim = check_int("Bridge", "batch_dim", batch_dim, 0, HEADER_DIMS - 1)
        if seq_dim is not None:
            seq_dim = check_int("Bridge", "seq_dim", seq_dim, 0, HEADER_DIMS - 1)
            if seq_dim == batch_dim:
                raise refuse("Bridge", "seq_dim", seq_dim, f"None or a tensor dim other than batch_dim={batch_dim}")
        variable_shapes = check_bool("Bridge", "variable_shapes", variable_shapes)
        for role, name in (("dp", dp), ("cp", cp), ("pp", pp)):
            check_str("Bridge", role, name, r"[A-Za-z_][A-Za-z0-9_]*", "a dim name (an identifier)")
        if device is not None:
            try:
                device = torch.device(device)
            except (RuntimeError, TypeError, ValueError):
                raise refuse("Bridge", "device", device, "None, a torch.device or a device name") from None
        if dist.is_initialized():
            world = dist.get_world_size()
            for name, grid in (("src", src), ("dst", dst)):
                if grid.rank_offset + grid.size > world:
                    raise InvalidArgumentError(
                        f"Bridge: {name} grid {grid._core.describe()} needs ranks up to "
                        f"{grid.rank_offset + grid.size - 1} but this world has {world} ranks: both grids must be "
                        "grids of this world"
                    )
        self.src, self.dst = src, dst
        self.batch_dim, self.seq_dim, self.variable_shapes = batch_dim, seq_dim, variable_shapes
        self.roles = Roles(dp, cp, pp)
        self.device = device
        self.slicer = Slicer(self.batch_dim, seq_dim)
        # Each direction: who sends, who receives, and the sender's and receiver's (layout, stage).
        self._sides = {
            FORWARD: ((src.layout, "last"), (dst.layout, "first")),
            BACKWARD: ((dst.layout, "first"), (src.layout, "last")),
        }
        self._ranks = {
            d: (boundary_ranks(*s, self.roles), boundary_ranks(*r, self.roles)) for d, (s, r) in self._sides.items()
        }
        self.participants = sorted(set(self._ranks[FORWARD][0]) | set(self._ranks[FORWARD][1]))
        self.guard = src.guard and dst.guard
        self.checked = src.check_collectives or dst.check_collectives
        # Its ordinal among the bridges built on this rank's worlds (as a grid's: when built on a world, else at the
        # first agreement)
        self._ordinal = src._core.world_for("Bridge").job.ordinal("bridge") if dist.is_initialized() else None
        self._epoch = 0
        self._agreed = False
        self._ledger = GuardLedger()
        self._meta: dict[str, Meta | None] = {FORWARD: None, BACKWARD: None}
        self._plans: dict[tuple[str, Meta], tuple[Piece, ...]] = {}

    def __repr__(self) -> str:
        return (
            f"Bridge({self.src._core.describe()} -> {self.dst._core.describe()}, batch_dim={self.batch_dim}, "
            f"seq_dim={self.seq_dim})"
        )

    # -- the public calls (Megatron's names) ----------------------------------

    def send_forward(self, tensor: torch.Tensor) -> torch.Tensor | None:
        """Send this source rank's activation slice; on a rank also in ``dst``'s first stage, return its slice.

        Raises:
            RankError: the caller is not on ``src``'s last pipeline stage.
            InvalidArgumentError: ``tensor`` is not a tensor, has too few dims or over 8, a
                dtype a header does not carry, a shape or dtype other than the bridge's, or a
                batch (sequence) the grids' ``dp`` (``cp``) do not divide; none of it is sent.
            CollectiveMismatchError: another sender refused its tensor, or the senders'
                tensors make different global shapes; on every other participant too.
            RankFailure: a peer of the transfer is gone.
        """
        both = self._rank() in self._ranks[FORWARD][1]
        return self._transfer("send_forward", {FORWARD: tensor}, {FORWARD} if both else set())[FORWARD]

    def recv_forward(self) -> torch.Tensor:
        """Receive this destination rank's slice of the activation (shape and dtype from the senders).

        Raises:
            RankError: the caller is not on ``dst``'s first stage, or is also on
                ``src``'s last stage (it calls ``send_forward``, which does both).
            CollectiveMismatchError: a sender refused its tensor, or the senders'
                tensors make different global shapes; nothing is delivered.
            RankFailure: a peer of the transfer is gone.
        """
        self._refuse_both("recv_forward", FORWARD, "send_forward(tensor)")
        return self._received(self._transfer("recv_forward", {}, {FORWARD}), FORWARD)

    def send_backward(self, grad: torch.Tensor) -> torch.Tensor | None:
        """Send this destination rank's gradient slice back; on a rank also in ``src``'s last stage, return its own.

        Raises as ``send_forward``, for ``dst``'s first stage.
        """
        both = self._rank() in self._ranks[BACKWARD][1]
        return self._transfer("send_backward", {BACKWARD: grad}, {BACKWARD} if both else set())[BACKWARD]

    def recv_backward(self) -> torch.Tensor:
        """Receive this source rank's slice of the gradient of what it sent.

        Raises as ``recv_forward``, for ``src``'s last stage.
        """
        self._refuse_both("recv_backward", BACKWARD, "send_backward(grad)")
        return self._received(self._transfer("recv_backward", {}, {BACKWARD}), BACKWARD)

    def send_forward_recv_backward(self, tensor: torch.Tensor) -> torch.Tensor:
        """Send an activation and receive a gradient (of an earlier one) in one step, deadlock-free.

        Raises as ``send_forward``; ``RankError`` on a rank in both grids' boundaries.
        """
        self._refuse_both("send_forward_recv_backward", FORWARD, "send_forward and send_backward")
        return self._received(self._transfer("send_forward_recv_backward", {FORWARD: tensor}, {BACKWARD}), BACKWARD)

    def send_backward_recv_forward(self, grad: torch.Tensor) -> torch.Tensor:
        """Send a gradient and receive the next activation in one step, deadlock-free.

        Raises as ``send_backward``; ``RankError`` on a rank in both grids' boundaries.
        """
        self._refuse_both("send_backward_recv_forward", BACKWARD, "send_forward and send_backward")
        return self._received(self._transfer("send_backward_recv_forward", {BACKWARD: grad}, {FORWARD}), FORWARD)

    def destroy(self) -> None:
        """Forget the agreed bridge and the learned shapes (the next transfer agrees again); on every participant.

        The bridge holds no process group (its transfers run on the default
        group), so there is nothing else to release. Idempotent.
        """
        self._ledger.release(self.src._core.registry.world)
        if self._agreed:
            self._epoch += 1
        self._agreed = False
        self._meta = {FORWARD: None, BACKWARD: None}
        self._plans.clear()

    # -- the machinery ---------------------------------------------------------

    @staticmethod
    def _rank() -> int:
        return dist.get_rank() if dist.is_initialized() else 0

    def _refuse_both(self, call: str, direction: str, instead: str) -> None:
        senders, receivers = self._ranks[direction]
        if self._rank() in senders and self._rank() in receivers:
            raise RankError(
                f"{call}: rank {self._rank()} is on the boundary of both grids of {self!r}; call {instead} there, "
                "which does both halves in one step"
            )

    def _received(self, results: dict[str, torch.Tensor | None], direction: str) -> torch.Tensor:
        tensor = results[direction]
        assert tensor is not None
        return tensor

    def _held(self, direction: str, side: int, meta: Meta) -> tuple[tuple[int, int], tuple[int, int] | None]:
        layout = self._sides[direction][side][0]
        seq = None if self.seq_dim is None else meta.shape[self.seq_dim]
        return held_slice(layout, self._rank(), meta.shape[self.batch_dim], seq, self.roles)

    def _local_shape(self, direction: str, side: int, meta: Meta) -> list[int]:
        layout = self._sides[direction][side][0]
        return bridge_plan.local_shape(layout, self._rank(), meta.shape, self.batch_dim, self.seq_dim, self.roles)

    def _global(self, call: str, direction: str, tensor: object) -> Meta:
        """The global tensor a sender's slice belongs to; checks it before any communication."""
        if not isinstance(tensor, torch.Tensor):
            raise refuse(call, "tensor" if direction == FORWARD else "grad", tensor, "a torch.Tensor")
        needed = max(self.batch_dim, self.seq_dim or 0) + 1
        if tensor.dim() < needed:
            raise InvalidArgumentError(
                f"{call}: a tensor of shape {list(tensor.shape)} has no dim {needed - 1} "
                f"(batch_dim={self.batch_dim}, seq_dim={self.seq_dim})"
            )
        layout = self._sides[direction][0][0]
        shape = bridge_plan.global_shape(layout, tuple(tensor.shape), self.batch_dim, self.seq_dim, self.roles)
        return Meta(shape, tensor.dtype)

    def _plan(self, call: str, direction: str, meta: Meta) -> tuple[Piece, ...]:
        if (direction, meta) not in self._plans:
            (sender, s_stage), (receiver, r_stage) = self._sides[direction]
            seq = None if self.seq_dim is None else meta.shape[self.seq_dim]
            self._plans[(direction, meta)] = plan_transfer(
                sender, receiver, batch=meta.shape[self.batch_dim], seq=seq,
                sender_stage=s_stage, receiver_stage=r_stage, roles=self.roles, what=call,
            )  # fmt: skip
        return self._plans[(direction, meta)]

    def _agree(self, call: str) -> None:
        if self._agreed or not self.guard:
            self._agreed = True
            return
        world = self.src._core.world_for(call)
        if self._ordinal is None:
            self._ordinal = world.job.ordinal("bridge")
        settings = (
            ("batch_dim", repr(self.batch_dim)),
            ("seq_dim", repr(self.seq_dim)),
            ("variable_shapes", repr(self.variable_shapes)),
            ("roles", repr((self.roles.dp, self.roles.cp, self.roles.pp))),
            ("checked", repr(self.checked)),
        )
        request = CreationRequest(
            grid=f"bridge {self.src._core.describe()} -> {self.dst._core.describe()}", keys=("bridge",), strategy="p2p",
            grid_sequence=0, grid_ordinal=self._ordinal, epoch=self._epoch, settings=settings,
        )  # fmt: skip
        scope = grid_scope("bridge", self._ordinal, self._epoch, 0, None)
        timeout = min(self.src.guard_timeout_s, self.dst.guard_timeout_s)
        started = time.monotonic()
        if agree(world, request, self.participants, scope, timeout, self.src.guard_progress_s, self._ledger):
            # The commit deletes the round's keys once every participant read the verdict (as a creation's does).
            settle(world, f"{scope.prefix}/commit", self.participants, started, timeout, "the bridge", self._ledger)
        self._agreed = True

    def _transfer(self, call: str, sends: dict[str, Any], recvs: set[str]) -> dict[str, torch.Tensor | None]:
        """One call: check, agree (first time), the headers, every piece; an error on every participant or none."""
        rank = self._rank()
        for direction in (*sends, *recvs):
            side = 0 if direction in sends else 1
            if rank not in self._ranks[direction][side]:
                grid, stage = ("src", "last") if (direction == FORWARD) == (side == 0) else ("dst", "first")
                raise RankError(f"{call}: rank {rank} is not on the {stage} pipeline stage of {grid} in {self!r}")
        alarm = None if not dist.is_initialized() else self.src._core.world_for(call).alarm
        if alarm is not None:
            alarm.check(call)
        said: dict[str, Meta | Refusal] = {}
        own: InvalidArgumentError | None = None  # this sender's refusal: raised here once the others know of it
        for direction, tensor in sends.items():
            said[direction], error = self._said(call, direction, tensor)
            own = own or error
        if own is not None and not dist.is_initialized():
            raise own  # no peer to tell
        tensors = {d: tensor.detach() for d, tensor in sends.items() if isinstance(said[d], Meta)}  # data, no graph
        self._agree(call)
        device = transfer.device_for(self.device, tensors)
        directions = [d for d in (FORWARD, BACKWARD) if d in sends or d in recvs]
        fixed = {d: None if self.variable_shapes else self._meta[d] for d in directions}
        ops, inbox = transfer.header_ops({d: self._ranks[d] for d in directions}, said, rank, device)
        first = self.checked or any(meta is None for meta in fixed.values())
        if first:  # the receivers need the shapes before they can post their receives: headers in a batch alone
            run_p2p(alarm, ops, f"{call} (shape header) over {self!r}")
            agreed, ops = transfer.verdict(f"{call} over {self!r}", rank, said, inbox, fixed, own), []
        else:  # a fixed shape: the headers ride with the data, and a refusing sender sends zeros in its place
            agreed = {d: meta for d, meta in fixed.items() if meta is not None}
        results: dict[str, torch.Tensor | None] = {FORWARD: None, BACKWARD: None}
        placing = []
        for direction in directions:  # forward pieces first on every rank: messages pair up in order
            meta = agreed[direction]
            pieces = self._plan(call, direction, meta)
            sent = received = None
            if direction in sends:
                rows, positions = self._held(direction, 0, meta)
                local = tensors.get(direction)
                if local is None:
                    local = torch.zeros(self._local_shape(direction, 0, meta), dtype=meta.dtype, device=device)
                sent = (local, (rows[0], positions[0] if positions else 0))
            if direction in recvs:
                rows, positions = self._held(direction, 1, meta)
                target = torch.empty(self._local_shape(direction, 1, meta), dtype=meta.dtype, device=device)
                received = (target, (rows[0], positions[0] if positions else 0))
                results[direction] = target
            mine, buffers = transfer.pieces_ops(pieces, rank, self.slicer, sent, received)
            ops += mine
            if received is not None:
                placing.append((buffers, received))
        run_p2p(alarm, ops, f"{call} over {self!r}")
        if not first:  # the headers that rode with the data: on a refusal, what came is dropped
            transfer.verdict(f"{call} over {self!r}", rank, said, inbox, fixed, own)
        for buffers, (target, origin) in placing:
            transfer.place(buffers, self.slicer, target, origin)
        self._meta.update(agreed)
        return results

    def _said(self, call: str, direction: str, tensor: object) -> tuple[Meta | Refusal, InvalidArgumentError | None]:
        """What a sender's header says of ``tensor``: its global `Meta`, or a `Refusal` and its error (local)."""
        try:
            meta = self._global(call, direction, tensor)
        except InvalidArgumentError as error:
            return Refusal(1), error
        reason = transfer.carried(meta)
        if reason:
            what = f"dtype {meta.dtype}" if reason == 2 else f"{len(meta.shape)} dims"
            return Refusal(reason), InvalidArgumentError(f"{call}: a tensor of {what}: {transfer.REASONS[reason]}")
        if self.checked:  # every participant compares the headers with the fixed shape and plans, together
            return meta, None
        fixed = self._meta[direction]
        if fixed is not None and not self.variable_shapes and fixed != meta:
            assert isinstance(tensor, torch.Tensor)
            local = self._local_shape(direction, 0, fixed)
            return Refusal(4, meta), InvalidArgumentError(
                f"{call}: got a tensor of shape {list(tensor.shape)} {str(tensor.dtype).removeprefix('torch.')}, "
                f"expected {local} {str(fixed.dtype).removeprefix('torch.')} (this bridge's first transfer fixed it; "
                "build it with variable_shapes=True for shapes that change)"
            )
        try:
            self._plan(call, direction, meta)  # a batch (or sequence) the receivers' dp (cp) does not divide
        except InvalidArgumentError as error:
            return Refusal(5, meta), error
        return meta, None
