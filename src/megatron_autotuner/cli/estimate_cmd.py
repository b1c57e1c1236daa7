"""`mat estimate`: predicted step time, throughput, MFU and memory of one layout."""

from __future__ import annotations

import argparse

from ..argspec.argtypes import margin_fraction, non_empty_path
from ..argspec.common import add_cross_entropy_fusion_impl_argument
from ..costmodel import DEFAULT_MEMORY_MARGIN, CostOptions, estimate, load_calibration
from ..errors import ConfigError
from ..theory.memory import EXPANDABLE_SEGMENTS_BY_DEFAULT
from .layout_args import (
    add_gpu_arguments,
    add_layout_arguments,
    add_model_arguments,
    add_workload_arguments,
    gpu_from_args,
    launch_run_options,
    layout_summary,
    specs_from_args,
)
from .output import console, make_table, print_json


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "estimate",
        help="predicted step time, tokens/s, TFLOP/s, MFU and memory of one layout",
        description="Cost-model prediction for one layout (no GPU needed): from the tool's options, or from your "
        "own Megatron-LM launch with --megatron-args.",
        epilog="examples:\n"
        "  mat estimate --model Llama-3.1-8B --gpu H100-SXM --num-gpus 8 --tp 2 --seq-len 8192 "
        "--global-batch-size 64\n"
        "  mat estimate --model Qwen3-30B-A3B --gpu H200 --num-gpus 16 --ep 8 --seq-len 4096 --recompute selective "
        "--json\n"
        "  mat estimate --megatron-args examples/llama31_8b_h100_8gpu.sh --gpu H100-SXM"
        "   # flags, or a whole torchrun command",
    )
    add_model_arguments(p)
    add_gpu_arguments(p, required=True)
    add_layout_arguments(p)
    add_workload_arguments(p)
    add_cost_arguments(p)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=run)


def add_cost_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("cost model")
    g.add_argument(
        "--calibration",
        type=non_empty_path,
        help="calibration JSON from the testbench (mat profile --calibration-out; default: the built-in default "
        "efficiencies)",
    )
    g.add_argument(
        "--memory-margin",
        type=margin_fraction,
        default=DEFAULT_MEMORY_MARGIN,
        help="fraction of HBM kept free when judging whether a layout fits, in [0, 1); the same default in "
        "mat estimate and mat plan (the memory model is within ~5%% of measured peaks)",
    )
    add_expandable_segments_argument(g)
    add_assumption_arguments(g)


