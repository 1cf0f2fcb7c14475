"""``StepSnapshots``: the training state at the start of the last steps, so that survivors resume from one agreed step.

``grid.shrink(snapshots=...)`` agrees on the lowest step any survivor is in, and every survivor goes back to its
state at the start of that step: its own snapshot, or a replica peer's over the shrink's ``dim`` (`share_step`; a
drafted spare has none). Why two snapshots are enough: docs/design/recovery.md ("The step agreement"); what a
snapshot holds: docs/elastic.md ("Resuming at one step").
"""

from __future__ import annotations

import pickle
from collections.abc import Iterable
from typing import Any

import torch
import torch.distributed as dist

from hypergrid.errors import InvalidArgumentError, RankFailure
from hypergrid.validation import check_int, refuse

__all__ = ["MAX_STEP", "StepSnapshots", "share_step"]

#: The largest step (the step agreement's int64 keeps one value above it for "none").
MAX_STEP = 2**62 - 1

#: A tensor's place in a flattened state: its shape, dtype and device type.
Slot = tuple[str, tuple[int, ...], torch.dtype, str]


def _flatten(value: Any, tensors: list[torch.Tensor]) -> Any:
    """``value`` with every tensor replaced by its descriptor (appended to ``tensors`` in order)."""
    if isinstance(value, torch.Tensor):
        tensors.append(value)
        return ("tensor", tuple(value.shape), value.dtype, value.device.type)
    if isinstance(value, dict):
        return ("dict", tuple((key, _flatten(item, tensors)) for key, item in value.items()))
    if isinstance(value, (list, tuple)):
        return ("list" if isinstance(value, list) else "tuple", tuple(_flatten(item, tensors) for item in value))
    return ("value", value)


def _unflatten(skeleton: Any, tensors: Iterable[torch.Tensor]) -> Any:
    """The value `_flatten` took apart, its tensors taken from ``tensors`` in order."""
    stream = iter(tensors)

    def build(node: Any) -> Any:
        kind, body = node[0], node[1]
        if kind == "tensor":
            return next(stream)
        if kind == "dict":
            return {key: build(item) for key, item in body}
        if kind in ("list", "tuple"):
            items = [build(item) for item in body]
            return items if kind == "list" else tuple(items)
        return body

    return build(skeleton)


def _is_stateful(holder: object) -> bool:
    return callable(getattr(holder, "state_dict", None)) and callable(getattr(holder, "load_state_dict", None))


class _Snapshot:
    """One step's state: the skeleton (the structure, its plain values, each tensor's descriptor) and the tensors."""

    def __init__(self, step: int, skeleton: Any, tensors: list[torch.Tensor]) -> None:
        self.step = step
        self.skeleton = skeleton
        self.tensors = tensors


