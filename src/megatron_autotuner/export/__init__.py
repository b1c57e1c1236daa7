"""Write a chosen layout for the launchers people use: Megatron-LM arguments, a Megatron-Bridge
override yaml, a verl megatron actor/ref snippet, the environment variables to launch with, and TE's
tp-comm-overlap yaml (userbuffers) when TP overlap is on. Pure text; no torch."""

from __future__ import annotations

from typing import Any

import yaml

from ..specs.model import ModelSpec
from ..specs.parallel import ParallelConfig, Workload
from ..theory.memory import MemoryAllowance


def megatron_lm_args(model: ModelSpec, parallel: ParallelConfig, workload: Workload) -> list[str]:
    """Megatron-LM `pretrain_gpt.py` arguments for the layout (model shape flags are not repeated)."""
    p, w = parallel, workload
    args = [
        f"--tensor-model-parallel-size {p.tp}",
        f"--pipeline-model-parallel-size {p.pp}",
        f"--context-parallel-size {p.cp}",
        f"--seq-length {w.seq_length}",
        f"--micro-batch-size {w.micro_batch_size}",
        f"--global-batch-size {w.global_batch_size}",
    ]
    if p.vpp:
        args.append(f"--num-layers-per-virtual-pipeline-stage {model.num_layers // p.pp // p.vpp}")
    if model.is_moe:
        args += [f"--expert-model-parallel-size {p.ep}", f"--expert-tensor-parallel-size {p.etp}"]
    if p.sequence_parallel:
        args.append("--sequence-parallel")
    if p.tp_comm_overlap:
        args += ["--tp-comm-overlap", "--tp-comm-overlap-cfg tp_comm_overlap.yaml"]
    if p.cp > 1:
        args.append(f"--cp-comm-type {p.cp_comm_type}")
    if p.use_distributed_optimizer:
        args += ["--use-distributed-optimizer", "--overlap-grad-reduce", "--overlap-param-gather"]
    else:
        args.append("--overlap-grad-reduce")
    if not p.grad_reduce_in_fp32:
        args.append("--grad-reduce-in-bf16")
    rc = w.recompute
    if rc.granularity == "full":
        args += [
            "--recompute-granularity full",
            f"--recompute-method {rc.method}",
            f"--recompute-num-layers {rc.num_layers}",
        ]
    elif rc.granularity == "selective":
        args += ["--recompute-granularity selective", f"--recompute-modules {' '.join(rc.modules)}"]
    if w.precision == "fp8":
        args += ["--fp8-format hybrid", f"--fp8-recipe {w.fp8_recipe}"]
        if w.fp8_param:
            args.append("--fp8-param-gather")
    args.append("--bf16")
    return args


def bridge_overrides(model: ModelSpec, parallel: ParallelConfig, workload: Workload) -> dict[str, Any]:
    """Megatron-Bridge ConfigContainer overrides (`model.*`, `train.*`, `ddp.*`, `optimizer.*`, `mixed_precision.*`).

    fp8 and bf16 main grads are set field by field on `mixed_precision`: the same fp8 format, recipe and fp8
    parameters as the Megatron-LM arguments, all three written out (Bridge's `MixedPrecisionConfig` defaults to
    the tensorwise recipe, and its named fp8 presets turn fp8 parameters on; `fp8_param_gather` sets both the
    model's `fp8_param` and the DDP config's). bf16 main grads are set on both `ddp` and `mixed_precision`, as
    Bridge's performance configs do: `MixedPrecisionConfig.setup` copies its `grad_reduce_in_fp32` over the DDP
    config's.
    """
    p, w = parallel, workload
    out: dict[str, Any] = {
        "model.tensor_model_parallel_size": p.tp,
        "model.pipeline_model_parallel_size": p.pp,
        "model.virtual_pipeline_model_parallel_size": p.vpp,
        "model.context_parallel_size": p.cp,
        "model.sequence_parallel": p.sequence_parallel,
        "model.seq_length": w.seq_length,
        "train.micro_batch_size": w.micro_batch_size,
        "train.global_batch_size": w.global_batch_size,
        "ddp.use_distributed_optimizer": p.use_distributed_optimizer,
        "ddp.overlap_grad_reduce": True,
        "ddp.overlap_param_gather": p.use_distributed_optimizer,
        "optimizer.use_distributed_optimizer": p.use_distributed_optimizer,
        "model.recompute_granularity": None if w.recompute.granularity == "none" else w.recompute.granularity,
    }
    if w.recompute.granularity == "full":
        out["model.recompute_method"] = w.recompute.method
        out["model.recompute_num_layers"] = w.recompute.num_layers
    elif w.recompute.granularity == "selective":
        out["model.recompute_modules"] = list(w.recompute.modules)
    if model.is_moe:
        out["model.expert_model_parallel_size"] = p.ep
        out["model.expert_tensor_parallel_size"] = p.etp
    if p.tp_comm_overlap:
        out["comm_overlap.tp_comm_overlap"] = True
    if not p.grad_reduce_in_fp32:
        out["ddp.grad_reduce_in_fp32"] = False
        out["mixed_precision.grad_reduce_in_fp32"] = False
    if w.precision == "fp8":
        out["mixed_precision.fp8"] = "hybrid"
        out["mixed_precision.fp8_recipe"] = w.fp8_recipe
        out["mixed_precision.fp8_param_gather"] = w.fp8_param
    return out


