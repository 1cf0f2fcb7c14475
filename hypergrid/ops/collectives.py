"""Collectives on a family: all-reduce, all-gather, reduce-scatter, broadcast and barrier over any dims.

Each method runs on the caller's group over ``dims``, fetched through the
grid's lazy accessor ``pg(dims)``: the family is created on first use, so
the first call is also a collective creation (every rank that takes part in
creation calls it, for the same dims, in the same order; the guard checks
that). A rank outside the grid takes part in that creation, then raises
``RankError``: torch reads a missing group as the whole world, so hypergrid
never hands one on.

Chunks and concatenations follow the family's group order: group rank ``i``
is the ``i``-th rank of ``grid.group_ranks(dims)`` (ascending global ranks).

With checked collectives on (``hypergrid.ops.checks``), each method creates
the family (on first use) and compares the call across the group first, then
checks its arguments: an argument wrong on one rank only then raises on every
rank instead of leaving the others waiting.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from hypergrid.binding.facet import Facet, caller_rank, member_pg
from hypergrid.binding.failures import Watched, communicate
from hypergrid.binding.registry import guard_key
from hypergrid.errors import InvalidArgumentError
from hypergrid.layout import Dims
from hypergrid.ops.checks import (
    all_gather_single,
    check_collectives_flag,
    check_reduce_op,
    compare_call,
    compare_calls,
    signature,
)
from hypergrid.ops.tensors import check_tensor, tensor_dim
from hypergrid.validation import check_bool
from hypergrid.values import is_int, shown

__all__ = ["Collectives", "check_collectives_flag"]

#: The two halves of a hierarchy as ``(within, across)`` arguments.
_HALVES = (("within", ("node", None)), ("across", (None, "node")))

# torch 2.13 renamed the single-tensor collectives; older releases (>= 2.4) have only the old names.
_reduce_scatter_single: Any = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


class Collectives(Facet):
    """Collectives on the caller's group of any family (a facet object of ``HyperCommGrid``)."""

    def _chunk_dim(self, tensor: torch.Tensor, dims: Dims, dim: int, what: str) -> tuple[int, int]:
        """``(dim, chunk size)`` for splitting ``tensor`` along ``dim`` into one chunk per group member."""
        index = tensor_dim(tensor, dim, what)
        members = self.layout.group_size(dims)
        size = tensor.shape[index]
        if size % members:
            raise InvalidArgumentError(
                f"{what} over dims {shown(dims)}: dim {dim} of a tensor of shape {list(tensor.shape)} has size {size}, "
                f"which does not divide into {members} equal chunks (the group size)"
            )
        return index, size // members

    def own_chunk(self, tensor: torch.Tensor, dims: Dims, dim: int = 0) -> torch.Tensor:
        """The caller's chunk of ``tensor`` split along ``dim`` in the family's group order (no communication).

        The chunk is a view; it is what ``reduce_scatter`` leaves on this rank,
        before the reduction.

        Raises:
            DimsError: unknown, repeated or no dims.
            InvalidArgumentError: a bad ``dim``, or a size along it that the group size does not divide.
            RankError: the caller is outside the grid.

        Examples:
            >>> import torch, torch.distributed as dist
            >>> from hypergrid import HyperCommGrid
            >>> dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
            >>> HyperCommGrid([1, 1], ["tp", "dp"]).own_chunk(torch.arange(4), "tp").tolist()
            [0, 1, 2, 3]
            >>> dist.destroy_process_group()
        """
        index, chunk = self._chunk_dim(tensor, dims, dim, "own_chunk")
        position = self.layout.group_ranks(dims, caller_rank(None)).index(caller_rank(None))
        return tensor.narrow(index, position * chunk, chunk)

    def all_reduce(
        self, tensor: torch.Tensor, dims: Dims, op: dist.ReduceOp.RedOpType = dist.ReduceOp.SUM, async_op: bool = False
    ) -> Watched | None:
        """Reduce ``tensor`` in place over the caller's group of the family over ``dims``.

        Args:
            tensor: the tensor, reduced in place.
            dims: the family (a name, a key like ``"dp-tp"``, or a list of names).
            op: the reduction (``torch.distributed.ReduceOp``).
            async_op: return torch's work handle instead of waiting.

        Returns:
            With ``async_op=True`` a work handle (torch's, wrapped) whose ``wait()``
            raises ``RankFailure`` if a peer is gone; else ``None``.

        Raises:
            DimsError: unknown, repeated or no dims.
            InvalidArgumentError: ``tensor`` is not a tensor, or ``op`` not a ``ReduceOp``.
            RankError: the caller is outside the grid.
            CollectiveMismatchError: (checked collectives) the members' calls differ.
            RankFailure: a member is gone (torch's error is its ``__cause__``).

        Examples:
            >>> import torch, torch.distributed as dist
            >>> from hypergrid import HyperCommGrid
            >>> dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
            >>> grid, x = HyperCommGrid([1, 1], ["tp", "dp"]), torch.ones(2)
            >>> grid.all_reduce(x, "dp-tp"); x.tolist()
            [1.0, 1.0]
            >>> grid.destroy(); dist.destroy_process_group()
        """
        compare_call(self._core.grid, "all_reduce", dims, tensor, op)
        check_tensor(tensor, "all_reduce")
        check_reduce_op(op, "all_reduce")
        check_bool("all_reduce", "async_op", async_op)
        group = member_pg(self._core.grid, dims, "all_reduce")
        what, alarm = f"all_reduce over {shown(dims)}", self._alarm("all_reduce")
        work: Watched | None = communicate(alarm, what, dist.all_reduce, tensor, op=op, group=group, async_op=async_op)
        return work

    def all_gather(self, tensor: torch.Tensor, dims: Dims, dim: int = 0) -> torch.Tensor:
        """The members' ``tensor``s concatenated along ``dim`` in the family's group order.

        Every member passes a tensor of the same shape; the result's size along
        ``dim`` is the group size times the input's.

        Raises:
            DimsError: unknown, repeated or no dims.
            InvalidArgumentError: not a dense tensor, or a bad ``dim``.
            RankError: the caller is outside the grid.
            CollectiveMismatchError: (checked collectives) the members' calls differ.
            RankFailure: a member is gone (torch's error is its ``__cause__``).

        Examples:
            >>> import torch, torch.distributed as dist
            >>> from hypergrid import HyperCommGrid
            >>> dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
            >>> grid = HyperCommGrid([1], ["tp"])
            >>> grid.all_gather(torch.ones(2, 3), "tp", dim=1).shape
            torch.Size([2, 3])
            >>> grid.destroy(); dist.destroy_process_group()
        """
        compare_call(self._core.grid, "all_gather", dims, tensor, None, dim)
        index = tensor_dim(check_tensor(tensor, "all_gather", dense=True), dim, "all_gather")
        group = member_pg(self._core.grid, dims, "all_gather")
        moved = tensor.movedim(index, 0).contiguous()
        out = moved.new_empty((self.layout.group_size(dims) * moved.shape[0], *moved.shape[1:]))
        communicate(
            self._alarm("all_gather"), f"all_gather over {shown(dims)}", all_gather_single, out, moved, group=group
        )
        return out.movedim(0, index).contiguous()

    def reduce_scatter(
        self, tensor: torch.Tensor, dims: Dims, op: dist.ReduceOp.RedOpType = dist.ReduceOp.SUM, dim: int = 0
    ) -> torch.Tensor:
        """Reduce ``tensor`` over the group and return the caller's chunk along ``dim`` (group order).

        Raises:
            DimsError: unknown, repeated or no dims.
            InvalidArgumentError: not a dense tensor, ``op`` not a ``ReduceOp``, a bad
                ``dim``, or a size along ``dim`` that the group size does not divide.
            RankError: the caller is outside the grid.
            CollectiveMismatchError: (checked collectives) the members' calls differ.
            RankFailure: a member is gone (torch's error is its ``__cause__``).

        Examples:
            >>> import torch, torch.distributed as dist
            >>> from hypergrid import HyperCommGrid
            >>> dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
            >>> grid = HyperCommGrid([1], ["tp"])
            >>> grid.reduce_scatter(torch.arange(4.0), "tp").tolist()
            [0.0, 1.0, 2.0, 3.0]
            >>> grid.destroy(); dist.destroy_process_group()
        """
        compare_call(self._core.grid, "reduce_scatter", dims, tensor, op, dim)
        check_reduce_op(op, "reduce_scatter")
        index, chunk = self._chunk_dim(check_tensor(tensor, "reduce_scatter", dense=True), dims, dim, "reduce_scatter")
        group = member_pg(self._core.grid, dims, "reduce_scatter")
        moved = tensor.movedim(index, 0).contiguous()
        out = moved.new_empty((chunk, *moved.shape[1:]))
        alarm = self._alarm("reduce_scatter")
        communicate(alarm, f"reduce_scatter over {shown(dims)}", _reduce_scatter_single, out, moved, op=op, group=group)
        return out.movedim(0, index).contiguous()

    def broadcast(self, tensor: torch.Tensor, dims: Dims, group_src: int = 0, async_op: bool = False) -> Watched | None:
        """Broadcast ``tensor`` in place from group rank ``group_src`` of the caller's group over ``dims``.

        ``group_src`` is a position in the family's group order (0 is
        ``grid.src_rank(dims)``); it is turned into the global rank torch expects.

        Returns:
            With ``async_op=True`` a work handle (torch's, wrapped) whose ``wait()``
            raises ``RankFailure`` if a peer is gone; else ``None``.

        Raises:
            DimsError: unknown, repeated or no dims.
            InvalidArgumentError: not a tensor, or ``group_src`` not in ``0 .. group_size-1``.
            RankError: the caller is outside the grid.
            CollectiveMismatchError: (checked collectives) the members' calls differ.
            RankFailure: a member is gone (torch's error is its ``__cause__``).

        Examples:
            >>> import torch, torch.distributed as dist
            >>> from hypergrid import HyperCommGrid
            >>> dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
            >>> grid = HyperCommGrid([1], ["tp"])
            >>> grid.broadcast(torch.ones(1), "tp", group_src=1)  # doctest: +ELLIPSIS
            Traceback (most recent call last):
              ...
            hypergrid.errors.InvalidArgumentError: broadcast over dims 'tp': group_src=1 is not a rank ...
            >>> grid.destroy(); dist.destroy_process_group()
        """
        compare_call(self._core.grid, "broadcast", dims, tensor, None, group_src)
        check_tensor(tensor, "broadcast")
        check_bool("broadcast", "async_op", async_op)
        members = self.layout.group_size(dims)
        if not is_int(group_src) or not 0 <= group_src < members:
            raise InvalidArgumentError(
                f"broadcast over dims {shown(dims)}: group_src={shown(group_src)} is not a rank of the group "
                f"(expected an int in 0..{members - 1})"
            )
        group = member_pg(self._core.grid, dims, "broadcast")
        src = self.layout.group_ranks(dims, dist.get_rank())[group_src]
        what, alarm = f"broadcast over {shown(dims)}", self._alarm("broadcast")
        work: Watched | None = communicate(alarm, what, dist.broadcast, tensor, src=src, group=group, async_op=async_op)
        return work

    def barrier(self, dims: Dims, async_op: bool = False) -> Watched | None:
        """Wait until every member of the caller's group over ``dims`` reaches it.

        Returns:
            With ``async_op=True`` a work handle (torch's, wrapped) whose ``wait()``
            raises ``RankFailure`` if a peer is gone; else ``None``.

        Raises:
            DimsError: unknown, repeated or no dims.
            RankError: the caller is outside the grid.
            RankFailure: a member is gone (torch's error is its ``__cause__``).

        Examples:
            >>> import torch.distributed as dist
            >>> from hypergrid import HyperCommGrid
            >>> dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
            >>> grid = HyperCommGrid([1], ["tp"])
            >>> grid.barrier("tp")
            >>> grid.destroy(); dist.destroy_process_group()
        """
        check_bool("barrier", "async_op", async_op)
        compare_call(self._core.grid, "barrier", dims, None)
        group = member_pg(self._core.grid, dims, "barrier")
        alarm = self._alarm("barrier")
        work: Watched | None = communicate(
            alarm, f"barrier over {shown(dims)}", dist.barrier, group=group, async_op=async_op
        )
        return work

    def hierarchical_all_reduce(
        self,
        tensor: torch.Tensor,
        dims: Dims,
        op: dist.ReduceOp.RedOpType = dist.ReduceOp.SUM,
        ranks_per_node: int | None = None,
    ) -> None:
        """All-reduce ``tensor`` in place over the family in three steps: inside nodes, across, inside again.

        Reduce-scatter over the family's members on this node
        (``within="node"``), all-reduce each shard across nodes
        (``across="node"``), all-gather inside the node: the result equals
        ``all_reduce`` over ``dims`` (up to floating-point order), while only
        ``1/k`` of the bytes (``k`` members per node) cross the network. Both
        halves are created on first use (collective then; see
        ``docs/hierarchy.md``); nodes are ``ranks_per_node`` consecutive ranks,
        default ``LOCAL_WORLD_SIZE``. Any size works (the shards are padded);
        the tensor may be non-contiguous.

        With checked collectives on, the call is compared over both halves
        (two small gathers: inside the node, then across).

        Args:
            tensor: the tensor, overwritten in place with the reduction.
            dims: the family (a name, a key like ``"dp-tp"``, or a list of names).
            op: the reduction (``torch.distributed.ReduceOp``).
            ranks_per_node: consecutive ranks per node (default ``LOCAL_WORLD_SIZE``).

        Returns:
            ``None``: the result is in ``tensor`` (as ``all_reduce`` without ``async_op``).

        Raises:
            DimsError: unknown, repeated or no dims.
            InvalidArgumentError: not a dense tensor whose elements have memory of
                their own (not sparse, not expanded), ``op`` not a ``ReduceOp``,
                or nodes that cut the grid unevenly.
            WorldSizeError: no ``ranks_per_node`` and no ``LOCAL_WORLD_SIZE``.
            RankError: the caller is outside the grid.
            CollectiveMismatchError: (checked collectives) the members' calls differ.
            RankFailure: a member is gone (torch's error is its ``__cause__``).

        Examples:
            >>> import torch, torch.distributed as dist
            >>> from hypergrid import HyperCommGrid
            >>> dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
            >>> grid, x = HyperCommGrid([1, 1], ["tp", "dp"]), torch.arange(5.0)
            >>> grid.hierarchical_all_reduce(x, "dp-tp", ranks_per_node=8); x.tolist()
            [0.0, 1.0, 2.0, 3.0, 4.0]
            >>> grid.destroy(); dist.destroy_process_group()
        """
        what, per_node = "hierarchical_all_reduce", {"ranks_per_node": ranks_per_node}
        checking = self._core.root.check_collectives
        if not checking:
            check_tensor(tensor, what, dense=True, written=True)
            check_reduce_op(op, what)
        self._core.grid.pg(dims, across="node", **per_node)  # every rank takes part in both creations before any raises
        inner = member_pg(self._core.grid, dims, what, within="node", **per_node)
        outer = member_pg(self._core.grid, dims, what, across="node", **per_node)
        cuts = {
            half: self._core.node_size_of(self._core.key(dims, None, None, *scope), None, "node")
            for half, scope in _HALVES
        }
        if cuts["within"] != cuts["across"]:
            raise InvalidArgumentError(
                f"the halves of {shown(dims)} were cut for different node sizes (within: {cuts['within']} "
                f"ranks per node, "
                f"across: {cuts['across']}); destroy() the grid's groups and create both with one ranks_per_node"
            )
        if checking:
            halves = [
                (inner, guard_key(self._core.key(dims, None, None, "node", None))),
                (outer, guard_key(self._core.key(dims, None, None, None, "node"))),
            ]
            family = guard_key(self._core.key(dims, None, None, None, None))
            compare_calls(self._core.grid, family, halves, signature(what, tensor, op), tensor, what, dims)
            check_tensor(tensor, what, dense=True, written=True)
            check_reduce_op(op, what)
        k, count = dist.get_world_size(inner), tensor.numel()
        flat = tensor.detach().reshape(-1)
        buffer = torch.cat([flat, flat.new_zeros(-count % k)])  # a copy, padded to k equal shards
        shard = buffer.new_empty(buffer.numel() // k)
        over, alarm = f"{what} over {shown(dims)}", self._alarm(what)
        communicate(alarm, over, _reduce_scatter_single, shard, buffer, op=op, group=inner)
        communicate(alarm, over, dist.all_reduce, shard, op=op, group=outer)
        communicate(alarm, over, all_gather_single, buffer, shard, group=inner)
        with torch.no_grad():
            tensor.copy_(buffer[:count].view(tensor.shape))
