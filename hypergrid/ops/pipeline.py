"""Pipeline helpers: ring neighbours along a dim, the send/recv op lists for ``batch_isend_irecv``, and ``exchange``.

``exchange`` is a pipeline step's communication in one call: every send and
receive posted together in one ``batch_isend_irecv``, then waited on, so two
neighbours that send to each other at the same time (the activation of one
micro-batch forward, the gradient of another backward) cannot deadlock as a
blocking send followed by a receive can.
"""

from __future__ import annotations

import itertools
from typing import Any

import torch
import torch.distributed as dist

from hypergrid.binding.alarm import Alarm
from hypergrid.binding.facet import Facet, caller_rank, member_pg
from hypergrid.binding.failures import peer_failures, wait_works
from hypergrid.errors import InvalidArgumentError
from hypergrid.layout import GridLayout
from hypergrid.ops.checks import compare_call, tensor_code
from hypergrid.validation import refuse
from hypergrid.values import shown

__all__ = ["Pipeline", "run_p2p"]


def run_p2p(alarm: Alarm | None, ops: list[dist.P2POp], what: str) -> None:
    """Post ``ops`` in one ``batch_isend_irecv`` and wait for all of them; a dead peer raises ``RankFailure``.

    ``alarm``: the world's (`hypergrid.binding.alarm.Alarm`), whose news ends the wait (None: no world)."""
    if not ops:
        return
    if alarm is not None:
        alarm.check(what)
    with peer_failures(alarm, what):
        requests = dist.batch_isend_irecv(ops)
    wait_works(alarm, requests, what)


def _checked(what: str, layout: GridLayout, dim: object, *tensors: torch.Tensor | None) -> dict[str, Any]:
    """The p2p arguments by name, next-bound pairs first; checked before any group is created."""
    layout._one_dim(dim)  # one dim, like shift
    named = dict(zip(("send_next", "send_prev", "recv_next", "recv_prev"), tensors))
    for name, tensor in named.items():
        if tensor is not None and not isinstance(tensor, torch.Tensor):
            raise refuse(what, name, tensor, "a torch.Tensor or None")
    return {name: named[name] for name in ("send_next", "recv_prev", "send_prev", "recv_next")}


def _pairs(table: list[list[int]]) -> str | None:
    """Neighbour stages of ``exchange`` (rows in stage order) that would not pair: a send without its receive, or
    a tensor of another shape or dtype; None where every pair matches."""
    for stage, (this, following) in enumerate(itertools.pairwise(table)):
        for sent, received, sender, receiver, words in (
            (this[-4], following[-3], this, following, ("send_next", "recv_prev")),
            (following[-2], this[-1], following, this, ("send_prev", "recv_next")),
        ):
            if sent != received:
                where = f"stage {stage if sender is this else stage + 1} (rank {sender[0]})"
                there = f"stage {stage if receiver is this else stage + 1} (rank {receiver[0]})"
                return (
                    f"do not pair: {words[0]} of {where} is {_what(sent)} but {words[1]} of {there} is "
                    f"{_what(received)}"
                )
    return None


def _what(code: int) -> str:
    return "None" if code == -1 else f"a tensor (shape and dtype #{code})"


