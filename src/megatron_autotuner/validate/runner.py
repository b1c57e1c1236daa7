"""A real megatron-core training (or forward-only) loop for one `Layout`, on the current rank.

Imports torch / megatron-core / TE inside functions only. What it builds is what Megatron-LM's
`pretrain_gpt.py` builds: `GPTModel` chunks from the TE layer spec (the local spec when TE does not
import, recorded as `layer_spec: local`), one chunk per virtual pipeline stage, `Float16Module` (bf16),
megatron-core `DistributedDataParallel` (fp32 grad buffers, overlapped grad reduce / param gather) and
the distributed optimizer from `get_megatron_optimizer`, driven by `get_forward_backward_func`
(no-pipelining, 1F1B or interleaved 1F1B) with the model config's grad-sync / finalize hooks set as
Megatron-LM's `train()` sets them. Data are mock tokens (fixed random ids), one CP shard per rank; with
`Layout.max_token_len` each micro-batch is a packed THD row of whole sequences (`testbench.packed`: verl's dynamic
batching and its `preprocess_packed_seqs` layout) passed to GPTModel.forward as `packed_seq_params` (a keyword of
GPTModel.forward in megatron-core 0.16 and 0.19), which only TE's attention accepts.

On CPU (gloo, tests only) megatron-core's DDP cannot run (its buffers live on CUDA): the chunks stay
fp32 and a plain torch AdamW steps them; everything else is the same code path.

CUDA graphs (`Layout.cuda_graph_impl`), as Megatron-LM's `train()` drives them (megatron/training/training.py,
megatron-core 0.19): the TE RNG tracker (`te_rng_tracker`, which Megatron-LM turns on for graphs); transformer_engine:
a `TECudaGraphHelper` captures every graphed layer once `cuda_graph_warmup_steps` eager steps have run (forward
pre-hooks off during the capture, then the manual hooks it sets); local: megatron-core's schedules capture their
own graphs after their warm-up (`create_cudagraphs`); full_iteration: the forward-backward is wrapped in
`FullCudaGraphWrapper`, and DDP is built on its capture stream. Graphs are refused on CPU.

Activation offloading (`Layout.activation_offload`), as Megatron-LM sets it up (megatron/training/arguments.py and
training.py, megatron-core 0.19; the same hooks in 0.16): the TransformerConfig fields of the flag table
(`specs.megatron_args.activation_offload_args`) plus `cpu_offloading` when --cpu-offloading-num-layers > 0.
Nothing is called per step: megatron-core's GPTModel.forward starts each micro-batch's chunk handler
(`preprocess_for_fine_grained_offloading`) and its schedules reset the fine-grained manager after each
forward-backward (`off_interface.reset()`). A fine-grained layout starts with a fresh manager (a process-wide
singleton: `reset_instance`, as megatron-core's own tests do) and, as Megatron-LM's `pretrain` does, with the
process bound to the GPU's NUMA node's CPUs (`set_ideal_affinity_for_current_gpu`, recorded). Both mechanisms need
CUDA and Transformer Engine: refused on CPU. What the manager offloaded after its warm-up iteration
(`offload_summary_bytes`) is recorded as `offloaded_gib`.

Per rank it returns the wall time of every step (CUDA-synchronised), peak allocated / reserved
memory of the caching allocator, and device memory outside it (CUDA context, NCCL buffers).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import gc
import inspect
import json
import math
import os
import time
import traceback
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from ..testbench.measure import export_trace_gz
from .affinity import bind_to_gpu_numa_node, cpu_placement
from .layout import Layout

GIB = 2**30
# read by Transformer Engine once, at import (transformer_engine/pytorch/cpu_offload.py): 1 selects its legacy offload
# code path, which megatron-core's fine-grained manager uses (megatron/core/extensions/transformer_engine.py imports
# cpu_offload_v1 as cpu_offload)
NVTE_CPU_OFFLOAD_V1_ENV = "NVTE_CPU_OFFLOAD_V1"
FAULT_ENV = "MAT_VALIDATE_FAULT"  # "NAME_OR_ID:KIND[:RANK]", KIND in oom | nccl | error | hang | crash


@dataclass(frozen=True)
class _Split:
    """The fields `testbench.operators.transformer_config_kwargs` reads from a case."""

    tp: int
    cp: int
    ep: int
    etp: int
    sequence_parallel: bool
    cp_comm_type: str
    dtype: str  # bf16 | fp8 (hybrid format)
    fp8_recipe: str = "delayed"  # with fp8: delayed | tensorwise | blockwise
    moe_permute_fusion: bool = False  # the layout's own (`Layout.moe_permute_fusion`) comes with config_overrides


def padded_vocab_size(vocab_size: int, tp: int, multiple: int = 128) -> int:
    """Megatron-LM pads the vocabulary to a multiple of `multiple` x tp (--make-vocab-size-divisible-by)."""
    step = multiple * tp
    return -(-vocab_size // step) * step


def failure_kind(message: str) -> str:
    """oom | nccl | timeout | error, from an exception message."""
    low = message.lower()
    if "out of memory" in low or "outofmemoryerror" in low or low.startswith("oom"):
        return "oom"
    if "nccl" in low or "watchdog" in low or "processgroup" in low:
        return "nccl"
    if "timed out" in low or "timeout" in low:
        return "timeout"
    return "error"


def injected_fault(layout: Layout, rank: int) -> str | None:
    """The fault `MAT_VALIDATE_FAULT` asks for on this layout and rank (tests of failure handling)."""
    spec = os.environ.get(FAULT_ENV, "")
    if not spec:
        return None
    parts = spec.split(":")
    if len(parts) < 2 or parts[0] not in (layout.name, layout.layout_id):
        return None
    if len(parts) > 2 and parts[2] != "" and int(parts[2]) != rank:
        return None
    return parts[1]


def _raise_fault(kind: str) -> None:
    import torch

    if kind == "oom":
        raise torch.cuda.OutOfMemoryError(
            "CUDA out of memory. Tried to allocate 2.00 GiB (injected by MAT_VALIDATE_FAULT)"
        )
    if kind == "nccl":
        raise RuntimeError("NCCL error: unhandled system error (injected by MAT_VALIDATE_FAULT)")
    if kind == "hang":
        time.sleep(3600)
    if kind == "crash":
        os._exit(17)
    raise RuntimeError(f"injected failure ({kind})")


def _fields_kwargs(cls: type, **kwargs: Any) -> dict[str, Any]:
    """Keep the keyword arguments the installed megatron-core's dataclass knows (versions differ)."""
    known = {f.name for f in dataclasses.fields(cls)}
    return {k: v for k, v in kwargs.items() if k in known}


