"""Spawned-rank scenarios for hierarchical families: within/across node halves, the node group, the guard.

Workers pretend to run on nodes of ``per_node`` ranks (``LOCAL_WORLD_SIZE``,
``LOCAL_RANK`` and, for placement reports, the host name); they return raw
group memberships and all_reduce results, and the tests compute what to expect.
"""

from __future__ import annotations

import os
import socket
from typing import Any

import torch
import torch.distributed as dist

from hypergrid import HyperCommGrid, HyperGridError

DIMS = ["tp", "cp", "dp"]  # a [2, 2, 2] grid: with nodes of 4, a node is a tp x cp block
FAMILIES = ["tp", "dp", "cp-tp", "dp-tp", "cp-dp", "cp-dp-tp"]


def pretend_nodes(per_node: int, hosts: bool = True) -> None:
    """Set LOCAL_WORLD_SIZE / LOCAL_RANK (and the host name) as a launcher on nodes of ``per_node`` would."""
    rank = dist.get_rank()
    os.environ["LOCAL_WORLD_SIZE"] = str(per_node)
    os.environ["LOCAL_RANK"] = str(rank % per_node)
    if hosts:
        name = f"node{rank // per_node}"
        socket.gethostname = lambda: name  # type: ignore[assignment]


def _error(call: Any) -> str:
    try:
        call()
    except HyperGridError as error:
        return f"{type(error).__name__}: {error}"
    return "no error"


def _reduced(group: dist.ProcessGroup | None) -> float | None:
    if group is None:
        return None
    value = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(value, group=group)
    return float(value.item())


def halves_scenarios(strategy: str) -> dict[str, Any]:
    """Every family's within and across halves on nodes of 4, the node group, a hierarchical all-reduce."""
    pretend_nodes(4)
    rank = dist.get_rank()
    grid = HyperCommGrid([2, 2, 2], DIMS, strategy=strategy)
    out: dict[str, Any] = {"halves": {}}
    for family in FAMILIES:
        for scope in ("within", "across"):
            half = {scope: "node"}
            group = grid.create_pg(family, **half)
            assert group is not None
            out["halves"][f"{family}|{scope}"] = {
                "ranks": dist.get_process_group_ranks(group),
                "sum": _reduced(group),
                "lookup": grid.get_pg(family, **half) is group and grid.pg(family, **half) is group,
            }
    node = grid.node_group()
    out["node"] = {"ranks": dist.get_process_group_ranks(node) if node else None, "sum": _reduced(node)}
    # A hierarchical all-reduce over dp-tp: reduce within each node, then across nodes; equals the flat one.
    value = torch.tensor([float(rank + 1) ** 2])
    dist.all_reduce(value, group=grid.get_pg("dp-tp", within="node"))
    dist.all_reduce(value, group=grid.get_pg("dp-tp", across="node"))
    flat = torch.tensor([float(rank + 1) ** 2])
    dist.all_reduce(flat, group=grid.create_pg("dp-tp"))
    out["hierarchical"], out["flat"] = float(value.item()), float(flat.item())
    # The grid's three-step hierarchical all-reduce against the flat one: any size, non-contiguous, MAX on ints.
    out["hier_allreduce"] = {}
    for key in ("dp-tp", "dp-cp-tp", "tp", "dp"):
        values = torch.arange(7 * 3, dtype=torch.float64).reshape(7, 3).t() * (rank + 1)  # non-contiguous
        expected = values.clone()
        grid.hierarchical_all_reduce(values, key)
        dist.all_reduce(expected, group=grid.pg(key))
        ints = torch.tensor([rank * 7 % 5, rank], dtype=torch.int64)
        top = ints.clone()
        grid.hierarchical_all_reduce(ints, key, op=dist.ReduceOp.MAX)
        dist.all_reduce(top, op=dist.ReduceOp.MAX, group=grid.pg(key))
        out["hier_allreduce"][key] = {
            "sum": values.tolist(),
            "flat": expected.tolist(),
            "max": ints.tolist(),
            "flat_max": top.tolist(),
        }
    # tp fits in a node: its within half is the tp family's group itself (shared, nothing new created).
    out["tp_shared"] = grid.pg("tp") is grid.get_pg("tp", within="node")
    # A view's own family: expert parallel ep=2 innermost, expert data parallel edp=4 over the same 8 ranks.
    grid.register_view("expert", [2, 4], ["ep", "edp"])
    for scope in ("within", "across"):
        group = grid.pg("edp", view="expert", **{scope: "node"})
        out["halves"][f"expert:edp|{scope}"] = dist.get_process_group_ranks(group) if group else None
    out["created_keys"] = [str(key) for key in grid.created_keys]
    out["errors"] = {
        "exists": _error(lambda: grid.create_pg("dp", within="node")),
        "both": _error(lambda: grid.create_pg("dp", within="node", across="node")),
        "level": _error(lambda: grid.create_pg("dp", within="rack")),
    }
    grid.destroy()
    # Explicit ranks_per_node (2): dp-cp split inside nodes of 2, LOCAL_WORLD_SIZE ignored.
    other = HyperCommGrid([2, 4], ["tp", "dp"], strategy=strategy)
    groups = other.create_pgs(["dp", "dp-tp"], across="node", ranks_per_node=2)
    out["explicit"] = {key: dist.get_process_group_ranks(group) for key, group in groups.items() if group}
    other.destroy()
    return out


