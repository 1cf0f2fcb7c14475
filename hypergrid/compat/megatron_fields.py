"""Which groups fill each field of Megatron-Core 0.19's ``ProcessGroupCollection`` (pure: no torch call).

Read from ``megatron/core/parallel_state.py`` (``initialize_model_parallel``,
``create_all_gather_groups``) and ``process_groups_config.py``
(``use_mpu_process_groups``). Every field is a family of the dense grid, of
its expert view, or of a view that splits one of their dims:

- dense (``tp``, ``gtp_remat``, ``cp``, ``dp``, ``pp``): ``mp`` is
  tp-gtp_remat-pp, ``tp_dp_cp`` tp-gtp_remat-dp-cp, ``dp_cp_gtp_remat``
  gtp_remat-dp-cp; expert (``etp``, ``ep``, ``egtp_remat``, ``edp``, ``pp``):
  ``tp_ep_pp_with_egtp_remat`` is etp-ep-egtp_remat-pp, ``expt_dp_gtp_remat``
  egtp_remat-edp.
- With ``n`` distributed-optimizer instances, Megatron cuts each dp-cp group
  (ranks ascending) into ``n`` runs of consecutive members (``intra_dp_cp``),
  each expert-dp group likewise (``intra_expt_dp``), takes the members with the
  same place in their run (``inter_dist_opt``), and joins ``edp / n`` consecutive
  tp-ep-pp groups (``intra_dist_opt``: the whole grid when ``n`` is 1).
  ``split_family`` finds the view where such runs are a family.
- ``hcp``: the cp groups cut level by level (``create_hierarchical_groups``),
  the families of cp split into the given sizes, innermost first.

Examples:
    >>> split_family([2, 2, 4], ["tp", "cp", "dp"], ["cp", "dp"], 4)
    ([2, 2, 2, 2], ['tp', 'cp', 'dp_intra', 'dp_inter'], ('cp', 'dp_intra'), ('dp_inter',))
    >>> split_family([4, 2, 3], ["cp", "pp", "dp"], ["cp", "dp"], 6) is None  # runs of 6 are no family
    True
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["PG_FIELDS", "ProcessGroupCollection", "collection_class", "split_family"]

#: The fields of Megatron-Core 0.19's ``ProcessGroupCollection``, in its order.
PG_FIELDS = (
    "tp",
    "pp",
    "mp",
    "embd",
    "pos_embd",
    "cp",
    "tp_cp",
    "hcp",
    "ep",
    "expt_tp",
    "tp_ep",
    "tp_ep_pp",
    "tp_ep_pp_with_egtp_remat",
    "tp_dp_cp",
    "dp",
    "dp_cp",
    "dp_cp_gtp_remat",
    "dp_cp_ag",
    "gtp_remat",
    "expt_gtp_remat",
    "expt_dp",
    "expt_dp_gtp_remat",
    "expt_dp_ag",
    "intra_dp_cp",
    "intra_expt_dp",
    "inter_dist_opt",
    "intra_dist_opt",
)

#: Field -> the dense grid's dims of its family (Megatron's dense tokens).
DENSE_FAMILIES: dict[str, tuple[str, ...]] = {
    "tp": ("tp",),
    "pp": ("pp",),
    "cp": ("cp",),
    "dp": ("dp",),
    "gtp_remat": ("gtp_remat",),
    "mp": ("tp", "gtp_remat", "pp"),
    "tp_cp": ("tp", "cp"),
    "dp_cp": ("dp", "cp"),
    "dp_cp_gtp_remat": ("gtp_remat", "dp", "cp"),
    "tp_dp_cp": ("tp", "gtp_remat", "dp", "cp"),
}
#: Field -> the expert view's dims of its family.
EXPERT_FAMILIES: dict[str, tuple[str, ...]] = {
    "ep": ("ep",),
    "expt_tp": ("etp",),
    "expt_dp": ("edp",),
    "expt_gtp_remat": ("egtp_remat",),
    "tp_ep": ("etp", "ep"),
    "tp_ep_pp": ("etp", "ep", "pp"),
    "tp_ep_pp_with_egtp_remat": ("etp", "ep", "egtp_remat", "pp"),
    "expt_dp_gtp_remat": ("egtp_remat", "edp"),
}
#: The names a grid or a view may give each dim, first match wins.
ALIASES: dict[str, tuple[str, ...]] = {
    "gtp_remat": ("gtp_remat", "gtp"),
    "etp": ("etp", "expt_tp", "tp"),
    "edp": ("edp", "expt_dp", "dp"),
    "egtp_remat": ("egtp_remat", "expt_gtp_remat", "egtp", "gtp_remat"),
}
#: Field -> (the field whose group it is, the dim whose size must be 1): Megatron hands out one object.
SAME_WHEN_UNIT = {"dp_cp_gtp_remat": ("dp_cp", "gtp_remat"), "expt_dp_gtp_remat": ("expt_dp", "egtp_remat")}


def present(names: Sequence[str], dims: Sequence[str]) -> tuple[str, ...]:
    """The family's dims as ``names`` spells them; a dim it lacks counts as size 1 and is left out.

    Examples:
        >>> present(["expt_tp", "ep", "expt_dp", "pp"], ("etp", "ep", "egtp_remat", "pp"))
        ('expt_tp', 'ep', 'pp')
    """
    found = []
    for dim in dims:
        spelled = next((alias for alias in ALIASES.get(dim, (dim,)) if alias in names), None)
        if spelled is not None:
            found.append(spelled)
    return tuple(found)


def split_family(
    shape: Sequence[int], names: Sequence[str], dims: Sequence[str], run: int
) -> tuple[list[int], list[str], tuple[str, ...], tuple[str, ...]] | None:
    """A factorization of the same ranks in which runs of ``run`` consecutive members of each group are a family.

    ``shape`` and ``names`` are a layout's (innermost first); ``dims`` a family
    of it, whose groups list their members ascending, as Megatron's do (dims
    of size 1 take no part). The run must divide the group size. One dim of the family is cut in two
    (``<dim>_intra`` inside a run, ``<dim>_inter`` across runs) when the run is
    a mixed-radix prefix of the family's sizes; otherwise, when the family's
    dims are adjacent (only size-1 dims between them), they are merged and the
    merged dim is cut. Returns the view's shape and names, the dims of the
    run's family and the rest of the family's dims; ``None`` where no
    factorization has the runs as a family.

    Examples:
        >>> split_family([4, 3], ["cp", "dp"], ["cp", "dp"], 6)
        ([6, 2], ['cp_dp_intra', 'cp_dp_inter'], ('cp_dp_intra',), ('cp_dp_inter',))
    """
    position = {name: index for index, name in enumerate(names)}
    ordered = sorted((dim for dim in dims if shape[position[dim]] > 1), key=position.__getitem__)  # size 1: no part
    sizes = [shape[position[name]] for name in ordered]
    if run < 1 or math.prod(sizes) % run:
        raise ValueError(f"a run of {run} does not divide the family {list(dims)} of sizes {sizes}")
    if not ordered:
        return None
    inside = 1
    for index, (name, size) in enumerate(zip(ordered, sizes)):
        if run % inside == 0 and size % (run // inside) == 0:
            cut = position[name]
            intra, inter = f"{name}_intra", f"{name}_inter"
            view_shape = [*shape[:cut], run // inside, size // (run // inside), *shape[cut + 1 :]]
            view_names = [*names[:cut], intra, inter, *names[cut + 1 :]]
            return view_shape, view_names, (*ordered[:index], intra), (inter, *ordered[index + 1 :])
        inside *= size
    first, last = position[ordered[0]], position[ordered[-1]]
    if any(shape[i] != 1 for i in range(first, last + 1) if names[i] not in ordered):
        return None
    merged = "_".join(ordered)
    intra, inter = f"{merged}_intra", f"{merged}_inter"
    view_shape = [*shape[:first], run, math.prod(sizes) // run, *shape[last + 1 :]]
    return view_shape, [*names[:first], intra, inter, *names[last + 1 :]], (intra,), (inter,)


def hierarchical_view(
    shape: Sequence[int], names: Sequence[str], dim: str, sizes: Sequence[int]
) -> tuple[list[int], list[str], list[str]]:
    """``dim`` cut into ``hcp0``, ``hcp1``, ... of ``sizes`` (innermost first): shape, names, the level dims.

    Examples:
        >>> hierarchical_view([2, 4, 2], ["tp", "cp", "dp"], "cp", [2, 2])
        ([2, 2, 2, 2], ['tp', 'hcp0', 'hcp1', 'dp'], ['hcp0', 'hcp1'])
    """
    cut = list(names).index(dim)
    levels = [f"hcp{index}" for index in range(len(sizes))]
    return [*shape[:cut], *sizes, *shape[cut + 1 :]], [*names[:cut], *levels, *names[cut + 1 :]], levels


def embedding_ranks(stages: Sequence[Sequence[int]]) -> tuple[list[list[int]], list[list[int]]]:
    """Megatron's default embedding groups (first and last stage) and position-embedding groups (first).

    Examples:
        >>> embedding_ranks([[0, 4], [1, 5]]), embedding_ranks([[0, 2, 4]])
        (([[0, 4], [1, 5]], [[0], [1]]), ([[0, 4]], [[0]]))
    """
    ordered = [sorted(group) for group in stages]
    embd = [[group[0], group[-1]] if len(group) > 1 else [group[0]] for group in ordered]
    return embd, [[group[0]] for group in ordered]


@dataclass
class ProcessGroupCollection:
    """Megatron-Core 0.19's ``ProcessGroupCollection`` fields, for where megatron-core is not installed.

    Every field holds the calling rank's group (``hcp``: a list, one per level),
    or ``None`` (not a member, or not built).
    """

    tp: Any = None
    pp: Any = None
    mp: Any = None
    embd: Any = None
    pos_embd: Any = None
    cp: Any = None
    tp_cp: Any = None
    hcp: Any = None
    ep: Any = None
    expt_tp: Any = None
    tp_ep: Any = None
    tp_ep_pp: Any = None
    tp_ep_pp_with_egtp_remat: Any = None
    tp_dp_cp: Any = None
    dp: Any = None
    dp_cp: Any = None
    dp_cp_gtp_remat: Any = None
    dp_cp_ag: Any = None
    gtp_remat: Any = None
    expt_gtp_remat: Any = None
    expt_dp: Any = None
    expt_dp_gtp_remat: Any = None
    expt_dp_ag: Any = None
    intra_dp_cp: Any = None
    intra_expt_dp: Any = None
    inter_dist_opt: Any = None
    intra_dist_opt: Any = None


def collection_class() -> type:
    """Megatron-Core's ``ProcessGroupCollection`` when megatron-core imports, else hypergrid's stand-in.

    Examples:
        >>> collection_class().__name__
        'ProcessGroupCollection'
    """
    try:
        module = importlib.import_module("megatron.core.process_groups_config")
    except ImportError:
        return ProcessGroupCollection
    real: type = module.ProcessGroupCollection
    return real
