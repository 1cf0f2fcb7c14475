"""What a Megatron-Core model built from a ``ProcessGroupCollection`` needs besides groups.

``initialize_model_parallel`` also makes Megatron's global memory buffer
(``get_global_memory_buffer()``, which ``DotProductAttention`` and the sequence
parallel gathers read), and training scripts then call
``model_parallel_cuda_manual_seed(seed)``, which seeds the model-parallel RNG
tracker from ranks it reads in ``parallel_state``. A collection carries no
such state: ``setup_model_state(pgs, seed=...)`` makes both from the
collection's own groups.
"""

from __future__ import annotations

from typing import Any

import torch.distributed as dist

from hypergrid.compat.dependency import import_or_refuse
from hypergrid.validation import check_int, public, refuse

__all__ = ["setup_model_state"]


def _megatron(module: str) -> Any:
    return import_or_refuse(
        module, "setup_model_state", "megatron-core", "pip install megatron-core (0.19 needs Python >= 3.12)"
    )


def _rank_in(group: Any) -> int:
    """The caller's rank in ``group``; 0 where it holds none (a size-1 axis, as Megatron reports)."""
    return 0 if group is None else int(dist.get_rank(group))


def _size(group: Any) -> int:
    return 0 if group is None else int(dist.get_world_size(group))


#: The fields of a collection ``setup_model_state`` reads (each None or a process group); the last two may be absent.
_READ = ("tp", "ep", "expt_tp", "gtp_remat", "expt_gtp_remat")


def _check_collection(pgs: object) -> None:
    for name in _READ:
        if not hasattr(pgs, name) and name in _READ[:3]:
            raise refuse("", "pgs", pgs, f"a ProcessGroupCollection (this {type(pgs).__name__} has no {name!r})")
        value = getattr(pgs, name, None)
        if value is not None and not isinstance(value, dist.ProcessGroup):
            raise refuse("", "pgs", pgs, f"a ProcessGroupCollection (its {name!r} is no process group)")


@public
def setup_model_state(pgs: Any, *, seed: int) -> None:
    """Make Megatron's global memory buffer and seed its RNG tracker from ``pgs``, for models built with it.

    **Local**: no communication. The memory buffer is made unless one exists
    (``parallel_state._set_global_memory_buffer()``). The tracker is seeded by
    Megatron's own ``tensor_parallel.model_parallel_cuda_manual_seed(seed,
    tp_rank=, ep_rank=, etp_rank=)`` with the caller's ranks in ``pgs.tp``,
    ``pgs.ep`` and ``pgs.expt_tp``; where ``pgs.gtp_remat`` or
    ``pgs.expt_gtp_remat`` has more than one rank, the weight-rematerialisation
    trackers are added with Megatron's seeds (Megatron reads those ranks from
    its ``parallel_state``, which a collection does not fill). Everything else
    a model takes from ``pg_collection=``. Megatron seeds through ``torch.cuda``:
    on a machine without CUDA see the marked workarounds in
    ``examples/megatron_gpt.py``.

    Args:
        pgs: a collection from ``process_groups`` (any object with Megatron's field names).
        seed: the seed a training script gives ``model_parallel_cuda_manual_seed``.

    Raises:
        InvalidArgumentError: (a ``ValueError``) ``pgs`` lacks Megatron's fields or holds no process groups
            there, ``seed`` is not an int in torch's seed range (int64; Megatron adds small offsets).
        DependencyError: (an ``ImportError``) megatron-core does not import.
    """
    _check_collection(pgs)
    check_int("", "seed", seed, -(2**63), 2**63 - 1)
    parallel_state = _megatron("megatron.core.parallel_state")
    random = _megatron("megatron.core.tensor_parallel.random")
    if parallel_state._GLOBAL_MEMORY_BUFFER is None:
        parallel_state._set_global_memory_buffer()
    tp_rank, ep_rank, etp_rank = _rank_in(pgs.tp), _rank_in(pgs.ep), _rank_in(pgs.expt_tp)
    random.model_parallel_cuda_manual_seed(seed, tp_rank=tp_rank, ep_rank=ep_rank, etp_rank=etp_rank)
    tracker = random.get_cuda_rng_tracker()
    tensor_seed = seed + 2718 + tp_rank  # Megatron's seeds (tensor_parallel/random.py)
    expert_seed = seed + 1024 + 100 * ep_rank + etp_rank
    gtp = getattr(pgs, "gtp_remat", None)
    if _size(gtp) > 1:
        tracker.add(random._GTP_REMAT_RNG_TRACKER_NAME, tensor_seed + 65536 * (1 + _rank_in(gtp)))
    egtp = getattr(pgs, "expt_gtp_remat", None)
    if _size(egtp) > 1:
        tracker.add(random._EXPERT_GTP_REMAT_RNG_TRACKER_NAME, expert_seed + 32768 + 65536 * (1 + _rank_in(egtp)))
