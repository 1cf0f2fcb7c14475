"""An independent reference of Megatron-Core 0.19's process groups, written from its documented algorithms.

Nothing here imports hypergrid (``members`` reads torch's groups). Sources (megatron/core/parallel_state.py, read,
not copied): ``RankGenerator`` and the docstring of
``generate_masked_orthogonal_rank_groups`` (rank = sum of coordinate times the
prefix product of the sizes in order; a group varies the masked coordinates,
the first masked one fastest, and groups are numbered by the unmasked ones, the
first fastest), ``_inject_gtp_remat_axis``, the group loops of
``initialize_model_parallel`` (distributed-optimizer runs, hierarchical groups
of ``create_hierarchical_groups``, embedding ranks), ``create_all_gather_groups``'
documented intent (same ranks as the data-parallel groups) and the getters
``use_mpu_process_groups`` calls.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from typing import Any

NAMES = ("tp", "pp", "dp", "ep", "cp", "gtp_remat")  # the order RankGenerator appends missing names in


def tokens(order: str, after: str) -> list[str]:
    """Megatron's generator order: gtp_remat put after ``after`` (else after tp, else first), missing names appended."""
    toks = order.split("-")
    if "gtp_remat" not in toks:
        anchor = after if after in toks else "tp"
        toks.insert(toks.index(anchor) + 1 if anchor in toks else 0, "gtp_remat")
    return toks + [name for name in NAMES if name not in toks]


def groups(order: Sequence[str], sizes: dict[str, int], token: str, offset: int = 0) -> list[list[int]]:
    """The groups of ``token`` (dims joined by '-'), members and groups in the documented order."""
    shape = [sizes[name] for name in order]
    stride = [math.prod(shape[:i]) for i in range(len(shape))]
    masked = [i for i, name in enumerate(order) if name in token.split("-")]
    unmasked = [i for i in range(len(order)) if i not in masked]

    def fastest_first(dims: list[int]) -> list[tuple[int, ...]]:
        # itertools.product varies the LAST position fastest: reverse, then read back.
        return [tuple(reversed(c)) for c in itertools.product(*(range(shape[i]) for i in reversed(dims)))]

    out = []
    for outer in fastest_first(unmasked):
        base = offset + sum(c * stride[i] for c, i in zip(outer, unmasked))
        out.append([base + sum(c * stride[i] for c, i in zip(inner, masked)) for inner in fastest_first(masked)])
    return out


def hierarchical(ranks: list[int], sizes: Sequence[int]) -> list[list[list[int]]]:
    """create_hierarchical_groups: level l holds the members whose l-th digit (mixed radix, sizes) varies."""
    levels = []
    for level, size in enumerate(sizes):
        below = math.prod(sizes[:level])
        above = math.prod(sizes[level + 1 :])
        levels.append(
            [[ranks[a * size * below + s * below + u] for s in range(size)] for a in range(above) for u in range(below)]
        )
    return levels


def accepted(
    world: int, tp: int, pp: int, cp: int, ep: int, etp: int, gtp: int, egtp: int, n: int, order: str,
    hcp: Sequence[int] | None,
) -> bool:  # fmt: skip
    """Whether initialize_model_parallel accepts these sizes (its asserts and RuntimeErrors)."""
    if (gtp > 1 or egtp > 1) and n > 1:
        return False
    model = tp * pp * cp * gtp
    if world % model or world % (etp * ep * pp * egtp):
        return False
    dp, edp = world // model, world // (etp * ep * pp * egtp)
    if not (order.endswith("pp") or pp == 1 or edp == dp):
        return False
    dense_order, expert_order = tokens(order, "tp"), tokens(order, "ep")
    dense = dict(tp=tp, pp=pp, dp=dp, ep=1, cp=cp, gtp_remat=gtp)
    expert = dict(tp=etp, pp=pp, dp=edp, ep=ep, cp=1, gtp_remat=egtp)
    if groups(dense_order, dense, "pp") != groups(expert_order, expert, "pp"):
        return False
    if (dp * cp) % n or edp % n:
        return False
    return hcp is None or math.prod(hcp) == cp