def _call_kwargs(fn: Any, **kwargs: Any) -> dict[str, Any]:
    params = inspect.signature(fn).parameters
    return {k: v for k, v in kwargs.items() if k in params}


def installed_te_version() -> str | None:
    """Transformer Engine's installed version from its distribution metadata (TE is not imported); None if absent."""
    from importlib import metadata

    for name in ("transformer_engine", "transformer-engine-torch", "transformer_engine_torch"):
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return None


def _version_tuple(version: str) -> tuple[int, ...]:
    import re

    return tuple(int(x) for x in re.findall(r"\d+", version.split("+")[0])[:3])


def offload_env_problem(layout: Layout, te_version: str | None, environ: Any) -> str | None:
    """Why this environment cannot run `layout`'s activation offloading as predicted; None when it can (or when it
    offloads nothing, or Transformer Engine is absent: the run then refuses it itself).

    Fine-grained with TE >= 2.10 needs NVTE_CPU_OFFLOAD_V1=1: Megatron-LM refuses the launch otherwise
    (megatron/training/arguments.py `validate_args`, "to avoid offloading weights"); it asks, it does not set it.
    Layer-level is predicted on TE's default offload path (`costmodel.activation_offload`): the legacy path that
    NVTE_CPU_OFFLOAD_V1=1 selects for it is not what the prediction models."""
    offload = layout.activation_offload
    if offload is None or te_version is None:
        return None
    v1 = environ.get(NVTE_CPU_OFFLOAD_V1_ENV, "0") == "1"
    if offload.fine_grained and _version_tuple(te_version) >= (2, 10) and not v1:
        return (
            f"fine-grained activation offloading with Transformer Engine {te_version} (>= 2.10) needs "
            f"{NVTE_CPU_OFFLOAD_V1_ENV}=1 in the environment (Megatron-LM validate_args)"
        )
    if offload.layer_level and v1:
        return (
            f"layer-level CPU offloading is predicted on Transformer Engine's default offload path; "
            f"{NVTE_CPU_OFFLOAD_V1_ENV}=1 selects its legacy one: unset it for this layout"
        )
    return None


def init_parallel(layout: Layout, device: str, timeout_s: float) -> None:
    from megatron.core import parallel_state

    kwargs = _call_kwargs(
        parallel_state.initialize_model_parallel,
        tensor_model_parallel_size=layout.tp,
        pipeline_model_parallel_size=layout.pp,
        virtual_pipeline_model_parallel_size=layout.vpp,
        context_parallel_size=layout.cp,
        expert_model_parallel_size=layout.ep,
        expert_tensor_parallel_size=layout.parallel().etp,
        distributed_timeout_minutes=max(1, math.ceil(timeout_s / 60)),
    )
    parallel_state.initialize_model_parallel(**kwargs)
    import torch

    if device == "cuda":
        from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

        # CUDA graphs need a graph-safe RNG tracker: Megatron-LM sets --te-rng-tracker for them (validate_args)
        graphs = layout.cuda_graph_impl != "none"
        model_parallel_cuda_manual_seed(1234, **_call_kwargs(model_parallel_cuda_manual_seed, te_rng_tracker=graphs))
    else:
        torch.manual_seed(1234)


@functools.cache
def apex_wgrad_fusion_available() -> bool:
    """APEX's fused_weight_gradient_mlp_cuda extension importable (needed by gradient_accumulation_fusion).
    Cached: a failed import is retried from scratch each time, and predictions ask in loops."""
    try:
        import fused_weight_gradient_mlp_cuda  # noqa: F401
    except ImportError:
        return False
    return True


def planned_gradient_accumulation_fusion(layout: Layout, use_te: bool) -> bool:
    """Whether the run fuses wgrad accumulation into DDP's fp32 main_grad: only TE training runs do; as the layout
    says, else (None) as Megatron-LM decides on this machine: megatron-core's own output-layer linear needs APEX's
    fused_weight_gradient_mlp_cuda for it, so without APEX it is off."""
    if not (use_te and layout.mode == "train"):
        return False
    if layout.gradient_accumulation_fusion is None:
        return apex_wgrad_fusion_available()
    return layout.gradient_accumulation_fusion


def gradient_accumulation_fusion(layout: Layout, use_te: bool, cuda: bool) -> bool:
    """`planned_gradient_accumulation_fusion` on CUDA; a layout that asks for it where APEX is missing is refused (the
    prediction assumed it)."""
    fused = cuda and planned_gradient_accumulation_fusion(layout, use_te)
    if fused and not apex_wgrad_fusion_available():
        raise ConfigError(
            "gradient_accumulation_fusion",
            "needs APEX's fused_weight_gradient_mlp_cuda, which this machine cannot import (plan or validate with "
            "--no-gradient-accumulation-fusion)",
        )
    return fused