BRIDGE_MIXED_PRECISION_NOTE = (
    "# mixed_precision.* keys need cfg.mixed_precision to be a MixedPrecisionConfig: recipes pass a name\n"
    "# ('bf16_mixed'); resolve it first: cfg.mixed_precision = get_mixed_precision_config(cfg.mixed_precision)\n"
)


def bridge_overrides_yaml(model: ModelSpec, parallel: ParallelConfig, workload: Workload) -> str:
    overrides = bridge_overrides(model, parallel, workload)
    note = BRIDGE_MIXED_PRECISION_NOTE if any(k.startswith("mixed_precision.") for k in overrides) else ""
    return note + yaml.safe_dump(overrides, sort_keys=False)


def verl_megatron_snippet(model: ModelSpec, parallel: ParallelConfig, workload: Workload) -> dict[str, Any]:
    """verl `actor_rollout_ref.{actor,ref}.megatron` parallel settings (and dynamic batching).

    fp8 goes through verl's pass-through dicts, as verl's fp8 examples do: `override_transformer_config` (fp8,
    fp8_recipe, fp8_param), `override_ddp_config.fp8_param_gather` and, for the actor with fp8 parameters,
    `optim.override_optimizer_config.fp8_recipe` (the distributed optimizer casts master weights by recipe).
    """
    p, w = parallel, workload
    megatron = {
        "tensor_model_parallel_size": p.tp,
        "pipeline_model_parallel_size": p.pp,
        "virtual_pipeline_model_parallel_size": p.vpp,
        "context_parallel_size": p.cp,
        "sequence_parallel": p.sequence_parallel,
        "use_distributed_optimizer": p.use_distributed_optimizer,
    }
    if model.is_moe:
        megatron["expert_model_parallel_size"] = p.ep
        megatron["expert_tensor_parallel_size"] = p.etp
    ddp: dict[str, Any] = {}
    if w.is_training and not p.grad_reduce_in_fp32:
        ddp["grad_reduce_in_fp32"] = False
    if w.precision == "fp8":
        fp8 = {"fp8": "hybrid", "fp8_recipe": w.fp8_recipe, "fp8_param": w.fp8_param}
        megatron["override_transformer_config"] = fp8
        if w.fp8_param and w.is_training:
            ddp["fp8_param_gather"] = True
    if ddp:
        megatron["override_ddp_config"] = ddp
    role: dict[str, Any] = {"megatron": megatron}
    if w.precision == "fp8" and w.fp8_param and w.is_training:
        role["optim"] = {"override_optimizer_config": {"fp8_recipe": w.fp8_recipe}}
    if w.max_token_len is not None:
        role["use_dynamic_bsz"] = True
        key = "ppo_max_token_len_per_gpu" if w.is_training else "log_prob_max_token_len_per_gpu"
        role[key] = w.max_token_len
    else:
        key = "ppo_micro_batch_size_per_gpu" if w.is_training else "log_prob_micro_batch_size_per_gpu"
        role[key] = w.micro_batch_size
    name = "actor" if w.is_training else "ref"
    return {"actor_rollout_ref": {name: role}}


def verl_yaml(model: ModelSpec, parallel: ParallelConfig, workload: Workload) -> str:
    return yaml.safe_dump(verl_megatron_snippet(model, parallel, workload), sort_keys=False)


