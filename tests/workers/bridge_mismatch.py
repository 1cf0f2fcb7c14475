"""Worker functions for ``hypergrid.Bridge`` senders that go wrong without checked collectives (spawned, 4 ranks).

Every case: a source ``dp2`` on ranks 0-1 and a destination ``dp2`` on ranks
2-3, collectives unchecked. Each step every sender sends its slice (each case
spoils one step on one sender, or makes the two disagree); the receivers
receive. A step's outcome on each rank is what it got or the error it raised.
The last step of every case is a correct transfer: it must deliver the right
slices, so nothing of the spoiled step was left in flight.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from hypergrid import Bridge, HyperCommGrid, HyperGridError


def _good(rank: int) -> torch.Tensor:
    """Sender ``rank``'s slice of the global ``[4, 2]`` tensor: its rows hold ``rank + 1``."""
    return torch.full((2, 2), rank + 1.0)


#: case -> the tensor each sender (0, 1) sends at each step.
CASES: dict[str, list[dict[int, torch.Tensor]]] = {
    "a dtype the bridge does not carry, first transfer": [
        {0: torch.ones(2, 2, dtype=torch.uint16), 1: _good(1)},
        {0: _good(0), 1: _good(1)},
    ],
    "more than 8 dims, first transfer": [
        {0: torch.ones(2, 1, 1, 1, 1, 1, 1, 1, 1), 1: _good(1)},
        {0: _good(0), 1: _good(1)},
    ],
    "a dtype change after the first transfer": [
        {0: _good(0), 1: _good(1)},
        {0: _good(0), 1: _good(1).double()},
        {0: _good(0), 1: _good(1)},
    ],
    "a shape change after the first transfer": [
        {0: _good(0), 1: _good(1)},
        {0: _good(0), 1: torch.ones(3, 2)},
        {0: _good(0), 1: _good(1)},
    ],
    "senders disagree on the batch, first transfer": [
        {0: _good(0), 1: torch.ones(3, 2)},
        {0: _good(0), 1: _good(1)},
    ],
}


def mismatch(case: str, rank: int) -> list[Any]:
    """Run ``case``'s steps on ``rank``: per step ``("ok", received or None)`` or ``(error class, message)``."""
    src = HyperCommGrid([2], ["dp"], guard_timeout_s=60)
    dst = HyperCommGrid([2], ["dp"], rank_offset=2, guard_timeout_s=60)
    bridge = Bridge(src, dst)
    outcomes: list[Any] = []
    for step in CASES[case]:
        try:
            got = bridge.send_forward(step[rank]) if rank < 2 else bridge.recv_forward()
            outcomes.append(("ok", got))
        except HyperGridError as error:
            outcomes.append((type(error).__name__, str(error)))
    bridge.destroy()
    return outcomes


#: The combined calls' steps: each receiver's gradient (ranks 2, 3), or None for a good one.
COMBINED: list[dict[int, torch.Tensor | None]] = [
    {2: None, 3: None},
    {2: torch.ones(2, 2, dtype=torch.uint16), 3: None},  # the first gradient: refused while headers go first
    {2: None, 3: None},
    {2: None, 3: -torch.ones(2, 2, dtype=torch.float64)},  # the shape is fixed: headers ride with the data
    {2: None, 3: None},
]


def combined(rank: int) -> list[Any]:
    """The combined calls, a receiver's gradient spoiled twice: per step what was received or the error."""
    bridge = Bridge(HyperCommGrid([2], ["dp"]), HyperCommGrid([2], ["dp"], rank_offset=2))
    outcomes: list[Any] = []
    bridge.send_forward(_good(rank)) if rank < 2 else bridge.recv_forward()
    for step in COMBINED:
        try:
            if rank < 2:
                outcomes.append(("ok", bridge.send_forward_recv_backward(_good(rank))))
            else:  # the gradient of the global [4, 2]: rows of receiver 2 hold -1, of receiver 3 -2
                grad = step[rank]
                got = bridge.send_backward_recv_forward(torch.full((2, 2), 1.0 - rank) if grad is None else grad)
                outcomes.append(("ok", got))
        except HyperGridError as error:
            outcomes.append((type(error).__name__, str(error)))
    bridge.recv_backward() if rank < 2 else bridge.send_backward(torch.full((2, 2), 1.0 - rank))
    bridge.destroy()
    return outcomes


def every_mismatch() -> dict[str, list[Any]]:
    """Every case, one after the other on the same 4 ranks (each with bridges of its own), in one spawn."""
    rank = dist.get_rank()
    return {**{case: mismatch(case, rank) for case in CASES}, "combined calls": combined(rank)}