class StepSnapshots:
    """The training state at the start of the last ``keep`` steps, for an agreed resumption after a failure.

    Call `take` at the start of every step; pass the object to
    ``grid.shrink(snapshots=...)`` (and a spare's ``grid.standby(snapshots=...)``):
    the survivors agree on a step (``Regrid.step``), every rank of the new grid
    gets the state of that step (its own snapshot, or a replica peer's over
    the shrink's ``dim``), and the holders are loaded with it.

    Args:
        holders: what a step changes: objects with ``state_dict`` and ``load_state_dict`` (a module, an
            optimizer, a scheduler) or tensors (their values are copied, in place on restore).
        keep: how many steps to keep (2: a survivor may be one step ahead of the agreed one).

    Raises:
        InvalidArgumentError: a holder that is neither stateful nor a tensor, or a bad ``keep``.

    Examples:
        >>> import torch
        >>> w = torch.zeros(2)
        >>> snapshots = StepSnapshots(w)
        >>> for step in range(3):
        ...     snapshots.take(step)
        ...     w += 1
        >>> snapshots.steps, snapshots.restore(1), w.tolist()
        ((1, 2), 1, [1.0, 1.0])
        >>> snapshots.steps
        (1,)
    """

    def __init__(self, *holders: object, keep: int = 2) -> None:
        self.keep = check_int("StepSnapshots", "keep", keep, 1, 1024)
        flat: list[object] = []
        for holder in holders:
            if isinstance(holder, (list, tuple)):
                flat.extend(holder)
            else:
                flat.append(holder)
        for holder in flat:
            if not isinstance(holder, torch.Tensor) and not _is_stateful(holder):
                raise refuse(
                    "StepSnapshots",
                    "holders",
                    holder,
                    "tensors or objects with state_dict() and load_state_dict() (a module, an optimizer)",
                    InvalidArgumentError,
                )
        self.holders = flat
        self._snapshots: list[_Snapshot] = []

    @property
    def step(self) -> int | None:
        """The step of the newest snapshot: the step this rank is in (None before the first `take`)."""
        return self._snapshots[-1].step if self._snapshots else None

    @property
    def steps(self) -> tuple[int, ...]:
        """The steps held, oldest first (consecutive)."""
        return tuple(snapshot.step for snapshot in self._snapshots)

    def _current(self) -> tuple[Any, list[torch.Tensor]]:
        tensors: list[torch.Tensor] = []
        states = [holder if isinstance(holder, torch.Tensor) else holder.state_dict() for holder in self.holders]  # type: ignore[attr-defined]
        return _flatten(states, tensors), tensors

    def take(self, step: int) -> None:
        """Keep the holders' state as the start of ``step`` (the oldest snapshot goes beyond ``keep``).

        ``step`` is the next one (the newest + 1), or a step already held
        (its snapshot and any newer are replaced); anything else starts over.

        Raises:
            InvalidArgumentError: ``step`` is not a non-negative int.
        """
        step = check_int("StepSnapshots.take", "step", step, 0, MAX_STEP)
        held = self.steps
        if step in held:
            reuse = self._snapshots[held.index(step) :]
            del self._snapshots[held.index(step) :]
        elif held and step == held[-1] + 1:
            reuse = self._snapshots[: max(len(held) + 1 - self.keep, 0)]
            del self._snapshots[: len(reuse)]
        else:
            reuse, self._snapshots = self._snapshots, []
        skeleton, tensors = self._current()
        buffers = next((old.tensors for old in reuse if old.skeleton == skeleton), None)
        with torch.no_grad():
            if buffers is None:
                buffers = [tensor.detach().clone() for tensor in tensors]
            else:
                for buffer, tensor in zip(buffers, tensors):
                    buffer.copy_(tensor)
        self._snapshots.append(_Snapshot(step, skeleton, buffers))

    def clear(self) -> None:
        """Forget every step held (the holders keep their values): a process that comes back into the grid (``arrive``
        on a rank a shrink retired) resumes from the agreed step, copied from a replica, not from its own past.

        Examples:
            >>> import torch
            >>> snapshots = StepSnapshots(torch.zeros(1))
            >>> snapshots.take(0); snapshots.clear(); snapshots.steps
            ()
        """
        self._snapshots.clear()

    def restore(self, step: int) -> int:
        """Load the snapshot of ``step`` into the holders and forget newer ones; returns ``step``.

        The holders' gradients are cleared (a failed step may have left some).

        Raises:
            InvalidArgumentError: ``step`` is not held.
        """
        step = check_int("StepSnapshots.restore", "step", step, 0, MAX_STEP)
        held = self.steps
        if step not in held:
            raise refuse("StepSnapshots.restore", "step", step, f"a step held: {list(held)}", InvalidArgumentError)
        snapshot = self._snapshots[held.index(step)]
        del self._snapshots[held.index(step) + 1 :]
        states = _unflatten(snapshot.skeleton, snapshot.tensors)
        with torch.no_grad():
            for holder, state in zip(self.holders, states):
                # The failed step's gradients go too: a redone backward would add to them.
                if isinstance(holder, torch.Tensor):
                    holder.copy_(state)
                    holder.grad = None
                elif isinstance(holder, torch.nn.Module):
                    holder.load_state_dict(state)  # copies into the parameters
                    holder.zero_grad(set_to_none=True)
                else:  # an optimizer keeps the tensors it is given: it gets copies, the snapshot stays intact
                    inner: list[torch.Tensor] = []
                    holder.load_state_dict(_unflatten(_flatten(state, inner), [t.clone() for t in inner]))  # type: ignore[attr-defined]
                    if isinstance(holder, torch.optim.Optimizer):
                        holder.zero_grad(set_to_none=True)
        return step

    def check_matches(self, call: str) -> None:
        """Refuse, before anything communicates, holders that no longer match the snapshots (a tensor whose shape,
        dtype or device changed, an entry added or gone since the newest `take`): a restore would fail half way.

        Raises:
            InvalidArgumentError: naming the first entry that differs, with what was taken and what is there now.

        Examples:
            >>> import torch
            >>> model = torch.nn.Linear(3, 5)
            >>> snapshots = StepSnapshots(model); snapshots.take(0); snapshots.check_matches("shrink")
            >>> model.weight = torch.nn.Parameter(torch.zeros(7, 11))
            >>> snapshots.check_matches("shrink")
            Traceback (most recent call last):
              ...
            hypergrid.errors.InvalidArgumentError: shrink: snapshots= no longer match the model: holder 0['weight'] ...
        """
        if not self._snapshots:
            return  # (a spare's: nothing taken, nothing to restore)
        newest = self._snapshots[-1]
        found = _difference(newest.skeleton, self._current()[0], "")
        if found is not None:
            where, then, now = found
            raise InvalidArgumentError(
                f"{call}: snapshots= no longer match the model: {where.strip() or 'the state'} is {now}; the "
                f"snapshot of step {newest.step} holds {then} (its state changed shape since the last take(): "
                "restore the model as it was, or take() again before the next step)"
            )

    @property
    def holds_state(self) -> bool:
        """Whether the newest snapshot holds anything (a snapshot taken with no holders, or received from a peer that
        had none, holds nothing: the elastic loop's mark of a set-up that did not finish)."""
        return bool(self._snapshots) and bool(self._snapshots[-1].skeleton[1])

    def handed_to(self, *holders: object) -> StepSnapshots:
        """A `StepSnapshots` over ``holders`` with this one's snapshots (same ``keep``), the newest loaded into them.

        For a state received before the model existed: a spare or an arrival waits with a `StepSnapshots` of no
        holders, is sent the agreed step's state by a replica peer, then builds its model for the coordinates it
        was given and takes that state over.

        Raises:
            InvalidArgumentError: nothing is held, or the number of holders differs.

        Examples:
            >>> import torch
            >>> received = StepSnapshots()
            >>> received._adopt(4, ("list", (("tensor", (2,), torch.float32, "cpu"),)), [torch.ones(2)])
            >>> w = torch.zeros(2)
            >>> received.handed_to(w).steps, w.tolist()
            ((4,), [1.0, 1.0])
        """
        if not self._snapshots:
            raise InvalidArgumentError("StepSnapshots.handed_to: no snapshot is held (nothing was received)")
        handed = StepSnapshots(*holders, keep=self.keep)
        newest = self._snapshots[-1]
        if len(handed.holders) != len(newest.skeleton[1]):
            raise InvalidArgumentError(
                f"StepSnapshots.handed_to: {len(handed.holders)} holder(s) given; the snapshot of step {newest.step} "
                f"holds {len(newest.skeleton[1])}"
            )
        handed._snapshots = list(self._snapshots)
        handed.restore(newest.step)  # (a module whose shapes differ refuses in its load_state_dict)
        return handed

    def _adopt(self, step: int, skeleton: Any, tensors: list[torch.Tensor]) -> None:
        """A state received from a peer becomes the snapshot of ``step`` (the only one held)."""
        self._snapshots = [_Snapshot(step, skeleton, tensors)]

    def _get(self, step: int) -> _Snapshot | None:
        return next((snapshot for snapshot in self._snapshots if snapshot.step == step), None)