def mismatch_scenario(strategy: str) -> str:
    """Rank 0 believes in nodes of 2, the others in nodes of 4: the guard must catch it where it matters."""
    rank = dist.get_rank()
    os.environ["LOCAL_WORLD_SIZE"] = "2" if rank == 0 else "4"
    grid = HyperCommGrid([2, 2], ["tp", "dp"], strategy=strategy, guard_timeout_s=10)
    return _error(lambda: grid.create_pg("dp", within="node"))


def node_size_scenarios() -> dict[str, str]:
    """A half is cut once: other node sizes later are refused; a sub-grid's outsiders take part, then raise."""
    rank = dist.get_rank()
    os.environ["LOCAL_WORLD_SIZE"] = "2"
    out = {}
    grid = HyperCommGrid([2, 2], ["tp", "dp"])
    grid.create_pg("dp", within="node", ranks_per_node=4)
    out["explicit"] = _error(lambda: grid.hierarchical_all_reduce(torch.ones(3), "dp", ranks_per_node=2))
    out["pg"] = _error(lambda: grid.pg("dp", within="node", ranks_per_node=2))
    out["no_half"] = _error(lambda: grid.pg("dp", ranks_per_node=2))
    out["mixed"] = _error(lambda: grid.hierarchical_all_reduce(torch.ones(3), "dp"))  # across: LOCAL_WORLD_SIZE=2
    grid.destroy()
    sub = HyperCommGrid([2, 1], ["tp", "dp"])  # ranks 0-1 of the world of 4
    value = torch.full((5,), float(rank + 1))
    out["sub"] = _error(lambda: sub.hierarchical_all_reduce(value, "dp-tp"))
    out["sub_value"] = str(value.tolist())
    sub.destroy()
    return out


def placement_scenario(layout_of_hosts: str) -> dict[str, Any]:
    """Families of the [2, 2, 2] grid and a placement report, on hosts laid out as ``layout_of_hosts``.

    ``"blocks"``: two hosts of 4 consecutive ranks, as LOCAL_WORLD_SIZE=4 says;
    ``"round_robin"``: two hosts taking ranks in turn, against LOCAL_WORLD_SIZE=4;
    ``"real"``: this machine's one host name, nothing pretended (LOCAL_WORLD_SIZE=8 from spawn).
    """
    from hypergrid.topology import Tier, Topology

    rank = dist.get_rank()
    if layout_of_hosts == "blocks":
        pretend_nodes(4)
    elif layout_of_hosts == "round_robin":
        os.environ["LOCAL_WORLD_SIZE"] = "4"
        os.environ["LOCAL_RANK"] = str(rank // 2)
        name = f"node{rank % 2}"
        socket.gethostname = lambda: name  # type: ignore[assignment]
    grid = HyperCommGrid([2, 2, 2], DIMS)
    grid.create_pgs(["tp", "dp", "dp-tp"])
    grid.create_pg("dp", across="node", ranks_per_node=4)
    nodes_of_4 = Topology([Tier("nvlink", 4, 370e9, 3e-6), Tier("ib", None, 47e9, 8e-6)])
    out = {
        "plain": grid.placement_report().to_dict(),
        "priced": grid.placement_report(nodes_of_4).to_dict(),
        "h100": grid.placement_report("h100_8x").to_dict(),
        "assume_2": grid.placement_report(ranks_per_node=2).to_dict(),
        "text": str(grid.placement_report(nodes_of_4)),
        "host": socket.gethostname(),
    }
    grid.destroy()
    return out