def config_overrides(layout: Layout, use_te: bool, device: str) -> dict[str, Any]:
    """TransformerConfig settings of a training run beyond the model's shape (Megatron-LM defaults)."""
    cuda = device == "cuda"
    out: dict[str, Any] = dict(
        pipeline_model_parallel_size=layout.pp,
        virtual_pipeline_model_parallel_size=layout.vpp,
        gradient_accumulation_fusion=gradient_accumulation_fusion(layout, use_te, cuda),
        # --cross-entropy-loss-fusion: GPTModel's loss through the fused vocab-parallel kernel
        cross_entropy_loss_fusion=layout.cross_entropy_fusion,
        cross_entropy_fusion_impl=layout.cross_entropy_fusion_impl,
        # --moe-permute-fusion: TE's fused token permute / unpermute in the alltoall dispatcher
        moe_permute_fusion=layout.moe_permute_fusion,
        # token dropping: megatron-core drops past each expert's capacity (and pads up to it)
        moe_expert_capacity_factor=layout.moe_expert_capacity_factor,
        moe_pad_expert_input_to_capacity=layout.moe_pad_expert_input_to_capacity,
        # --moe-token-dispatcher-type (the model config's alltoall unless the layout names allgather)
        moe_token_dispatcher_type=layout.moe_token_dispatcher,
        # --overlap-moe-expert-parallel-comm / --delay-wgrad-compute: the combined 1F1B step (`_forward_step`)
        overlap_moe_expert_parallel_comm=layout.moe_a2a_overlap,
        delay_wgrad_compute=layout.delay_wgrad_compute,
        deallocate_pipeline_outputs=True,
        overlap_p2p_comm=layout.vpp is not None,
        batch_p2p_comm=layout.vpp is None,
    )  # Megatron-LM's kernel fusions come with the model's config (testbench.operators.megatron_lm_fusions)
    if layout.packed and layout.pp > 1:
        # packed micro-batches differ in length: megatron-core's pipeline p2p then exchanges tensor shapes before
        # the tensors (TransformerConfig.variable_seq_lengths, pipeline_parallel/p2p_communication.py), as verl sets
        out["variable_seq_lengths"] = True
    if layout.pipeline_layout is not None:
        # megatron-core parses the string itself (TransformerConfig: PipelineParallelLayerLayout.from_str)
        out["pipeline_model_parallel_layout"] = layout.pipeline_layout
    if layout.precision == "fp8":
        # Megatron-LM's --fp8-recipe / --fp8-param-gather (fp8 itself, format hybrid, and the recipe come from the
        # testbench's config); with fp8_param megatron-core's TransformerBlock builds its TE layers under TE's
        # fp8_model_init
        out.update(fp8_recipe=layout.fp8_recipe, fp8_param=layout.fp8_param)
    if layout.recompute == "full":
        out.update(
            recompute_granularity="full",
            recompute_method=layout.recompute_method,
            recompute_num_layers=layout.recompute_num_layers,
        )
    elif layout.recompute == "selective":
        out.update(recompute_granularity="selective", recompute_modules=list(layout.recompute_modules))
    if layout.cuda_graph_impl != "none":
        out.update(cuda_graph_config(layout))
    if layout.activation_offload is not None:
        out.update(activation_offload_config(layout))
    if layout.tp_comm_overlap:
        if not (cuda and use_te):
            raise ConfigError("tp_comm_overlap", "TE userbuffers need CUDA GPUs and Transformer Engine")
        out["tp_comm_overlap"] = True
    return out


