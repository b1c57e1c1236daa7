"""Write a chosen layout for the launchers people use: Megatron-LM arguments (through the flag table that
`--megatron-args` reads, so an export imports back to the same layout), a nested Megatron-Bridge override yaml,
verl overrides (yaml and command-line form), the environment variables to launch with, and TE's
tp-comm-overlap yaml (userbuffers) when TP overlap is on. Pure text; no torch."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import yaml

from ..costmodel.estimate import CostOptions
from ..specs.megatron_args import render_flags, specs_to_megatron_args
from ..specs.model import ModelSpec
from ..specs.parallel import ParallelConfig, Workload, cuda_device_max_connections, needs_nccl_graph_register_off
from ..theory.memory import EXPANDABLE_SEGMENTS_BY_DEFAULT, MemoryAllowance
from . import bridge, verl


def megatron_args(
    model: ModelSpec,
    parallel: ParallelConfig,
    workload: Workload,
    options: CostOptions | None = None,
    tp_comm_overlap_cfg: str | None = None,
) -> dict[str, Any]:
    """The Megatron-LM argument values (dests) of the layout as the prediction assumed it: the flag table's
    `specs_to_megatron_args`, with the cost model's default options when none are given."""
    return specs_to_megatron_args(model, parallel, workload, options or CostOptions(), tp_comm_overlap_cfg)


def megatron_lm_args(
    model: ModelSpec,
    parallel: ParallelConfig,
    workload: Workload,
    options: CostOptions | None = None,
    tp_comm_overlap_cfg: str | None = None,
) -> list[str]:
    """Megatron-LM `pretrain_gpt.py` flags (`pretrain_hybrid.py` for a hybrid model: --hybrid-layer-pattern) for the
    model, layout and workload, each with its values, carrying everything the prediction assumed (overlaps, fusions,
    MoE dispatcher and grouped GEMM, pipeline layout)."""
    return render_flags(megatron_args(model, parallel, workload, options, tp_comm_overlap_cfg))


def bridge_overrides(
    model: ModelSpec,
    parallel: ParallelConfig,
    workload: Workload,
    options: CostOptions | None = None,
    tp_comm_overlap_cfg: str | None = None,
) -> dict[str, Any]:
    """Nested Megatron-Bridge ConfigContainer overrides (`export.bridge`) of the same arguments."""
    args = megatron_args(model, parallel, workload, options, tp_comm_overlap_cfg)
    return bridge.bridge_overrides(args, tp_comm_overlap_cfg=tp_comm_overlap_cfg)


def verl_megatron_snippet(
    model: ModelSpec, parallel: ParallelConfig, workload: Workload, options: CostOptions | None = None
) -> dict[str, Any]:
    """verl `actor_rollout_ref` overrides (`export.verl`): the actor's layout, shared by ref and rollout log-prob
    passes in colocated mode; token budgets per GPU divided by CP (verl multiplies them by CP)."""
    args = megatron_args(model, parallel, workload, options)
    return verl.verl_overrides(args, mode=workload.mode, max_token_len=workload.max_token_len)


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


def te_tp_overlap_yaml(parallel: ParallelConfig, tuned_yaml: str | None = None) -> str | None:
    """The `--tp-comm-overlap-cfg` yaml (TE userbuffers) when TP overlap is on, else None: the tuned file's text
    when one is given (`mat overlap` writes it), else TE's defaults, which is what the cost model charged."""
    if not parallel.tp_comm_overlap:
        return None
    if tuned_yaml is not None:
        return tuned_yaml
    return yaml.safe_dump(TE_TP_OVERLAP_DEFAULT, sort_keys=False)


