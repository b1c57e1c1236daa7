"""`mat theory`: parameters, FLOPs, memory and communication per pipeline stage."""

from __future__ import annotations

import argparse

from ..theory import theory_report
from ..theory.comm import comm_bytes_by_dimension
from ..theory.memory import GIB
from .layout_args import (
    add_gpu_arguments,
    add_layout_arguments,
    add_model_arguments,
    add_workload_arguments,
    gpu_from_args,
    layout_summary,
    specs_from_args,
)
from .output import console, make_table, print_json


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "theory",
        help="parameters, FLOPs, memory and communication per pipeline stage (closed form)",
        description="Closed-form parameters, FLOPs, memory and communication volume for one layout.",
        epilog="examples:\n"
        "  mat theory --model Llama-3.1-8B --num-gpus 8 --tp 2 --pp 2 --seq-len 8192 --gpu H100-SXM\n"
        "  mat theory --model Qwen3-30B-A3B --num-gpus 16 --ep 8 --tp 2 --seq-len 4096 --recompute selective\n"
        "  mat theory --megatron-args tests/fixtures/launches/llama31_405b_h100_1024gpu_fp8cs.sh --json",
    )
    add_model_arguments(p)
    add_gpu_arguments(p)
    add_layout_arguments(p)
    add_workload_arguments(p)
    p.add_argument("--no-vocab-padding", action="store_true", help="do not pad the vocabulary to 128 x tp")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    specs = specs_from_args(args)
    model, parallel, workload = specs.model, specs.parallel, specs.workload
    report = theory_report(
        model,
        parallel,
        workload,
        gpu=gpu_from_args(args),
        convention=args.flops_convention,
        pad_vocab=not args.no_vocab_padding,
    )
    if args.json:
        print_json(report.to_dict())
        return 0
    out = console()
    out.print(f"[bold]{model.name}[/bold] on {parallel.num_gpus} GPUs: {layout_summary(parallel, workload)}")
    rows = []
    for s in report.stages:
        rows.append(
            [
                f"stage {s.stage}",
                f"{s.parameters.total / 1e9:.3f}",
                s.weights_bytes / GIB,
                s.gradients_bytes / GIB,
                s.optimizer_bytes / GIB,
                s.activations_bytes / GIB,
                s.in_flight_microbatches,
                s.allowance_bytes / GIB,
                s.total_bytes / GIB,
            ]
        )
    columns = [
        "per rank",
        "params (B)",
        "weights",
        "grads",
        "optimizer",
        "activations",
        "in flight",
        "allowance",
        "total GiB",
    ]
    out.print(make_table("Memory per rank (GiB)", columns, rows))
    flops = report.flops
    op_rows = [
        [op, *(phases.get(ph, 0.0) / 1e12 for ph in ("fwd", "dgrad", "wgrad"))]
        for op, phases in flops.by_operator.items()
    ]
    out.print(
        make_table(
            f"FLOPs per iteration, all GPUs (TFLOP, {flops.convention} attention)",
            ["operator", "fwd", "dgrad", "wgrad"],
            op_rows,
        )
    )
    out.print(
        f"model FLOPs/iteration {flops.model_flops:.4e} ({flops.model_flops_per_token:.4e} per token), "
        f"hardware FLOPs {flops.hardware_flops:.4e} (recompute {flops.recompute_flops:.3e})"
    )
    dims = sorted({d for vols in report.comm for d in comm_bytes_by_dimension(vols)})
    comm_rows = [
        [f"stage {i}", *(comm_bytes_by_dimension(vols).get(d, 0.0) / GIB for d in dims)]
        for i, vols in enumerate(report.comm)
    ]
    if dims:
        out.print(make_table("Communication per rank per iteration (GiB on the wire, ring)", ["", *dims], comm_rows))
    if report.gpu is not None:
        verdict = "fits" if report.fits else "does NOT fit"
        out.print(
            f"peak {report.peak_memory_gib:.2f} GiB per GPU: {verdict} in {report.gpu.name} "
            f"({report.gpu.hbm_gib:.1f} GiB)"
        )
    return 0
