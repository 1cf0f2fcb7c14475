"""Functions run in spawned gloo processes of the Megatron tier (module level, so spawn can import them)."""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist

from hypergrid.compat.megatron import PG_FIELDS, destroy_process_groups, process_groups, setup_model_state
from tests.compat.megatron_reference import members

warnings.filterwarnings("ignore", message=".*(Apex|absl).*")

#: Megatron's initialize_model_parallel keywords for hypergrid's one-call names.
MEGATRON_KEYWORDS = {
    "tp": "tensor_model_parallel_size",
    "pp": "pipeline_model_parallel_size",
    "cp": "context_parallel_size",
    "ep": "expert_model_parallel_size",
    "etp": "expert_tensor_parallel_size",
    "gtp_remat": "gtp_remat_size",
    "egtp_remat": "expert_gtp_remat_size",
    "distributed_optimizer_instances": "num_distributed_optimizer_instances",
    "hierarchical_cp": "hierarchical_context_parallel_sizes",
    "order": "order",
}


def _megatron_collection(sizes: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Megatron's own: initialize_model_parallel, use_mpu_process_groups, create_all_gather_groups (as
    megatron/training does). Returns the members of every field, and of the AG groups' dp_cp for reference."""
    from megatron.core import parallel_state
    from megatron.core.process_groups_config import ProcessGroupCollection

    parallel_state.initialize_model_parallel(
        **{MEGATRON_KEYWORDS[name]: value for name, value in sizes.items()}, create_gloo_process_groups=False
    )
    pgs = ProcessGroupCollection.use_mpu_process_groups()
    out = {name: members(getattr(pgs, name)) for name in PG_FIELDS}
    try:
        dp_cp_ag, expt_dp_ag = parallel_state.create_all_gather_groups(for_expert_parallelism=sizes.get("ep", 1) > 1)
        ag: dict[str, Any] = {"dp_cp_ag": members(dp_cp_ag), "expt_dp_ag": members(expt_dp_ag)}
    except ValueError as error:  # 0.19.2 with gtp_remat > 1: counts gtp_remat twice, asks for ranks past the world
        ag = {"error": str(error)}
    _destroy_megatron()
    return out, ag


def _destroy_megatron() -> None:
    """Megatron's destroy_model_parallel, and what it leaves behind: its groups alive, the hcp groups set."""
    from megatron.core import parallel_state

    for group in parallel_state._global_process_group_list or []:
        if group is not None:
            dist.destroy_process_group(group)
    parallel_state.destroy_model_parallel()
    parallel_state._HIERARCHICAL_CONTEXT_PARALLEL_GROUPS = None  # 0.19.2 leaves this one set


def oracle(configs: list[dict[str, Any]], state_sizes: dict[str, Any], seed: int) -> dict[str, Any]:
    """For each config: Megatron's members of every field and hypergrid's one call's (all_gather on);
    then ``model_state(state_sizes, seed)``."""
    results = []
    for sizes in configs:
        megatron, ag = _megatron_collection(sizes)
        pgs = process_groups(**sizes, all_gather=True)
        ours = {name: members(getattr(pgs, name)) for name in PG_FIELDS}
        plain = process_groups(**sizes)  # all_gather off: the twins are None, as use_mpu_process_groups leaves them
        ours_plain = {name: members(getattr(plain, name)) for name in ("dp_cp_ag", "expt_dp_ag")}
        destroy_process_groups(plain)
        destroy_process_groups(pgs)
        results.append({"megatron": megatron, "megatron_ag": ag, "hypergrid": ours, "hypergrid_plain": ours_plain})
    return {"configs": results, "state": model_state(state_sizes, seed)}


@contextlib.contextmanager
def cpu_rng() -> Iterator[None]:
    """CPU-ONLY WORKAROUND (test): Megatron's RNG tracker reads and sets the CUDA generator; use the CPU one."""
    saved = torch.cuda.get_rng_state, torch.cuda.manual_seed
    import megatron.core.tensor_parallel.random as random

    saved_set = random._set_cuda_rng_state
    torch.cuda.get_rng_state = lambda *args, **kwargs: torch.get_rng_state()  # type: ignore[assignment]
    torch.cuda.manual_seed = lambda seed: torch.manual_seed(seed)  # type: ignore[assignment]
    random._set_cuda_rng_state = lambda state, *args, **kwargs: torch.set_rng_state(state)
    try:
        yield
    finally:
        torch.cuda.get_rng_state, torch.cuda.manual_seed = saved  # type: ignore[assignment]
        random._set_cuda_rng_state = saved_set


def model_state(sizes: dict[str, Any], seed: int) -> dict[str, Any]:
    """The RNG tracker's states after Megatron's own set-up and after setup_model_state, and the memory buffer."""
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel import random

    out: dict[str, Any] = {}
    with cpu_rng():
        parallel_state.initialize_model_parallel(
            **{MEGATRON_KEYWORDS[name]: value for name, value in sizes.items()}, create_gloo_process_groups=False
        )
        random.model_parallel_cuda_manual_seed(seed)
        out["megatron"] = {name: state.tolist() for name, state in random.get_cuda_rng_tracker().get_states().items()}
        _destroy_megatron()
        parallel_state.destroy_global_memory_buffer()
        pgs = process_groups(**sizes)
        setup_model_state(pgs, seed=seed)
        out["hypergrid"] = {name: state.tolist() for name, state in random.get_cuda_rng_tracker().get_states().items()}
        out["buffer"] = parallel_state.get_global_memory_buffer() is not None
        setup_model_state(pgs, seed=seed)  # again: the buffer is kept, the tracker re-seeded
        destroy_process_groups(pgs)
    return out
