"""Train a tiny Megatron-Core GPTModel on hypergrid's groups (tp 2 x pp 2, 4 gloo ranks), checked against one process.

    python examples/megatron_gpt.py [--steps 4] [--json PATH]

Needs megatron-core 0.19 (CPython 3.12): ``make test-megatron`` builds that
environment and runs this example (``.ci/megatron-env`` prints its python).

Where ``initialize_model_parallel(tp, pp)`` and
``ProcessGroupCollection.use_mpu_process_groups()`` were, one call:
``pgs = process_groups(tp=2, pp=2)``, then ``setup_model_state(pgs, seed=...)``
for the memory buffer and the RNG tracker. Everything else is Megatron-Core's
own, unmodified, given ``pg_collection=pgs``: ``GPTModel`` (local layer spec,
tied embeddings), ``DistributedDataParallel``, ``get_megatron_optimizer``
(Adam, gradient clipping), ``P2PCommunicator`` and the 1F1B schedule with
``finalize_model_grads``.

The same model is trained twice from the same full weights and data: on 4
ranks (tp 2, pp 2) and in one process (tp 1, pp 1). Each run starts from
weights drawn per parameter from its global name (every rank takes its shard),
so both start equal; the losses must then agree to float32 round-off (tensor
parallelism sums in another order). Megatron-Core assumes CUDA in a few places;
the CPU-ONLY WORKAROUNDS below (marked) stand in for them and change nothing
else.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import pathlib
import re
import sys
import warnings
import zlib
from functools import partial
from typing import Any

import torch
import torch.distributed as dist
from torch.overrides import TorchFunctionMode

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

from hypergrid import spawn
from hypergrid.compat.megatron import destroy_process_groups, process_groups, setup_model_state

VOCAB, SEQ, HIDDEN, HEADS, LAYERS = 128, 16, 64, 4, 4
MICRO_BATCH, MICROBATCHES, SEED = 2, 4, 1234


# -- CPU-ONLY WORKAROUNDS ---------------------------------------------------------------------------------------
# Megatron-Core 0.19 assumes CUDA in code paths a CPU run takes: tensors made with device="cuda" or
# torch.cuda.current_device() (p2p shape tensors, grad buffers, token counts in the schedule, the
# optimizer's flags and clip_grads' norms), .cuda() on the tied embedding, parameter types checked as
# "torch.cuda.*Tensor" by the optimizers, streams in the DDP buffers, torch.cuda.synchronize, and the CUDA
# generator in its RNG tracker. On a machine without CUDA these stand-ins keep everything on the CPU; none
# of them touches process groups or what hypergrid provides.


class _Stream:
    def wait_stream(self, other: object) -> None:
        pass


class CpuOnly(TorchFunctionMode):
    """CPU-ONLY WORKAROUND: every torch call that asks for a CUDA device gets the CPU instead."""

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = dict(kwargs or {})
        if func is torch.Tensor.cuda:
            return args[0]
        if func is torch.Tensor.type and len(args) == 1 and not kwargs:  # the optimizers check "torch.cuda.*Tensor"
            return func(*args).replace("torch.", "torch.cuda.", 1)
        if kwargs.get("device") is not None and torch.device(kwargs["device"]).type == "cuda":
            kwargs["device"] = "cpu"
        return func(*args, **kwargs)


def cpu_only_workarounds() -> CpuOnly:
    """CPU-ONLY WORKAROUND: route Megatron-Core's CUDA calls to the CPU (no CUDA here); returns the mode to enter."""
    import megatron.core.tensor_parallel.random as random

    torch.cuda.current_device = lambda: 0  # the device index CpuOnly then maps to the CPU
    torch.cuda.synchronize = lambda *args, **kwargs: None
    torch.cuda.current_stream = lambda *args, **kwargs: _Stream()  # type: ignore[assignment]
    torch.cuda.stream = lambda *args, **kwargs: contextlib.nullcontext()  # type: ignore[assignment]
    torch.cuda.get_rng_state = lambda *args, **kwargs: torch.get_rng_state()  # type: ignore[assignment]
    torch.cuda.manual_seed = lambda seed: torch.manual_seed(seed)  # type: ignore[assignment]
    random._get_cuda_rng_state = lambda *args, **kwargs: torch.get_rng_state()
    random._set_cuda_rng_state = lambda state, *args, **kwargs: torch.set_rng_state(state)
    return CpuOnly()


# -- the model, its weights and data ---------------------------------------------------------------------------


def config_for(tp: int, pp: int) -> Any:
    from megatron.core.transformer.transformer_config import TransformerConfig

    return TransformerConfig(
        num_layers=LAYERS,
        hidden_size=HIDDEN,
        num_attention_heads=HEADS,
        tensor_model_parallel_size=tp,
        pipeline_model_parallel_size=pp,
        pipeline_dtype=torch.float32,
        params_dtype=torch.float32,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        use_cpu_initialization=True,  # CPU-ONLY WORKAROUND: initialize on the CPU
        gradient_accumulation_fusion=False,  # CPU-ONLY WORKAROUND: the fused kernel is CUDA-only
        bias_activation_fusion=False,
        masked_softmax_fusion=False,
        persist_layer_norm=False,
        bias_dropout_fusion=False,
        apply_rope_fusion=False,
    )


def global_name(model: torch.nn.Module, name: str) -> str:
    """The parameter's name in the one-process model: local layer index -> global, the tied output -> embedding."""
    if name == "output_layer.weight" and getattr(model, "share_embeddings_and_output_weights", False):
        return "embedding.word_embeddings.weight"
    match = re.match(r"decoder\.layers\.(\d+)\.(.*)", name)
    if match:
        layer = model.decoder.layers[int(match.group(1))]
        return f"decoder.layers.{layer.layer_number - 1}.{match.group(2)}"
    return name