class Pipeline(Facet):
    """Previous / next ranks along a dim and point-to-point op lists (a facet object of ``HyperCommGrid``)."""

    def prev_rank(self, dim: str, rank: int | None = None) -> int:
        """The global rank one step before ``rank`` along ``dim``, wrapping around (a ring).

        The ``source`` of ``shift(dim, periodic=True)``; Megatron's
        ``get_pipeline_model_parallel_prev_rank`` for the pipeline dim.

        Raises:
            DimsError: ``dim`` is not one dim of the grid.
            RankError: ``rank`` is outside the grid.

        Examples:
            >>> from hypergrid import HyperCommGrid
            >>> grid = HyperCommGrid([2, 4], ["tp", "pp"])
            >>> grid.prev_rank("pp", rank=1), grid.prev_rank("pp", rank=3)
            (7, 1)
        """
        source = self.layout.shift(dim, caller_rank(rank), 1, True)[0]
        assert source is not None  # periodic: never past an edge
        return source

    def next_rank(self, dim: str, rank: int | None = None) -> int:
        """The global rank one step after ``rank`` along ``dim``, wrapping around (a ring).

        The ``dest`` of ``shift(dim, periodic=True)``; Megatron's
        ``get_pipeline_model_parallel_next_rank`` for the pipeline dim.

        Raises:
            DimsError: ``dim`` is not one dim of the grid.
            RankError: ``rank`` is outside the grid.

        Examples:
            >>> from hypergrid import HyperCommGrid
            >>> grid = HyperCommGrid([2, 4], ["tp", "pp"])
            >>> grid.next_rank("pp", rank=1), grid.next_rank("pp", rank=7)
            (3, 1)
        """
        dest = self.layout.shift(dim, caller_rank(rank), 1, True)[1]
        assert dest is not None
        return dest

    def p2p_ops(
        self,
        dim: str,
        send_next: torch.Tensor | None = None,
        send_prev: torch.Tensor | None = None,
        recv_next: torch.Tensor | None = None,
        recv_prev: torch.Tensor | None = None,
    ) -> list[dist.P2POp]:
        """The ``torch.distributed.P2POp`` list exchanging tensors with the ring neighbours along ``dim``.

        Hand the list to ``torch.distributed.batch_isend_irecv`` and wait on
        the returned requests (torch's own: a dead peer shows there as torch's
        error; ``exchange`` posts and waits for you and raises ``RankFailure``).
        Ops run on the caller's group over ``dim`` (created on first use,
        collectively), with the neighbours' global ranks
        as ``peer``. A stage's ``send_next`` is received by the next stage's
        ``recv_prev``, and ``send_prev`` by the previous stage's ``recv_next``;
        the ops are listed in an order (next-bound traffic first) that matches
        those pairs even on a ring of two, where both neighbours are one rank.

        Args:
            dim: the pipeline dim.
            send_next: tensor to send to ``next_rank(dim)``.
            send_prev: tensor to send to ``prev_rank(dim)``.
            recv_next: buffer to receive from ``next_rank(dim)``.
            recv_prev: buffer to receive from ``prev_rank(dim)``.

        Returns:
            The ops, possibly empty.

        Raises:
            DimsError: ``dim`` is not one dim of the grid.
            InvalidArgumentError: an argument is neither a tensor nor ``None``,
                or a tensor is given on a dim of size 1 (no neighbour but itself).
            RankError: the caller is outside the grid.

        Examples:
            >>> import torch.distributed as dist
            >>> from hypergrid import HyperCommGrid
            >>> dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
            >>> grid = HyperCommGrid([1], ["pp"])
            >>> grid.p2p_ops("pp")
            []
            >>> grid.destroy(); dist.destroy_process_group()
        """
        tensors = _checked("p2p_ops", self.layout, dim, send_next, send_prev, recv_next, recv_prev)
        what = f"p2p_ops along {shown(dim)}"
        self._alarm(what).check(what)
        group = member_pg(self._core.grid, dim, "p2p_ops")
        rank = dist.get_rank()
        given = [name for name, tensor in tensors.items() if tensor is not None]
        if given and self.layout.dim_size(dim) == 1:
            raise InvalidArgumentError(
                f"p2p_ops: dim {shown(dim)} has size 1, so rank {rank} has no neighbour along it; got {given}"
            )
        peers = {"next": self.next_rank(dim, rank), "prev": self.prev_rank(dim, rank)}
        ops = []
        for name, tensor in tensors.items():  # next-bound pairs first: send_next/recv_prev, then the others
            if tensor is not None:
                kind, side = name.split("_")
                op = dist.isend if kind == "send" else dist.irecv
                ops.append(dist.P2POp(op, tensor, peers[side], group))
        return ops

    def exchange(
        self,
        dim: str = "pp",
        *,
        send_next: torch.Tensor | None = None,
        send_prev: torch.Tensor | None = None,
        recv_next: torch.Tensor | None = None,
        recv_prev: torch.Tensor | None = None,
    ) -> None:
        """Post a pipeline step's sends and receives along ``dim`` in one ``batch_isend_irecv``, and wait.

        The arguments are those of ``p2p_ops``; a stage's ``send_next`` arrives
        in the next stage's ``recv_prev``, its ``send_prev`` in the previous
        stage's ``recv_next``. Unlike ``p2p_ops`` the pipeline is open, not a
        ring: on the first stage ``send_prev`` and ``recv_prev`` are ignored
        (the buffer is left as it is), on the last stage ``send_next`` and
        ``recv_next``, so every stage can run the same schedule. Because every
        transfer is posted before any is waited on, neighbours that send to
        each other in the same step cannot deadlock. Collective over the
        family's group (created on first use, also on stages with nothing to
        send); each transfer's partner must call ``exchange`` (or post the
        matching op) with a tensor of the same size and dtype.

        Args:
            dim: the pipeline dim (default ``"pp"``).
            send_next: tensor for the next stage.
            send_prev: tensor for the previous stage.
            recv_next: buffer filled from the next stage.
            recv_prev: buffer filled from the previous stage.

        Returns:
            ``None``; the receive buffers are filled in place.

        Raises:
            DimsError: ``dim`` is not one dim of the grid.
            InvalidArgumentError: an argument is neither a tensor nor ``None``.
            RankError: the caller is outside the grid.
            RankFailure: a neighbour is gone (torch's error is its ``__cause__``).

        Examples:
            >>> import torch, torch.distributed as dist
            >>> from hypergrid import HyperCommGrid
            >>> dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
            >>> grid, x = HyperCommGrid([1], ["pp"]), torch.zeros(2)
            >>> grid.exchange("pp", recv_prev=x, send_next=torch.ones(2)); x.tolist()  # one stage: first and last
            [0.0, 0.0]
            >>> grid.destroy(); dist.destroy_process_group()
        """
        arguments = ("exchange", self.layout, dim, send_next, send_prev, recv_next, recv_prev)
        checking = self._core.root.check_collectives
        if not checking:
            _checked(*arguments)  # before any group is created
        self.layout._one_dim(dim)
        member_pg(self._core.grid, dim, "exchange")  # every stage takes part in the group's creation
        before, after = self.layout.shift(dim, dist.get_rank())
        present = {"prev": before is not None, "next": after is not None}
        given = {"send_next": send_next, "recv_prev": recv_prev, "send_prev": send_prev, "recv_next": recv_next}
        if checking:  # what each stage sends and receives, compared with its neighbours', then checked
            codes = [tensor_code(t) if present[name.split("_")[1]] else -1 for name, t in given.items()]
            compare_call(self._core.grid, "exchange", dim, None, aux=codes, pairing=_pairs)
        tensors = _checked(*arguments)
        kept = {name: t for name, t in tensors.items() if t is not None and present[name.split("_")[1]]}
        what = f"exchange along {shown(dim)}"
        run_p2p(self._alarm(what), self.p2p_ops(dim, **kept), what)