def initialize_userbuffers(layout: Layout, hidden_size: int) -> None:
    """TE userbuffers for `tp_comm_overlap`, before the model is built (TE refuses overlap layers without them), as
    Megatron-LM's `_initialize_tp_communicators` (megatron/training/initialize.py) sizes them: [seq x micro-batch /
    cp, hidden], the layout's yaml as ub_cfgs (else TE's defaults), bootstrapped over NCCL."""
    import torch
    from transformer_engine.pytorch.module import base

    cfgs = None
    if layout.tp_comm_overlap_cfg is not None:
        import yaml

        cfgs = yaml.safe_load(Path(layout.tp_comm_overlap_cfg).read_text())
    kwargs = dict(
        shape=[layout.seq_length * layout.micro_batch_size // layout.cp, hidden_size],
        tp_size=layout.tp,
        use_fp8=layout.precision == "fp8",
        dtype=torch.bfloat16,
        ub_cfgs=cfgs or None,
        bootstrap_backend="nccl",
    )
    base.initialize_ub(**_call_kwargs(base.initialize_ub, **kwargs))


def destroy_userbuffers() -> None:
    """Free TE's userbuffers when this process initialised them (a later layout of the same job sizes its own)."""
    try:
        from transformer_engine.pytorch.module import base
    except ImportError:
        return
    if getattr(base, "_ub_communicators", None) is not None and hasattr(base, "destroy_ub"):
        base.destroy_ub()


def activation_offload_config(layout: Layout) -> dict[str, Any]:
    """TransformerConfig activation-offloading fields of `layout`: the flag table's Megatron-LM arguments (whose
    dests are TransformerConfig fields) and `cpu_offloading`, which Megatron-LM's validate_args turns on when
    --cpu-offloading-num-layers > 0 (cpu_offloading_activations stays at its default, True, as Megatron-LM has no
    flag for it). Raises ConfigError when the installed megatron-core lacks a field set away from its default
    (activation_offload_fraction is new in 0.19)."""
    from megatron.core.transformer.transformer_config import TransformerConfig

    from ..specs.megatron_args import activation_offload_args, megatron_default

    offload = layout.activation_offload
    if offload is None:
        return {}
    out = activation_offload_args(offload)
    if offload.layer_level:
        out["cpu_offloading"] = True
    fields = TransformerConfig.__dataclass_fields__
    for key in [k for k in out if k not in fields]:
        if out[key] != megatron_default(key):
            raise ConfigError(key, f"{out[key]!r} needs a megatron-core whose TransformerConfig has {key}")
        del out[key]
    return out


def cuda_graph_config(layout: Layout) -> dict[str, Any]:
    """TransformerConfig CUDA-graph fields of `layout` for the installed megatron-core: `cuda_graph_modules` (0.19+)
    or its former name `cuda_graph_scope` (0.16, where full_iteration was a scope of the local impl)."""
    from megatron.core.transformer.transformer_config import TransformerConfig

    fields = TransformerConfig.__dataclass_fields__
    graphs = layout.cuda_graph()
    impl, scope = graphs.impl, list(graphs.scope)
    if impl == "full_iteration" and "cuda_graph_modules" not in fields:
        impl, scope = "local", ["full_iteration"]
    out: dict[str, Any] = {
        "cuda_graph_impl": impl,
        "cuda_graph_warmup_steps": graphs.warmup_steps,
        "use_te_rng_tracker": True,
        ("cuda_graph_modules" if "cuda_graph_modules" in fields else "cuda_graph_scope"): scope,
    }
    return {k: v for k, v in out.items() if k in fields}


def build_model(layout: Layout, device: str, use_te: bool):
    """(config, model chunks) of this pipeline rank, built as Megatron-LM's model_provider does."""
    from megatron.core import parallel_state, tensor_parallel
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_decoder_block_spec

    from ..testbench.operators import _rope_base, build_transformer_config

    spec = layout.model_spec()
    par = layout.parallel()
    split = _Split(
        par.tp, par.cp, par.ep, par.etp, par.sequence_parallel, par.cp_comm_type, layout.precision, layout.fp8_recipe
    )
    config = build_transformer_config(spec, split, use_te, device, config_overrides(layout, use_te, device))
    if layout.tp_comm_overlap:
        initialize_userbuffers(layout, spec.hidden_size)
    chunks = []
    for vp_stage in range(layout.vpp) if layout.vpp else [None]:
        block = get_gpt_decoder_block_spec(
            config, use_transformer_engine=use_te, normalization=spec.normalization, vp_stage=vp_stage
        )
        kwargs = _call_kwargs(
            GPTModel.__init__,
            config=config,
            transformer_layer_spec=block,
            vocab_size=padded_vocab_size(spec.vocab_size, layout.tp),
            max_sequence_length=max(spec.max_position_embeddings, layout.seq_length),
            pre_process=parallel_state.is_pipeline_first_stage(ignore_virtual=False, vp_stage=vp_stage),
            post_process=parallel_state.is_pipeline_last_stage(ignore_virtual=False, vp_stage=vp_stage),
            share_embeddings_and_output_weights=spec.tie_embeddings,
            position_embedding_type=spec.position_embedding_type,
            rotary_base=int(_rope_base(layout.model)),
            vp_stage=vp_stage,
        )
        model = GPTModel(**kwargs)
        for param in model.parameters():
            tensor_parallel.set_defaults_if_not_set_tensor_model_parallel_attributes(param)
        if device == "cuda":
            model.cuda(__import__("torch").cuda.current_device())
        chunks.append(model)
    return config, chunks


def wrap_for_training(layout: Layout, config: Any, chunks: list, device: str):
    """(model chunks, optimizer): Float16Module + DDP + distributed optimizer on CUDA; AdamW on CPU."""
    import torch

    if device != "cuda":
        params = [p for c in chunks for p in c.parameters()]
        return chunks, (torch.optim.AdamW(params, lr=1e-5) if layout.mode == "train" else None)
    from megatron.core.transformer.module import Float16Module

    model = [Float16Module(config, c) for c in chunks] if layout.precision in ("bf16", "fp8") else chunks
    if layout.mode != "train":
        return model, None
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig, finalize_model_grads
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

    dist_opt = layout.use_distributed_optimizer
    param_gather = layout.overlap_param_gather and dist_opt
    align_param_gather = param_gather and layout.vpp is not None  # Megatron-LM: only with interleaving
    ddp_config = DistributedDataParallelConfig(
        **_fields_kwargs(
            DistributedDataParallelConfig,
            grad_reduce_in_fp32=layout.grad_reduce_in_fp32,
            overlap_grad_reduce=layout.overlap_grad_reduce,
            overlap_param_gather=param_gather,
            align_param_gather=align_param_gather,
            use_distributed_optimizer=dist_opt,
            fp8_param_gather=layout.fp8_param,
            check_for_nan_in_grad=False,
            average_in_collective=False,
            # with --delay-wgrad-compute DDP reduces the delayed weight gradients from the modules' backward_dw hooks
            # (Megatron-LM passes the flag to DistributedDataParallelConfig by name)
            delay_wgrad_compute=layout.delay_wgrad_compute,
        )
    )
    # Megatron-LM builds DDP on a stream of its own (megatron/training/training.py, get_model): the full-iteration
    # capture stream with full_iteration graphs, else a fresh one. DDP keeps each parameter's AccumulateGrad node,
    # and torch runs a node's gradient on the stream it was created on: built on the legacy default stream, TE's
    # per-layer graph capture of the backward makes the legacy stream wait on the capturing one, which invalidates
    # the capture (cudaErrorStreamCaptureImplicit; the H100 lease's graphed training runs,
    # benchmarks/results/validation_h100_x1/host_diagnostics/graphs).
    if layout.cuda_graph_impl == "full_iteration":
        from megatron.core.full_cuda_graph import get_shared_capture_stream

        stream = get_shared_capture_stream()
    elif layout.ddp_side_stream:
        stream = torch.cuda.Stream()
    else:  # as the runner did before 2026-11-24: DDP on the current (default) stream
        stream = torch.cuda.current_stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        model = [
            DistributedDataParallel(config=config, ddp_config=ddp_config, module=m, disable_bucketing=i > 0)
            for i, m in enumerate(model)
        ]
    torch.cuda.current_stream().wait_stream(stream)
    opt_config = OptimizerConfig(
        **_fields_kwargs(
            OptimizerConfig,
            optimizer="adam",
            lr=1e-5,
            min_lr=1e-6,
            weight_decay=0.1,
            adam_beta1=0.9,
            adam_beta2=0.95,
            adam_eps=1e-8,
            clip_grad=1.0,
            bf16=True,
            params_dtype=torch.bfloat16,
            use_distributed_optimizer=dist_opt,
            overlap_param_gather=param_gather,
            fp8_recipe=layout.fp8_recipe if layout.precision == "fp8" else None,
        )
    )
    optimizer = get_megatron_optimizer(opt_config, model)

    def one_or_list(funcs: list) -> Any:
        return funcs[0] if len(funcs) == 1 else funcs

    config.grad_scale_func = optimizer.scale_loss
    config.finalize_model_grads_func = finalize_model_grads
    if layout.overlap_grad_reduce:
        config.no_sync_func = one_or_list([m.no_sync for m in model])
        config.grad_sync_func = one_or_list([m.start_grad_sync for m in model])
    if align_param_gather:
        config.param_sync_func = one_or_list([m.start_param_sync for m in model])
    return model, optimizer


def _mock_batches(layout: Layout, device: str):
    """An endless iterator of one fixed micro-batch: this rank's CP shard of random token ids."""
    import torch

    spec = layout.model_spec()
    s_local = layout.seq_length // layout.cp
    gen = torch.Generator().manual_seed(4321)
    tokens = torch.randint(0, spec.vocab_size, (layout.micro_batch_size, s_local + 1), generator=gen)
    batch = {
        "tokens": tokens[:, :-1].contiguous().to(device),
        "labels": tokens[:, 1:].contiguous().to(device),
        "loss_mask": torch.ones(layout.micro_batch_size, s_local, device=device),
        "position_ids": torch.arange(s_local, device=device).unsqueeze(0).expand(layout.micro_batch_size, -1),
    }
    while True:
        yield batch


def packed_micro_batches(layout: Layout, device: str, dp_rank: int, cp_rank: int) -> list[dict[str, Any]]:
    """This rank's packed THD micro-batches of one iteration (the same every iteration), in verl's order."""
    from ..testbench.packed import thd_tensors

    plan = layout.packing_plan()
    vocab = layout.model_spec().vocab_size
    return [
        thd_tensors(mb, vocab, seed=1000 * layout.length_seed + i, device=device, cp=layout.cp, cp_rank=cp_rank)
        for i, mb in enumerate(plan.per_rank[dp_rank])
    ]


def _packed_batches(batches: list[dict[str, Any]]):
    """An endless iterator over one iteration's packed micro-batches, in order."""
    while True:
        yield from batches


def _loss_func(loss_mask, output_tensor):
    losses = output_tensor.float().view(-1)
    mask = loss_mask.view(-1).float()
    loss = (losses * mask).sum() / mask.sum()
    return loss, {"lm loss": loss.detach()}


def _forward_step(data_iterator, model, return_schedule_plan: bool = False):
    """One micro-batch's forward, and its loss function. `return_schedule_plan`: megatron-core's combined 1F1B step
    (the EP all-to-all overlap) asks for the model's schedule plan instead of its output, as Megatron-LM's
    pretrain_gpt.forward_step builds it (`GPTModel.build_schedule_plan`)."""
    batch = next(data_iterator)
    packed = {"packed_seq_params": batch["packed_seq_params"]} if "packed_seq_params" in batch else {}
    inputs = dict(input_ids=batch["tokens"], position_ids=batch["position_ids"], attention_mask=None, **packed)
    if return_schedule_plan:
        output = model.build_schedule_plan(**inputs, labels=batch["labels"])
    else:
        output = model(**inputs, labels=batch["labels"])
    return output, partial(_loss_func, batch["loss_mask"])


class _CpuTorch:
    """`torch` as megatron-core's schedules see it on CPU test runs: tensors they create on "cuda" go to CPU."""

    def __init__(self, torch_module: Any) -> None:
        self._torch = torch_module

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._torch, name)
        if name in ("zeros", "ones", "empty", "tensor", "full"):

            def on_cpu(*args: Any, **kwargs: Any) -> Any:
                if str(kwargs.get("device", "")).startswith("cuda"):
                    kwargs["device"] = "cpu"
                return attr(*args, **kwargs)

            return on_cpu
        return attr


