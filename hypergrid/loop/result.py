"""What the elastic loop hands back: one `LoopResult` per rank, with the `WorldChange` list it went through.

Also the replica check at the finish line: every member of a replica group hashes its state, and the digests are
compared over the group (32 bytes each, whatever the model's size).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._pytree import tree_leaves

from hypergrid.launch.processes import default_device

__all__ = ["LoopResult", "WorldChange", "replicas_equal", "state_digest"]


@dataclass(frozen=True)
class WorldChange:
    """One re-formation of the world, as this rank saw it (the loop's ``LoopResult.history``).

    Attributes:
        step: the step every rank of the new grid resumed at (0 with ``setup_again``).
        world: the new world's size, spares included.
        shape: the new grid's shape, by dim name.
        dead: the old world's ranks found dead (empty when the world only grew).
        arrived: the new ranks of the processes that joined (growing back).
        rank: this process's rank in the new world.
        setup_again: a rank's set-up had not finished: every rank ran ``setup`` again on the new grid.
    """

    step: int
    world: int
    shape: dict[str, int]
    dead: tuple[int, ...]
    arrived: tuple[int, ...]
    rank: int
    setup_again: bool = False


@dataclass
class LoopResult:
    """One rank's outcome of `hypergrid.ElasticLoop.run`.

    Attributes:
        first_rank: this process's rank when it started (the launcher's ``RANK``; a replacement's is the dead
            worker's).
        rank: its rank in the final world; ``None`` when it retired or was released.
        coord: its final coordinates (``grid.my_coord()``); ``None`` when it retired or was released.
        step: the steps completed (``steps`` on a rank that finished; where it left on one that retired).
        retired: a shrink removed its slice of the replica dim and no growth took it back.
        released: a spare or an arrival that the job never drafted (released at the end).
        history: every re-formation of the world it went through, oldest first.
        replicas_equal: at the finish line, whether every member of its replica group held a bitwise-equal
            state (None where it did not finish).
        state: what ``setup`` returned on this rank (the model, the optimizer, ...), at the final step.
        last: what the last call of ``step`` returned on this rank (e.g. the loss).
        shape: the final grid's shape, by dim name (empty where it did not finish).
        world: the final world's size, spares included (0 where it did not finish).
    """

    first_rank: int
    rank: int | None = None
    coord: Any = None
    step: int = 0
    retired: bool = False
    released: bool = False
    history: list[WorldChange] = field(default_factory=list)
    replicas_equal: bool | None = None
    state: Any = None
    last: Any = None
    shape: dict[str, int] = field(default_factory=dict)
    world: int = 0

    @property
    def finished(self) -> bool:
        """Whether this rank crossed the finish line (neither retired nor released)."""
        return not self.retired and not self.released


def state_digest(holders: list[Any]) -> bytes:
    """SHA-256 over the holders' state: every tensor's bytes and every other value's ``repr``, in order.

    Examples:
        >>> import torch
        >>> state_digest([torch.zeros(2)]) == state_digest([torch.zeros(2)]) != state_digest([torch.ones(2)])
        True
    """
    digest = hashlib.sha256()
    states = [holder if isinstance(holder, torch.Tensor) else holder.state_dict() for holder in holders]
    for leaf in tree_leaves(states):
        if isinstance(leaf, torch.Tensor):
            flat = leaf.detach().cpu().contiguous().reshape(-1)
            digest.update(str((tuple(leaf.shape), leaf.dtype)).encode())
            digest.update(flat.view(torch.uint8).numpy().tobytes() if flat.numel() else b"")
        else:
            digest.update(repr(leaf).encode())
    return digest.digest()


def replicas_equal(grid: Any, dim: str, holders: list[Any]) -> bool:
    """Collective over the caller's group of ``dim``: whether every member's state has the same digest."""
    mine = torch.frombuffer(bytearray(state_digest(holders)), dtype=torch.int64).to(default_device())
    gathered = grid.all_gather(mine, dim).reshape(-1, mine.numel())
    return bool((gathered == gathered[0]).all().item())