def launch_environment(
    parallel: ParallelConfig, expandable_segments: bool = False, cuda_graph_impl: str = "none"
) -> dict[str, tuple[str, str]]:
    """Environment variables the layout needs, or the prediction assumed: name -> (value, reason)."""
    env: dict[str, tuple[str, str]] = {}
    connections = cuda_device_max_connections(parallel)
    if connections == 1:
        env["CUDA_DEVICE_MAX_CONNECTIONS"] = (
            "1",
            "Megatron-LM's validate_args requires it with TP or CP (before Blackwell): one hardware queue keeps "
            "the TP / CP communication kernels in issue order, so they overlap with the GEMMs as predicted",
        )
    elif connections is not None:
        env["CUDA_DEVICE_MAX_CONNECTIONS"] = (
            str(connections),
            "the EP all-to-all overlap runs its communication and computation streams side by side on separate "
            "hardware queues (Megatron-Bridge's performance scripts' value for this dispatcher on Hopper)",
        )
    if expandable_segments:
        env["PYTORCH_CUDA_ALLOC_CONF"] = (
            "expandable_segments:True",
            "the memory prediction assumed PyTorch's expandable segments "
            f"({MemoryAllowance.for_allocator(True).fragmentation_fraction} x activations reserved but unallocated "
            f"on H200, {MemoryAllowance.for_allocator(False).fragmentation_fraction} without)",
        )
    if needs_nccl_graph_register_off(cuda_graph_impl, expandable_segments):
        env["NCCL_GRAPH_REGISTER"] = (
            "0",
            "Megatron-LM refuses transformer_engine CUDA graphs beside expandable segments without it "
            "(specs.parallel.needs_nccl_graph_register_off)",
        )
    return env


def launch_env_sh(parallel: ParallelConfig, expandable_segments: bool = False, cuda_graph_impl: str = "none") -> str:
    """`launch_env.sh`: source it before torchrun / sbatch (verl: put the same variables in the Ray
    runtime env of the workers)."""
    lines = ["# source before launching (torchrun / srun); written by megatron-autotuner"]
    env = launch_environment(parallel, expandable_segments, cuda_graph_impl)
    for name, (value, reason) in env.items():
        lines += [f"# {reason}", f"export {name}={value}"]
    if not env:
        lines.append("# this layout needs no environment variables")
    return "\n".join(lines) + "\n"


def _or_refusal(write: Callable[[], str], model: ModelSpec) -> str:
    """A framework's snippet, or for a hybrid model one comment line saying why that framework cannot run the
    layout: megatron-core 0.16.1 (Megatron-Bridge v0.3.1, verl's megatron engine) builds a hybrid model without
    virtual stages and with only first / last uneven stages, which Megatron-LM's `|`-separated pattern can say."""
    if not model.hybrid_layer_pattern:
        return write()
    try:
        return write()
    except ValueError as exc:
        return f"# not written for this layout: {exc}\n"


def export_all(
    model: ModelSpec,
    parallel: ParallelConfig,
    workload: Workload,
    expandable_segments: bool | None = None,
    options: CostOptions | None = None,
    tuned_tp_overlap_yaml: str | None = None,
) -> dict[str, str]:
    """File name -> text for every snippet of one layout (`expandable_segments`: the prediction assumed it; None:
    as `options` say, else the tool's default; `options`: the cost options it was predicted with;
    `tuned_tp_overlap_yaml`: a tuned TE userbuffers file)."""
    if expandable_segments is None:
        expandable_segments = EXPANDABLE_SEGMENTS_BY_DEFAULT if options is None else options.expandable_segments
    te = te_tp_overlap_yaml(parallel, tuned_tp_overlap_yaml)
    te_name = "tp_comm_overlap.yaml" if te is not None else None
    args = megatron_args(model, parallel, workload, options, te_name)
    out = {
        # one line of shell-quoted words (a layout string or a --moe-layer-freq list holds | ( * [): bash's quote
        # removal must see it, so `eval "torchrun ... pretrain_gpt.py $(cat megatron_lm_args.txt)"` (a hybrid
        # model: pretrain_hybrid.py); a bare $(cat ...) would hand Megatron-LM the quotes. `mat estimate
        # --megatron-args` reads it the same way.
        "megatron_lm_args.txt": " ".join(render_flags(args)) + "\n",
        "bridge_overrides.yaml": _or_refusal(
            lambda: bridge.bridge_overrides_yaml(args, tp_comm_overlap_cfg=te_name), model
        ),
        "verl_megatron.yaml": _or_refusal(
            lambda: verl.verl_overrides_yaml(args, mode=workload.mode, max_token_len=workload.max_token_len), model
        ),
        "verl_overrides.txt": _or_refusal(
            lambda: (
                " ".join(verl.verl_override_lines(args, mode=workload.mode, max_token_len=workload.max_token_len))
                + "\n"
            ),
            model,
        ),
        "launch_env.sh": launch_env_sh(parallel, expandable_segments, workload.cuda_graph.impl),
    }
    if te is not None:
        out["tp_comm_overlap.yaml"] = te
    return out


__all__ = [
    "bridge_overrides",
    "megatron_args",
    "export_all",
    "launch_env_sh",
    "launch_environment",
    "megatron_lm_args",
    "te_tp_overlap_yaml",
    "verl_megatron_snippet",
]