def patch_schedules_for_cpu() -> None:
    """megatron-core's schedules allocate a few bookkeeping tensors with device="cuda"; on CPU (tests
    only) redirect them so the real `get_forward_backward_func` code path still runs."""
    import torch
    from megatron.core.pipeline_parallel import schedules
    from megatron.core.transformer import utils as transformer_utils

    if not torch.cuda.is_available() and not isinstance(schedules.torch, _CpuTorch):
        schedules.torch = _CpuTorch(torch)
        transformer_utils.torch = _CpuTorch(torch)  # get_default_causal_mask
    from megatron.core.tensor_parallel.random import get_cuda_rng_tracker

    if not torch.cuda.is_available():
        get_cuda_rng_tracker().fork = lambda *args, **kwargs: contextlib.nullcontext()  # dropout RNG
        # rotary tables and the local attention's global memory buffer ask for the current CUDA device
        torch.cuda.current_device = lambda: "cpu"


def mock_iterators(layout: Layout, model: list, device: str) -> list:
    """One data iterator per model chunk, as `run_layout` feeds them (packed THD rows when the layout packs;
    data-parallel and CP rank from megatron-core's parallel state)."""
    if not layout.packed:
        return [_mock_batches(layout, device) for _ in model]
    from megatron.core import parallel_state

    batches = packed_micro_batches(
        layout, device, parallel_state.get_data_parallel_rank(), parallel_state.get_context_parallel_rank()
    )
    return [_packed_batches(batches) for _ in model]


def train_step(layout: Layout, model: list, optimizer: Any, iterators: list, device: str) -> float | None:
    """One iteration of `layout` (all micro-batches, then the optimizer step when training): the mean loss."""
    return _train_step(layout, model, optimizer, iterators, device)