def reference(
    world: int, tp: int, pp: int, cp: int, ep: int, etp: int, gtp: int, egtp: int, n: int, order: str,
    hcp: Sequence[int] | None, all_gather: bool,
) -> dict[str, Any]:  # fmt: skip
    """Field -> its groups (lists of ranks), None where Megatron leaves it None; ``hcp``: one list per level."""
    dp, edp = world // (tp * pp * cp * gtp), world // (etp * ep * pp * egtp)
    d_order, e_order = tokens(order, "tp"), tokens(order, "ep")
    dense = dict(tp=tp, pp=pp, dp=dp, ep=1, cp=cp, gtp_remat=gtp)
    expert = dict(tp=etp, pp=pp, dp=edp, ep=ep, cp=1, gtp_remat=egtp)

    def d(token: str) -> list[list[int]]:
        return groups(d_order, dense, token)

    def e(token: str) -> list[list[int]]:
        return groups(e_order, expert, token)

    out: dict[str, Any] = {
        "tp": d("tp"), "pp": d("pp"), "mp": d("tp-gtp_remat-pp"), "cp": d("cp"), "tp_cp": d("tp-cp"),
        "dp": d("dp"), "dp_cp": d("dp-cp"), "tp_dp_cp": d("tp-gtp_remat-dp-cp"), "gtp_remat": d("gtp_remat"),
        "dp_cp_gtp_remat": d("gtp_remat-dp-cp") if gtp > 1 else d("dp-cp"),
        "ep": e("ep"), "expt_tp": e("tp"), "tp_ep": e("tp-ep"), "tp_ep_pp": e("tp-ep-pp"),
        "tp_ep_pp_with_egtp_remat": e("tp-ep-gtp_remat-pp"), "expt_dp": e("dp"), "expt_gtp_remat": e("gtp_remat"),
        "expt_dp_gtp_remat": e("gtp_remat-dp") if egtp > 1 else e("dp"),
    }  # fmt: skip
    stages = d("pp")
    out["embd"] = [[g[0], g[-1]] if len(g) > 1 else [g[0]] for g in stages]
    out["pos_embd"] = [[g[0]] for g in stages]
    out["hcp"] = None
    if hcp is not None:
        per_cp_group = [hierarchical(g, hcp) for g in d("cp")]
        out["hcp"] = [[g for levels in per_cp_group for g in levels[level]] for level in range(len(hcp))]
    if n == 1:
        out["intra_dp_cp"], out["intra_expt_dp"], out["inter_dist_opt"] = out["dp_cp"], out["expt_dp"], None
    else:
        run = dp * cp // n
        out["intra_dp_cp"] = [g[i : i + run] for g in d("dp-cp") for i in range(0, len(g), run)]
        split = [hierarchical(g, [edp // n, n]) for g in e("dp")]
        out["intra_expt_dp"] = [group for levels in split for group in levels[0]]
        out["inter_dist_opt"] = [group for levels in split for group in levels[1]]
    if gtp > 1 or egtp > 1:
        out["intra_dist_opt"] = [sorted(r for g in e("tp-ep-pp") for r in g)]
    else:
        per = edp // n  # edp / n consecutive tp-ep-pp groups make one instance
        model_groups = e("tp-ep-pp")
        out["intra_dist_opt"] = [
            sorted(r for g in model_groups[i : i + per] for r in g) for i in range(0, len(model_groups), per)
        ]
    out["dp_cp_ag"] = out["dp_cp"] if all_gather else None
    out["expt_dp_ag"] = out["expt_dp"] if all_gather and ep > 1 else None
    return out


def members(value: Any) -> Any:
    """What a collection's field holds on this rank, as sorted ranks (a list per level for hcp; None stays)."""
    import torch.distributed as dist

    if value is None:
        return None
    if isinstance(value, list):
        return [members(group) for group in value]
    return sorted(dist.get_process_group_ranks(value))


def mine(field_groups: Any, rank: int) -> Any:
    """The sorted members of the group holding ``rank`` (None: none does); for ``hcp``, one per level."""
    if field_groups is None:
        return None
    if field_groups and isinstance(field_groups[0][0], list):  # hcp: levels
        found = [mine(level, rank) for level in field_groups]
        return None if None in found else found
    return next((sorted(group) for group in field_groups if rank in group), None)