def _shown(node: Any) -> str:
    if node[0] == "tensor":
        shape, dtype, device = node[1], str(node[2]).replace("torch.", ""), node[3]
        return f"a tensor of shape {tuple(shape)}, {dtype} on {device}"
    if node[0] == "value":
        return f"the value {node[1]!r}"
    return f"a {node[0]} of {len(node[1])} entries"


def _difference(then: Any, now: Any, where: str) -> tuple[str, str, str] | None:
    """The first place where two skeletons (`_flatten`'s) differ: (where, what it was, what it is), or None."""
    if then[0] != now[0] or (then[0] == "tensor" and then != now):
        return where, _shown(then), _shown(now)
    if then[0] == "dict":
        mine, theirs = dict(then[1]), dict(now[1])
        for key in [*mine, *[key for key in theirs if key not in mine]]:
            if key not in mine or key not in theirs:
                gone = key not in theirs
                return f"{where}[{key!r}]", "it" if gone else "nothing", "gone" if gone else "new"
            found = _difference(mine[key], theirs[key], f"{where}[{key!r}]")
            if found is not None:
                return found
        return None
    if then[0] in ("list", "tuple"):
        if len(then[1]) != len(now[1]):
            return where, _shown(then), _shown(now)
        for index, (old, new) in enumerate(zip(then[1], now[1])):
            label = f"holder {index}" if not where else f"{where}[{index}]"
            found = _difference(old, new, label)
            if found is not None:
                return found
    return None