class CudaGraphs:
    """The CUDA graphs of one layout's run, as Megatron-LM's `train()` drives them (module docstring): the
    forward-backward function to call, `maybe_capture(step)` before each step, `close()` at the end."""

    def __init__(self, layout: Layout, model: list, optimizer: Any, config: Any, device: str) -> None:
        self.layout, self.model, self.optimizer, self.config = layout, model, optimizer, config
        self.graphs = layout.cuda_graph()
        self.helper = None
        self.capture_s: float | None = None
        self.captured_before_step: int | None = None
        self._calculator = False
        from megatron.core.pipeline_parallel import get_forward_backward_func

        self.fwd_bwd = get_forward_backward_func()
        if not self.graphs.enabled:
            return
        if device != "cuda":
            raise RuntimeError(f"CUDA graphs ({self.graphs.impl}) need a CUDA device")
        if self.graphs.impl == "full_iteration":
            from megatron.core.full_cuda_graph import FullCudaGraphWrapper

            FullCudaGraphWrapper.reset_cuda_graph()  # class-level state: a fresh count for this layout
            self.fwd_bwd = FullCudaGraphWrapper(
                self.fwd_bwd,
                **_call_kwargs(FullCudaGraphWrapper.__init__, cuda_graph_warmup_steps=self.graphs.warmup_steps),
            )
            self.captured_before_step = self.graphs.warmup_steps
        elif self.graphs.impl == "transformer_engine":
            from megatron.core import parallel_state
            from megatron.core.num_microbatches_calculator import init_num_microbatches_calculator
            from megatron.core.transformer.cuda_graphs import TECudaGraphHelper

            # the helper asks megatron's micro-batch calculator how many micro-batches a step has
            w = layout.workload()
            init_num_microbatches_calculator(
                0, None, w.global_batch_size, w.micro_batch_size, parallel_state.get_data_parallel_world_size()
            )
            self._calculator = True
            if optimizer is None:
                # forward-only: the chunks have no DDP grad buffer, which the helper zeroes after the capture
                # (_reset_after_capture); the captured backward wrote plain .grad, dropped instead
                for m in model:
                    if not hasattr(m, "zero_grad_buffer"):
                        m.zero_grad_buffer = functools.partial(m.zero_grad, set_to_none=True)
            self.helper = TECudaGraphHelper(
                model=model,
                config=config,
                seq_length=layout.seq_length,
                micro_batch_size=layout.micro_batch_size,
                optimizers=[optimizer] if optimizer is not None else [],
            )
        # local: megatron-core's schedules record, then capture after config.cuda_graph_warmup_steps

    def _pre_hooks(self) -> bool:
        """DDP dispatches the param all-gather from forward pre-hooks (overlap_param_gather with the distributed
        optimizer): Megatron-LM turns them off around the capture (should_disable_forward_pre_hook)."""
        lay = self.layout
        return lay.mode == "train" and lay.use_distributed_optimizer and lay.overlap_param_gather

    def maybe_capture(self, step: int) -> None:
        """Capture the transformer_engine graphs before step `step` when the eager warm-up is done."""
        if self.helper is None or self.helper.capture_finished() or step != self.graphs.warmup_steps:
            return
        t = time.perf_counter()
        hooks = self._pre_hooks()
        if hooks:
            for m in self.model:
                m.disable_forward_pre_hook(param_sync=False)
        self.helper.create_cudagraphs()
        if hooks:
            for m in self.model:
                m.enable_forward_pre_hook()
            self.helper.cuda_graph_set_manual_hooks()
        self.capture_s = time.perf_counter() - t
        self.captured_before_step = step

    def record(self) -> dict[str, Any] | None:
        if not self.graphs.enabled:
            return None
        return {
            "impl": self.graphs.impl,
            "scope": list(self.graphs.scope),
            "warmup_steps": self.graphs.warmup_steps,
            "captured_before_step": self.captured_before_step,
            "capture_s": self.capture_s,
            "graphs_created": None if self.helper is None else self.helper.graphs_created(),
        }

    def close(self) -> None:
        """Drop the graphs and megatron-core's process-wide graph state, so the next layout starts clean."""
        if self.helper is not None and self.helper.graphs_created():
            self.helper.delete_cuda_graphs()
        self.helper = None
        if self.graphs.impl == "full_iteration":
            from megatron.core.full_cuda_graph import FullCudaGraphWrapper, StaticBufferLoader

            FullCudaGraphWrapper.reset_cuda_graph()
            StaticBufferLoader.static_buffers = {"training": [], "validation": []}
        if self.graphs.impl == "local":
            from megatron.core.transformer.cuda_graphs import delete_cuda_graphs

            delete_cuda_graphs()
        if self._calculator:
            from megatron.core.num_microbatches_calculator import destroy_num_microbatches_calculator

            destroy_num_microbatches_calculator()
            self._calculator = False


def host_timing_missing(layout: Layout, summary: dict[str, Any] | None) -> str | None:
    """Why a layout that asked for `host_timing` recorded nothing (None when it recorded, or did not ask): a CUDA
    graph's replay runs no layer's forward hooks; under the all-to-all overlap the combined layer steps are timed
    (`host_timing.CombinedLayerHostTimer`), so nothing means none ran."""
    if not layout.host_timing or summary is not None:
        return None
    if layout.cuda_graph_impl != "none":
        return "host timing: not recorded under CUDA graphs (a replay runs no layer's hooks)"
    if layout.moe_a2a_overlap:
        return "host timing: the all-to-all overlap's combined step ran no timed layer step"
    return "host timing: no layer forward was timed"


def start_fine_grained_offloading() -> str:
    """A fresh fine-grained offload manager for this layout (megatron-core keeps one per process), and the CPU
    affinity Megatron-LM's `pretrain` sets for fine-grained offloading (megatron/training/training.py:
    `set_ideal_affinity_for_current_gpu`, the CPUs of the GPU's NUMA node, near the pinned buffers' memory).
    Returns what became of the affinity (`affinity.bind_to_gpu_numa_node`)."""
    from megatron.core.pipeline_parallel.fine_grained_activation_offload import (
        FineGrainedActivationOffloadingInterface as off_interface,
    )

    off_interface.reset_instance()
    return bind_to_gpu_numa_node()


def fine_grained_offloaded() -> dict[str, Any]:
    """What megatron-core's fine-grained manager offloaded once its warm-up iteration ended (`post_warmup_callback`:
    the offloaded groups of the chunks up to the first backward, i.e. what sits in host memory at the peak),
    in GiB per module and in all; empty when the installed megatron-core does not keep the summary."""
    from megatron.core.pipeline_parallel.fine_grained_activation_offload import PipelineOffloadManager

    mgr = PipelineOffloadManager.get_instance()
    by_module = getattr(mgr, "offload_summary_bytes", None)
    if by_module is None:
        return {}
    return {
        "offloaded_gib": sum(by_module.values()) / GIB,
        "offloaded_gib_by_module": {k: v / GIB for k, v in by_module.items()},
    }


def _gc_collections() -> int:
    """Collections Python's garbage collector has run so far, all generations."""
    return sum(generation["collections"] for generation in gc.get_stats())


def _sync(device: str) -> None:
    if device == "cuda":
        import torch

        torch.cuda.synchronize()