def load_full_weights(model: torch.nn.Module, tp_group: Any) -> None:
    """Every matrix drawn from its global name at full size; each rank keeps its tensor-parallel shard."""
    tp, rank = dist.get_world_size(tp_group), dist.get_rank(tp_group)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if param.dim() < 2:
                continue  # norms (ones) and biases (zeros) start equal in every layout already
            dim = getattr(param, "partition_dim", 0) if getattr(param, "tensor_model_parallel", False) else None
            shape = list(param.shape)
            if dim is not None:
                shape[dim] *= tp
            generator = torch.Generator().manual_seed(zlib.crc32(global_name(model, name).encode()))
            full = torch.randn(shape, generator=generator) * 0.02
            param.copy_(full if dim is None else full.chunk(tp, dim=dim)[rank])


def batches(steps: int) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(SEED)
    return [torch.randint(0, VOCAB, (MICROBATCHES, MICRO_BATCH, SEQ + 1), generator=generator) for _ in range(steps)]


# -- one training run ------------------------------------------------------------------------------------------


def train(tp: int, pp: int, steps: int) -> list[float]:
    """Train on this rank's part; the last pipeline stage returns each step's mean loss (other ranks: [])."""
    warnings.filterwarnings("ignore")  # Megatron's notes on missing apex, absl, Transformer Engine
    logging.getLogger("megatron").setLevel(logging.ERROR)  # and GPTModel's deprecation notice
    with cpu_only_workarounds():
        return _train(tp, pp, steps)


def _train(tp: int, pp: int, steps: int) -> list[float]:
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.distributed.finalize_model_grads import finalize_model_grads
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from megatron.core.pipeline_parallel.p2p_communication import P2PCommunicator
    from megatron.core.pipeline_parallel.schedules import forward_backward_pipelining_without_interleaving

    # Instead of initialize_model_parallel(tp, pp) and use_mpu_process_groups(): one call.
    pgs = process_groups(tp=tp, pp=pp)
    setup_model_state(pgs, seed=SEED)
    stage, stages = dist.get_rank(pgs.pp), dist.get_world_size(pgs.pp)
    config = config_for(tp, pp)
    model = GPTModel(
        config,
        get_gpt_layer_local_spec(),
        vocab_size=VOCAB,
        max_sequence_length=SEQ,
        pre_process=stage == 0,
        post_process=stage == stages - 1,
        share_embeddings_and_output_weights=True,
        pg_collection=pgs,
    )
    load_full_weights(model, pgs.tp)
    ddp_config = DistributedDataParallelConfig(grad_reduce_in_fp32=True, use_distributed_optimizer=True)
    model = DistributedDataParallel(config, ddp_config, model, pg_collection=pgs)
    optimizer = get_megatron_optimizer(
        OptimizerConfig(optimizer="adam", lr=1e-3, clip_grad=1.0, use_distributed_optimizer=True),
        [model],
        use_gloo_process_groups=False,
        pg_collection=pgs,
    )
    config.finalize_model_grads_func = partial(finalize_model_grads, pg_collection=pgs)
    config.no_sync_func = model.no_sync
    communicator = P2PCommunicator(pp_group=pgs.pp, config=config)
    positions = torch.arange(SEQ).unsqueeze(0).expand(MICRO_BATCH, SEQ)

    def forward_step(data: Any, model: torch.nn.Module) -> tuple[torch.Tensor, Any]:
        tokens = next(data)
        output = model(tokens[:, :-1], positions, None, labels=tokens[:, 1:])

        def loss_func(per_token: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
            loss = per_token.float().mean()
            return loss, {"loss": loss.detach().clone()}  # the schedule divides the loss in place

        return output, loss_func

    losses = []
    for batch in batches(steps):
        model.zero_grad_buffer()
        optimizer.zero_grad()
        reported = forward_backward_pipelining_without_interleaving(
            forward_step_func=forward_step,
            data_iterator=iter(batch),
            model=[model],
            num_microbatches=MICROBATCHES,
            seq_length=SEQ,
            micro_batch_size=MICRO_BATCH,
            p2p_communicator=communicator,
            pg_collection=pgs,
        )
        optimizer.step()
        if reported:
            losses.append(float(torch.stack([entry["loss"] for entry in reported]).mean()))
    destroy_process_groups(pgs)
    return losses


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--json", type=pathlib.Path, default=None)
    args = parser.parse_args(argv)
    parallel = [losses for losses in spawn(train, 4, (2, 2, args.steps), timeout_s=600) if losses]
    single = spawn(train, 1, (1, 1, args.steps), timeout_s=600)[0]
    print("step  loss tp2 pp2 (4 ranks)  loss one process  difference")
    worst = 0.0
    for step, (ours, reference) in enumerate(zip(parallel[0], single)):
        worst = max(worst, abs(ours - reference))
        print(f"{step:4d}  {ours:21.6f}  {reference:16.6f}  {abs(ours - reference):10.2e}")
    agree = len(parallel) == 2 and parallel[0] == parallel[1] and worst < 1e-4 and len(single) == args.steps
    print("losses agree" if agree else "LOSSES DIFFER")
    if args.json:
        args.json.write_text(json.dumps({"parallel": parallel, "single": single, "agree": agree}, indent=1) + "\n")
    return 0 if agree else 1


if __name__ == "__main__":
    sys.exit(main())