def _wire_device(group: Any) -> torch.device:
    """Where a broadcast over ``group`` needs its tensors: the host unless only an accelerator backend serves it."""
    backend = str(dist.get_backend(group))
    if backend in ("gloo", "mpi", "ucc", "fake") or "cpu:" in backend:
        return torch.device("cpu")
    return torch.device("cuda", torch.cuda.current_device())


def _local(device_type: str) -> torch.device:
    return torch.device("cuda", torch.cuda.current_device()) if device_type == "cuda" else torch.device(device_type)


def _no_holder(step: int, dim: str, flags: list[int]) -> str:
    """Why no member of a ``dim`` group holds ``step``: no replica at all (a group of one), or too few snapshots.

    Examples:
        >>> _no_holder(4, "dp", [0])
        "resuming at step 4: this rank's 'dp' group has no other member (dp has size 1), so no replica holds the ..."
    """
    if len(flags) == 1:
        return (
            f"resuming at step {step}: this rank's {dim!r} group has no other member ({dim} has size 1), so no "
            "replica holds the step's state for a rank that lacks it (a drafted spare, an arrival): restore it from "
            f"a checkpoint, or give {dim!r} 2 or more"
        )
    return (
        f"resuming at step {step}: no replica of this rank's {dim!r} group holds that step (flags {flags}); keep "
        "more snapshots (StepSnapshots(keep=...))"
    )


def share_step(grid: Any, dim: str, snapshots: StepSnapshots, step: int) -> bool:
    """Give the snapshot of ``step`` to the members of this rank's ``dim`` group that lack it; True if this rank did.

    Collective over the caller's group of the family over ``dim`` (every
    rank of ``grid`` calls it). The members' flags are gathered; where some
    lack the step, the lowest member that holds it broadcasts its snapshot
    (the structure, then each tensor) and every other member adopts it.

    Raises:
        RankFailure: no member of the group holds ``step`` (keep more snapshots), or a member is gone.
    """
    holds = torch.tensor([int(snapshots._get(step) is not None)], dtype=torch.int64)
    group = grid.pg(dim)
    wire = _wire_device(group)
    flags = grid.all_gather(holds.to(wire), dim).tolist()
    if all(flags):
        return False
    if not any(flags):
        raise RankFailure(_no_holder(step, dim, flags), [])
    source = flags.index(1)
    mine = snapshots._get(step) if grid.group_rank(dim) == source else None  # the sender's; the others receive
    size = torch.zeros(1, dtype=torch.int64, device=wire)
    if mine is not None:
        payload = torch.frombuffer(bytearray(pickle.dumps(mine.skeleton)), dtype=torch.uint8).to(wire)
        size += payload.numel()
    grid.broadcast(size, dim, group_src=source)
    if mine is None:
        payload = torch.empty(int(size.item()), dtype=torch.uint8, device=wire)
    grid.broadcast(payload, dim, group_src=source)
    skeleton = mine.skeleton if mine is not None else pickle.loads(payload.cpu().numpy().tobytes())
    slots: list[Slot] = []
    _slots(skeleton, slots)
    received = []
    for index, (_, shape, dtype, device) in enumerate(slots):
        tensor = mine.tensors[index].to(wire) if mine is not None else torch.empty(shape, dtype=dtype, device=wire)
        grid.broadcast(tensor, dim, group_src=source)
        received.append(tensor.to(_local(device)))
    if mine is None:  # every member but the sender holds the sender's state now: the replicas are bitwise equal
        snapshots._adopt(step, skeleton, received)
    return mine is None and not flags[grid.group_rank(dim)]


def _slots(skeleton: Any, out: list[Slot]) -> None:
    kind, body = skeleton[0], skeleton[1]
    if kind == "tensor":
        out.append(skeleton)
    elif kind == "dict":
        for _, item in body:
            _slots(item, out)
    elif kind in ("list", "tuple"):
        for item in body:
            _slots(item, out)