def _train_step(
    layout: Layout, model: list, optimizer: Any, iterators: list, device: str, fwd_bwd: Any = None
) -> float | None:
    """One iteration (all micro-batches + optimizer step). Returns the mean loss on the last stage. `fwd_bwd`: the
    forward-backward function (a full-iteration graph's wrapper), else megatron-core's for the layout."""
    import torch
    from megatron.core.pipeline_parallel import get_forward_backward_func

    forward_only = layout.mode != "train"
    if not forward_only:
        for m in model:
            if hasattr(m, "zero_grad_buffer"):
                m.zero_grad_buffer()
        optimizer.zero_grad()
    fwd_bwd = fwd_bwd or get_forward_backward_func()
    ctx = torch.no_grad() if forward_only else contextlib.nullcontext()
    # packed: the schedule's shapes are those of the longest packed row (ignored with variable_seq_lengths)
    seq_length = packed_seq_length(layout) if layout.packed else layout.seq_length
    with ctx:
        losses = fwd_bwd(
            forward_step_func=_forward_step,
            data_iterator=iterators if len(iterators) > 1 else iterators[0],
            model=model if len(model) > 1 else model[0],
            num_microbatches=layout.num_microbatches,
            seq_length=seq_length,
            micro_batch_size=layout.micro_batch_size,
            decoder_seq_length=seq_length,
            forward_only=forward_only,
        )
    if not forward_only:
        optimizer.step()
    vals = [float(x["lm loss"]) for x in losses or [] if isinstance(x, dict) and "lm loss" in x]
    return sum(vals) / len(vals) if vals else None


@functools.cache
def packed_seq_length(layout: Layout) -> int:
    """Tokens of the longest packed row of any rank (before the CP split)."""
    return max(mb.padded_tokens for rank in layout.packing_plan().per_rank for mb in rank)


def _memory(device: str) -> dict[str, float | None]:
    if device != "cuda":
        return {k: None for k in ("max_allocated_gib", "max_reserved_gib", "reserved_gib", "device_used_gib")}
    import torch

    free, total = torch.cuda.mem_get_info()
    return {
        "max_allocated_gib": torch.cuda.max_memory_allocated() / GIB,
        "max_reserved_gib": torch.cuda.max_memory_reserved() / GIB,
        "reserved_gib": torch.cuda.memory_reserved() / GIB,
        "device_used_gib": (total - free) / GIB,
        "device_total_gib": total / GIB,
    }


def _profile_step(
    layout: Layout, model: list, optimizer: Any, iterators: list, trace_dir: Path, rank: int, fwd_bwd: Any = None
) -> str:
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    trace_dir.mkdir(parents=True, exist_ok=True)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=False) as prof:
        with record_function("train_step"):
            _train_step(layout, model, optimizer, iterators, "cuda", fwd_bwd)
        torch.cuda.synchronize()
    return str(export_trace_gz(prof, trace_dir / f"rank_{rank}.json.gz"))


# allocator events kept while `Layout.memory_history` records (a 4-layer model's 8 steps make ~10^5)
MEMORY_HISTORY_MAX_ENTRIES = 2_000_000


def _start_memory_history() -> None:
    import torch

    torch.cuda.memory._record_memory_history(
        enabled="all", context="alloc", stacks="python", max_entries=MEMORY_HISTORY_MAX_ENTRIES
    )


def _dump_memory_history(directory: Path, rank: int) -> dict[str, Any]:
    """Stop recording; write the snapshot (pytorch.org/memory_viz opens it) and its replay summary."""
    import gzip
    import pickle

    import torch

    from ..trace.memory_history import replay_history

    snapshot = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"rank_{rank}.pickle.gz"
    with gzip.open(path, "wb", compresslevel=6) as f:
        pickle.dump(snapshot, f)
    summary = replay_history(snapshot, device=torch.cuda.current_device()).to_dict()
    (directory / f"rank_{rank}.history.json").write_text(json.dumps(summary, indent=1) + "\n")
    return {"snapshot": str(path), "summary": summary}


def _record_memory_history(record: dict[str, Any], directory: Path, rank: int) -> None:
    """Dump the history into the record; a failed dump is noted, never fails the layout."""
    try:
        record["memory_history"] = _dump_memory_history(directory, rank)
    except Exception as exc:  # noqa: BLE001 - the run's own result matters more than its history
        record["memory_history_error"] = f"{type(exc).__name__}: {exc}"[:300]