# TE's defaults (transformer_engine.pytorch.module.base.initialize_ub): ring-exchange for the
# all-gather GEMMs, pipelined (4 splits) reduce-scatter after proj / fc2, bulk overlaps in backward.
TE_TP_OVERLAP_DEFAULT: dict[str, dict[str, Any]] = {
    "qkv_fprop": {"method": "ring_exchange", "aggregate": 0},
    "fc1_fprop": {"method": "ring_exchange", "aggregate": 0},
    "proj_dgrad": {"method": "ring_exchange", "aggregate": 0},
    "fc2_dgrad": {"method": "ring_exchange", "aggregate": 0},
    "proj_fprop": {"method": "pipeline", "num_sm": 24, "cga_size": 2, "num_splits": 4, "set_sm_margin": 1},
    "fc2_fprop": {"method": "pipeline", "num_sm": 16, "cga_size": 2, "num_splits": 4, "set_sm_margin": 1},
    "qkv_dgrad": {"method": "bulk", "num_sm": 4, "cga_size": 2, "set_sm_margin": 0},
    "fc1_dgrad": {"method": "bulk", "num_sm": 2, "cga_size": 2, "set_sm_margin": 0},
    "qkv_wgrad": {"method": "bulk", "num_sm": 24, "cga_size": 2, "set_sm_margin": 0},
    "fc1_wgrad": {"method": "bulk", "num_sm": 8, "cga_size": 2, "set_sm_margin": 0},
}


def te_tp_overlap_yaml(parallel: ParallelConfig) -> str | None:
    """The `--tp-comm-overlap-cfg` yaml (TE userbuffers) when TP overlap is on, else None."""
    if not parallel.tp_comm_overlap:
        return None
    return yaml.safe_dump(TE_TP_OVERLAP_DEFAULT, sort_keys=False)


def launch_environment(parallel: ParallelConfig, expandable_segments: bool = False) -> dict[str, tuple[str, str]]:
    """Environment variables the layout needs, or the prediction assumed: name -> (value, reason)."""
    env: dict[str, tuple[str, str]] = {}
    if parallel.tp > 1 or parallel.cp > 1:
        env["CUDA_DEVICE_MAX_CONNECTIONS"] = (
            "1",
            "Megatron-LM's validate_args requires it with TP or CP (before Blackwell): one hardware queue keeps "
            "the TP / CP communication kernels in issue order, so they overlap with the GEMMs as predicted",
        )
    if expandable_segments:
        env["PYTORCH_CUDA_ALLOC_CONF"] = (
            "expandable_segments:True",
            "the memory prediction assumed PyTorch's expandable segments "
            f"({MemoryAllowance.for_allocator(True).fragmentation_fraction} x activations reserved but unallocated "
            f"on H200, {MemoryAllowance.for_allocator(False).fragmentation_fraction} without)",
        )
    return env


def launch_env_sh(parallel: ParallelConfig, expandable_segments: bool = False) -> str:
    """`launch_env.sh`: source it before torchrun / sbatch (verl: put the same variables in the Ray
    runtime env of the workers)."""
    lines = ["# source before launching (torchrun / srun); written by megatron-autotuner"]
    env = launch_environment(parallel, expandable_segments)
    for name, (value, reason) in env.items():
        lines += [f"# {reason}", f"export {name}={value}"]
    if not env:
        lines.append("# this layout needs no environment variables")
    return "\n".join(lines) + "\n"


def export_all(
    model: ModelSpec, parallel: ParallelConfig, workload: Workload, expandable_segments: bool = False
) -> dict[str, str]:
    """File name -> text for every snippet of one layout (`expandable_segments`: the prediction assumed it)."""
    out = {
        "megatron_lm_args.txt": " \\\n  ".join(megatron_lm_args(model, parallel, workload)) + "\n",
        "bridge_overrides.yaml": bridge_overrides_yaml(model, parallel, workload),
        "verl_megatron.yaml": verl_yaml(model, parallel, workload),
        "launch_env.sh": launch_env_sh(parallel, expandable_segments),
    }
    te = te_tp_overlap_yaml(parallel)
    if te is not None:
        out["tp_comm_overlap.yaml"] = te
    return out


__all__ = [
    "bridge_overrides",
    "bridge_overrides_yaml",
    "export_all",
    "launch_env_sh",
    "launch_environment",
    "megatron_lm_args",
    "te_tp_overlap_yaml",
    "verl_megatron_snippet",
    "verl_yaml",
]
