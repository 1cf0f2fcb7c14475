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

import importlib
from typing import Any

import torch.distributed as dist

from hypergrid.errors import DependencyError

__all__ = ["setup_model_state"]


def _megatron(module: str) -> Any:
    try:
        return importlib.import_module(module)
    except ImportError as error:
        raise DependencyError(
            f"setup_model_state needs megatron-core ({module} does not import: {error}); "
            "pip install megatron-core (0.19 needs Python >= 3.12)"
        ) from error


def _rank_in(group: Any) -> int:
    """The caller's rank in ``group``; 0 where it holds none (a size-1 axis, as Megatron reports)."""
    return 0 if group is None else int(dist.get_rank(group))


def _size(group: Any) -> int:
    return 0 if group is None else int(dist.get_world_size(group))


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
        DependencyError: (an ``ImportError``) megatron-core does not import.
    """
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