def run_layout(layout: Layout, device: str, out_dir: Path, rank: int, timeout_s: float = 600.0) -> dict[str, Any]:
    """Build, warm up, time and tear down one layout on this rank. Never raises: failures are recorded."""
    import torch
    from megatron.core import parallel_state

    from ..testbench.operators import te_available

    use_te = layout.use_te and device == "cuda" and te_available()
    record: dict[str, Any] = {"layer_spec": "te" if use_te else "local"}
    if layout.packed and not use_te:
        why = "no CUDA device" if device != "cuda" else "Transformer Engine does not import"
        record.update(
            status="failed",
            failure_kind="error",
            error=f"packed THD sequences need Transformer Engine attention on CUDA ({why}); "
            "megatron-core's local attention refuses packed_seq_params",
            measured={},
        )
        return record
    if layout.cuda_graph_impl != "none" and (
        device != "cuda" or (layout.cuda_graph_impl == "transformer_engine" and not use_te)
    ):
        why = "no CUDA device" if device != "cuda" else "Transformer Engine does not import"
        record.update(
            status="failed",
            failure_kind="error",
            error=f"CUDA graphs ({layout.cuda_graph_impl}) need {'CUDA' if device != 'cuda' else 'Transformer Engine'}"
            f" ({why})",
            measured={},
        )
        return record
    offload = layout.activation_offload
    if offload is not None:
        if device != "cuda" or not use_te:
            why = "no CUDA device" if device != "cuda" else "Transformer Engine does not import"
            problem = (
                f"activation offloading ({offload.label}) needs CUDA and Transformer Engine ({why}): the copies run on "
                "CUDA streams into pinned host memory, through Transformer Engine's cpu_offload"
            )
        else:
            problem = offload_env_problem(layout, installed_te_version(), os.environ)
        if problem:
            record.update(status="failed", failure_kind="error", error=problem, measured={})
            return record
        record["activation_offload"] = {
            **layout.to_dict()["activation_offload"],
            NVTE_CPU_OFFLOAD_V1_ENV: os.environ.get(NVTE_CPU_OFFLOAD_V1_ENV),
        }
    if layout.use_te and not use_te:
        record["note"] = "Transformer Engine not used (not importable or CPU): megatron-core local layer spec"
    if device == "cuda":
        gc.collect()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        record["memory_before"] = _memory(device)
        if layout.memory_history:
            _start_memory_history()
    elif layout.memory_history:
        record["note"] = "; ".join(filter(None, [record.get("note"), "memory history needs CUDA: not recorded"]))
    if device != "cuda":
        patch_schedules_for_cpu()
    model = optimizer = config = graphs = host_timer = None
    measured: dict[str, Any] = {}
    try:
        t0 = time.perf_counter()
        init_parallel(layout, device, timeout_s)
        if offload is not None and offload.fine_grained:
            record["activation_offload"]["cpu_affinity"] = start_fine_grained_offloading()
        elif layout.cpu_affinity == "gpu_numa":
            record["cpu_affinity"] = bind_to_gpu_numa_node()
        record["cpu_placement"] = cpu_placement()
        config, chunks = build_model(layout, device, use_te)
        # on or off decides whether each micro-batch adds its weight gradients into main_grad in a separate
        # fp32 kernel; the prediction models the same (`CostOptions.gradient_accumulation_fusion`)
        record["gradient_accumulation_fusion"] = bool(getattr(config, "gradient_accumulation_fusion", False))
        model, optimizer = wrap_for_training(layout, config, chunks, device)
        del chunks
        if layout.packed:
            dp_rank = parallel_state.get_data_parallel_rank()
            batches = packed_micro_batches(layout, device, dp_rank, parallel_state.get_context_parallel_rank())
            # what the prediction is checked against: this DP rank's micro-batches (tokens, sum of s_i^2)
            record["packing"] = layout.packing_plan().summary(dp_rank)
            iterators = [_packed_batches(batches) for _ in model]
        else:
            iterators = [_mock_batches(layout, device) for _ in model]
        graphs = CudaGraphs(layout, model, optimizer, config, device)
        _sync(device)
        measured["build_s"] = time.perf_counter() - t0
        measured["weights_allocated_gib"] = torch.cuda.memory_allocated() / GIB if device == "cuda" else None
        fault = injected_fault(layout, rank)
        times, loss, reserved_by_step = [], None, []
        if layout.host_timing and layout.cuda_graph_impl == "none":
            from .host_timing import layer_host_timer

            host_timer = layer_host_timer(model, combined=layout.moe_a2a_overlap)
        if layout.manual_gc:
            gc.collect()
            gc.disable()  # as Megatron-LM's --manual-gc before its training loop; enabled again in `finally`
        collections_before = _gc_collections()
        for step in range(layout.warmup_steps + layout.steps):
            if fault and step == min(1, layout.warmup_steps + layout.steps - 1):
                _raise_fault(fault)
            graphs.maybe_capture(step)
            if host_timer is not None and step == layout.warmup_steps:
                host_timer.start()
            _sync(device)
            t = time.perf_counter()
            loss = _train_step(layout, model, optimizer, iterators, device, graphs.fwd_bwd)
            _sync(device)
            if step >= layout.warmup_steps:
                times.append(time.perf_counter() - t)
            if device == "cuda":
                reserved_by_step.append(torch.cuda.max_memory_reserved() / GIB)
        # the interpreter's garbage collections over the steps (none with manual_gc)
        collections = _gc_collections() - collections_before
        measured.update(step_times_s=times, loss=loss, gc_collections=collections, **_memory(device))
        if host_timer is not None:
            measured["host_timing"] = host_timer.summary()
        if (why := host_timing_missing(layout, measured.get("host_timing"))) is not None:
            record["note"] = "; ".join(filter(None, [record.get("note"), why]))
        if offload is not None and offload.fine_grained:
            measured.update(fine_grained_offloaded())
        # the running peak after each step (warm-up included): the step in which the reservation stopped growing
        measured["max_reserved_gib_by_step"] = reserved_by_step or None
        if graphs.record() is not None:
            # the timed steps (after `warmup_steps`) all replay the graphs captured before step captured_before_step
            record["cuda_graphs"] = graphs.record()
            measured["graph_capture_s"] = graphs.capture_s
        if layout.memory_history and device == "cuda":
            measured["memory_history"] = True  # recording slowed the timed steps
            _record_memory_history(record, out_dir / "memory" / layout.layout_id, rank)
        if layout.profile and device == "cuda":
            record["trace"] = _profile_step(
                layout, model, optimizer, iterators, out_dir / "traces" / layout.layout_id, rank, graphs.fwd_bwd
            )
        record.update(status="ok", error=None, failure_kind=None)
    except BaseException as exc:  # noqa: BLE001 - recorded per layout, the job goes on
        if isinstance(exc, KeyboardInterrupt):
            raise
        message = f"{type(exc).__name__}: {exc}".strip()
        first = message.splitlines()[0][:600] if message else type(exc).__name__
        oom = isinstance(exc, torch.cuda.OutOfMemoryError)
        record.update(
            status="failed",
            failure_kind="oom" if oom else failure_kind(message),
            error=("OOM: " if oom and not first.startswith("OOM") else "") + first,
            traceback=traceback.format_exc()[-3000:],
        )
        measured.update(_memory(device))
        if layout.memory_history and device == "cuda":
            # the history up to the failure (an OOM's `oom` event included) is what explains it
            _record_memory_history(record, out_dir / "memory" / layout.layout_id, rank)
    finally:
        if host_timer is not None:
            host_timer.remove()
        if graphs is not None:
            with contextlib.suppress(Exception):  # teardown must not mask the layout's own result
                graphs.close()
        if config is not None:
            for hook in ("no_sync_func", "grad_sync_func", "param_sync_func", "grad_scale_func"):
                if hasattr(config, hook):
                    setattr(config, hook, None)
        model = optimizer = config = graphs = host_timer = None
        gc.enable()
        gc.collect()
        if device == "cuda":
            torch.cuda.synchronize()
            if layout.tp_comm_overlap:
                with contextlib.suppress(Exception):
                    destroy_userbuffers()
            torch.cuda.empty_cache()
        parallel_state.destroy_model_parallel()
    record["measured"] = measured
    return record
