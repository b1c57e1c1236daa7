"""`mat estimate`: predicted step time, throughput, MFU and memory of one layout."""

from __future__ import annotations

import argparse

from ..costmodel import CostOptions, estimate, load_calibration
from ..errors import ConfigError
from .layout_args import (
    add_gpu_arguments,
    add_layout_arguments,
    add_model_arguments,
    add_workload_arguments,
    gpu_from_args,
    layout_summary,
    model_from_args,
    parallel_from_args,
    workload_from_args,
)
from .output import console, make_table, print_json


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "estimate",
        help="predicted step time, tokens/s, TFLOP/s, MFU and memory of one layout",
        description="Cost-model prediction for one layout (no GPU needed).",
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
    g.add_argument("--calibration", help="calibration JSON from the testbench (mat profile ... / calibration)")
    g.add_argument("--memory-margin", type=float, default=0.0, help="fraction of HBM kept free when judging fit")
    add_expandable_segments_argument(g)
    g.add_argument(
        "--tp-comm-overlap",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="TE userbuffers TP overlap (default: on with sequence parallelism)",
    )


# The memory table's rows; the optimizer step's fp32 gradient copy replaces the activations at the peak when it is
# larger (it is held only while the activations are gone), so the total is not the column's sum.
MEMORY_ROW_LABELS = {"optimizer_step": "optimizer step only (fp32 grad copy)"}


def add_expandable_segments_argument(p: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """`--expandable-segments` of `mat estimate` and `mat plan` (read by `cost_options_from_args`)."""
    p.add_argument(
        "--expandable-segments",
        action="store_true",
        help="PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True: predict its smaller reserved-but-unallocated memory",
    )


def cost_options_from_args(args: argparse.Namespace) -> CostOptions:
    calibration = load_calibration(args.calibration) if getattr(args, "calibration", None) else None
    return CostOptions(
        flops_convention=args.flops_convention,
        calibration=calibration,
        memory_margin=args.memory_margin,
        expandable_segments=getattr(args, "expandable_segments", False),
    )


def run(args: argparse.Namespace) -> int:
    model = model_from_args(args)
    gpu = gpu_from_args(args)
    if gpu is None:
        raise ConfigError("gpu", "is required")
    parallel = parallel_from_args(args)
    overlap = args.tp_comm_overlap if args.tp_comm_overlap is not None else parallel.sequence_parallel
    if overlap and not parallel.sequence_parallel:
        raise ConfigError("tp_comm_overlap", "needs --sp (TE userbuffers overlap the SP collectives)")
    parallel = parallel.replace(tp_comm_overlap=overlap)
    workload = workload_from_args(args, parallel)
    est = estimate(model, parallel, workload, gpu, cost_options_from_args(args))
    if args.json:
        print_json(est.to_dict())
        return 0
    out = console()
    out.print(f"[bold]{model.name}[/bold] on {parallel.num_gpus} x {gpu.name}: {layout_summary(parallel, workload)}")
    rows = [
        ["step time (s)", est.step_time_s],
        ["tokens/s/GPU", est.tokens_per_s_per_gpu],
        [f"model TFLOP/s/GPU ({est.options.flops_convention})", est.model_tflops_per_gpu],
        ["hardware TFLOP/s/GPU", est.hardware_tflops_per_gpu],
        ["MFU (bf16 peak)", est.mfu],
        ["peak memory (GiB)", est.peak_memory_gib],
        ["fits", "yes" if est.fits else "NO"],
    ]
    out.print(make_table("Prediction", ["", "value"], rows))
    b = est.time.breakdown
    trows = [[f"compute: {k}", v] for k, v in b["compute"].items()]
    trows += [[f"exposed comm: {k}", v] for k, v in b["exposed_comm"].items()]
    trows += [["pipeline bubble", b["bubble"]], ["optimizer", b["optimizer"]], ["total", b["total"]]]
    out.print(make_table("Where the step time goes (s, critical stage)", ["", "seconds"], trows))
    shown = {k: v for k, v in est.memory_breakdown_gib.items() if k != "stage" and (k != "optimizer_step" or v)}
    mrows = [[MEMORY_ROW_LABELS.get(k, k), v] for k, v in shown.items()]
    out.print(make_table(f"Memory of the peak stage ({est.memory_breakdown_gib['stage']}) GiB", ["", "GiB"], mrows))
    return 0