def add_assumption_arguments(p: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """What the run executes beyond the layout, for `mat estimate` and `mat plan` without a launch (a launch says
    it with its own flags). The defaults are Megatron-LM's, and `mat validate` runs each of them."""
    p.add_argument(
        "--tp-comm-overlap",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="TE userbuffers overlap of the TP collectives with their GEMMs, on sequence-parallel layouts "
        "(Megatron-LM's --tp-comm-overlap; default off, as there)",
    )
    p.add_argument(
        "--cross-entropy-fusion",
        action="store_true",
        help="fused cross-entropy loss (Megatron-LM's --cross-entropy-loss-fusion; default off, as there)",
    )
    add_cross_entropy_fusion_impl_argument(p)
    p.add_argument(
        "--moe-permute-fusion",
        action="store_true",
        help="TE's fused MoE token permute (Megatron-LM's --moe-permute-fusion; default off, as there): its kernels "
        "and its eager host floor",
    )
    p.add_argument(
        "--no-gradient-accumulation-fusion",
        dest="gradient_accumulation_fusion",
        action="store_false",
        help="wgrad GEMMs not accumulated straight into the fp32 main grads (Megatron-LM's "
        "--no-gradient-accumulation-fusion; the fusion needs APEX)",
    )


def reject_assumptions_with_launch(args: argparse.Namespace) -> None:
    """With --megatron-args the launch's own flags say what runs: the tool's assumption flags are refused."""
    given = {
        "tp_comm_overlap": args.tp_comm_overlap is not None,
        "cross_entropy_fusion": args.cross_entropy_fusion,
        "moe_permute_fusion": args.moe_permute_fusion,
        "cross_entropy_fusion_impl": args.cross_entropy_fusion_impl != "native",
        "gradient_accumulation_fusion": not args.gradient_accumulation_fusion,
    }
    for name, set_here in given.items():
        if set_here:
            flag = {"cross_entropy_fusion": "--cross-entropy-loss-fusion"}.get(name, "--" + name.replace("_", "-"))
            raise ConfigError(name, f"goes in the Megatron-LM launch ({flag}) with --megatron-args")


def print_notes(out, notes, not_modelled) -> None:
    """The notes of a prediction, and each `not modelled: --flag` line (the estimate stands without them)."""
    for note in notes:
        out.print(f"note: {note}")
    for flag in not_modelled:
        out.print(f"[yellow]not modelled:[/yellow] {flag}")


# The memory table's rows; the optimizer step's fp32 gradient copy replaces the activations at the peak when it is
# larger (it is held only while the activations are gone), so the total is not the column's sum.
MEMORY_ROW_LABELS = {
    "optimizer_step": "optimizer step only (fp32 grad copy)",
    "offloaded_to_host": "activations offloaded to host (not in HBM)",
}


def add_expandable_segments_argument(p: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """`--expandable-segments` of `mat estimate` and `mat plan` (read by `cost_options_from_args`)."""
    p.add_argument(
        "--expandable-segments",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True, and its smaller reserved-but-unallocated memory "
        "(default: on, written into launch_env.sh; a --megatron-args launch: what its environment says; "
        "--no-expandable-segments: PyTorch's default allocator)",
    )


def cost_options_from_args(args: argparse.Namespace, launch_options: dict | None = None) -> CostOptions:
    """CostOptions from the CLI, with what a Megatron-LM launch said (`launch_options`: overlaps, fusions, MoE
    execution, expandable segments) taking the place of the tool's defaults."""
    calibration = load_calibration(args.calibration) if getattr(args, "calibration", None) else None
    if launch_options is None:
        fields: dict = {
            "fused_cross_entropy": getattr(args, "cross_entropy_fusion", False),
            "moe_permute_fusion": getattr(args, "moe_permute_fusion", False),
            "cross_entropy_fusion_impl": getattr(args, "cross_entropy_fusion_impl", "native"),
            "gradient_accumulation_fusion": getattr(args, "gradient_accumulation_fusion", True),
        }
    else:
        fields = dict(launch_options)
    # the flag when given; else a launch's own environment, or the tool's default
    flag = getattr(args, "expandable_segments", None)
    if flag is not None:
        fields["expandable_segments"] = flag
    elif launch_options is None:
        fields["expandable_segments"] = EXPANDABLE_SEGMENTS_BY_DEFAULT
    return CostOptions(
        flops_convention=args.flops_convention,
        calibration=calibration,
        memory_margin=args.memory_margin,
        **fields,
    )


def run_settings_line(settings: dict) -> str:
    """The 'run settings assumed' line, from the `run_settings` entry the JSON carries
    (`costmodel.estimate.run_settings`): the allocator, Megatron-LM's run flags, TP communication overlap (TE
    userbuffers, which run with sequence parallelism only), the model's dropout and what paces the host."""
    on_off = {True: "on", False: "off"}
    host = {
        "default": "host floor default (one H100 machine's host; hosts measured {:g}x-{:g}x)",
        "calibration": "host floor from the calibration",
        "off": "host floor off (GPU time alone)",
    }[settings["host_floor"]].format(*(settings["host_pace_range"] or ()))
    parts = [
        "allocator "
        + ("expandable segments (launch_env.sh)" if settings["expandable_segments"] else "PyTorch default (no env)"),
        f"grad-reduce overlap {on_off[settings['overlap_grad_reduce']]}",
        f"param-gather overlap {on_off[settings['overlap_param_gather']]}",
        f"gradient-accumulation fusion {on_off[settings['gradient_accumulation_fusion']]}",
        f"cross-entropy fusion {on_off[settings['fused_cross_entropy']]}"
        + (f" ({settings['cross_entropy_fusion_impl']})" if settings.get("cross_entropy_fusion_impl") else ""),
        "TP-communication overlap "
        + ("on with sequence parallelism (TE userbuffers)" if settings["tp_comm_overlap"] else "off"),
        f"hidden dropout {settings['hidden_dropout']:g}, attention dropout {settings['attention_dropout']:g}",
        host,
    ]
    if settings.get("moe_permute_fusion") is not None:  # a MoE model: its permute path sets its kernels and host floor
        parts.insert(5, f"MoE permute fusion {on_off[settings['moe_permute_fusion']]}")
    return ", ".join(parts)


def run(args: argparse.Namespace) -> int:
    gpu = gpu_from_args(args)
    if gpu is None:
        raise ConfigError("gpu", "is required")
    specs = specs_from_args(args)
    model, parallel, workload = specs.model, specs.parallel, specs.workload
    if specs.imported is None:
        overlap = bool(args.tp_comm_overlap)
        if overlap and not parallel.sequence_parallel:
            raise ConfigError("tp_comm_overlap", "needs --sp (TE userbuffers overlap the SP collectives)")
        parallel = parallel.replace(tp_comm_overlap=overlap)
    else:
        reject_assumptions_with_launch(args)
    options = cost_options_from_args(args, specs.options)
    if specs.imported is not None:
        options = launch_run_options(specs.imported, options, gpu)
    est = estimate(model, parallel, workload, gpu, options)
    est = est.with_notes(specs.notes, specs.not_modelled)
    if args.json:
        print_json(est.to_dict())
        return 0
    out = console()
    out.print(f"[bold]{model.name}[/bold] on {parallel.num_gpus} x {gpu.name}: {layout_summary(parallel, workload)}")
    print_notes(out, est.notes, est.not_modelled)
    out.print(f"run settings assumed: {run_settings_line(est.run_settings)}")
    rows = [
        ["step time (s)", est.step_time_s],
        *(
            [["step time on hosts measured (s)", "{:.3f} - {:.3f}".format(*est.step_time_range_s)]]
            if est.step_time_range_s
            else []
        ),
        ["tokens/s/GPU", est.tokens_per_s_per_gpu],
        [f"model TFLOP/s/GPU ({est.options.flops_convention})", est.model_tflops_per_gpu],
        ["hardware TFLOP/s/GPU", est.hardware_tflops_per_gpu],
        ["MFU (bf16 peak)", est.mfu],
        *([["MFU (fp8 peak)", est.mfu_fp8]] if est.mfu_fp8 is not None else []),
        ["peak memory (GiB)", est.peak_memory_gib],
        [f"fits (HBM less a {est.options.memory_margin:.0%} margin)", "yes" if est.fits else "NO"],
    ]
    out.print(make_table("Prediction", ["", "value"], rows))
    b = est.time.breakdown
    trows = [[f"compute: {k}", v] for k, v in b["compute"].items()]
    trows += [[f"exposed comm: {k}", v] for k, v in b["exposed_comm"].items()]
    if "offload" in b:
        trows.append(["activation offload copies (exposed)", b["offload"]])
    trows += [["pipeline bubble", b["bubble"]], ["GPU waiting on the host", b["host_bound"]]]
    trows += [["optimizer", b["optimizer"]], ["total", b["total"]]]
    out.print(make_table("Where the step time goes (s, critical stage)", ["", "seconds"], trows))
    shown = {k: v for k, v in est.memory_breakdown_gib.items() if k != "stage" and (k != "optimizer_step" or v)}
    mrows = [[MEMORY_ROW_LABELS.get(k, k), v] for k, v in shown.items()]
    out.print(make_table(f"Memory of the peak stage ({est.memory_breakdown_gib['stage']}) GiB", ["", "GiB"], mrows))
    return 0
