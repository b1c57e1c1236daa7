"""`mat plan`: rank every layout for a model, GPU count and workload; write a report directory."""

from __future__ import annotations

import argparse
import importlib

from ..errors import AutotunerError, ConfigError
from ..report import output_dir_for, write_plan_report
from ..search import plan
from ..validate.command import add_stand_in_argument
from .estimate_cmd import add_expandable_segments_argument, cost_options_from_args
from .layout_args import (
    add_gpu_arguments,
    add_grad_reduce_argument,
    add_model_arguments,
    add_precision_arguments,
    gpu_from_args,
    model_from_args,
)
from .output import console, make_table, print_json


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "plan",
        help="rank all layouts by predicted throughput, with memory pruning and launcher snippets",
        description="Search tp/pp/vpp/cp/dp/ep/etp/sp/micro-batch/recompute/distributed-optimizer layouts.",
    )
    add_model_arguments(p)
    add_gpu_arguments(p, required=True)
    p.add_argument("--num-gpus", type=int, required=True)
    p.add_argument("--seq-len", type=int, required=True)
    p.add_argument("--global-batch-size", type=int, required=True)
    p.add_argument("--mode", choices=["train", "forward"], default="train")
    add_precision_arguments(p)
    p.add_argument("--max-token-len", type=int, default=None, help="verl dynamic batching: tokens per micro-batch")
    p.add_argument("--flops-convention", choices=["causal", "full"], default="causal")
    p.add_argument("--memory-margin", type=float, default=0.05, help="fraction of HBM kept free (default 0.05)")
    add_expandable_segments_argument(p)
    add_grad_reduce_argument(p)
    p.add_argument("--calibration", help="calibration JSON from the testbench")
    p.add_argument("--top", type=int, default=5, help="layouts to show and export (default 5)")
    p.add_argument("--output-dir", help="report directory (default outputs/<UTC timestamp>-plan/)")
    p.add_argument("--no-chart", action="store_true", help="skip the PNG chart")
    p.add_argument(
        "--validate",
        type=int,
        default=None,
        metavar="K",
        help="run short real megatron-core runs of the top K (needs GPUs and the validate package)",
    )
    p.add_argument(
        "--measure-host-floor",
        action="store_true",
        help="with --validate: first time the eager MoE block on this machine and predict MoE layouts with it",
    )
    add_stand_in_argument(p, prefix="with --validate: ")
    p.add_argument("--json", action="store_true", help="print the plan as JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.top < 1:
        raise ConfigError("top", f"must be >= 1, got {args.top}")
    model = model_from_args(args)
    gpu = gpu_from_args(args)
    if gpu is None:
        raise ConfigError("gpu", "is required")
    for name in ("num_gpus", "seq_len", "global_batch_size"):
        if getattr(args, name) < 1:
            raise ConfigError(name, f"must be a positive integer, got {getattr(args, name)}")
    if args.stand_in and (args.validate is None or args.measure_host_floor):
        raise ConfigError("stand_in", "--stand-in goes with --validate K and measures memory only (no host floor)")
    options = cost_options_from_args(args)
    result = plan(
        model,
        gpu,
        args.num_gpus,
        args.seq_len,
        args.global_batch_size,
        mode=args.mode,
        precision=args.precision,
        max_token_len=args.max_token_len,
        memory_margin=args.memory_margin,
        options=options,
        grad_reduce_in_fp32=not args.grad_reduce_in_bf16,
        fp8_recipe=args.fp8_recipe,
        fp8_param=args.fp8_param_gather,
    )
    out_dir = output_dir_for("plan", args.output_dir)
    files = write_plan_report(result, out_dir, args.top, chart=not args.no_chart)
    if args.validate is not None:
        try:
            validate = importlib.import_module("megatron_autotuner.validate")
            validate_plan = validate.validate_plan
        except (ImportError, AttributeError) as exc:
            raise AutotunerError(f"--validate needs megatron_autotuner.validate.validate_plan ({exc})") from exc
        validate_plan(
            result,
            args.validate,
            out_dir,
            calibration=options.calibration,
            measure_host_floor=args.measure_host_floor,
            stand_in=args.stand_in,
        )
    if args.json:
        data = result.to_dict(top_k=args.top)
        data["output_dir"] = str(out_dir)
        data["files"] = files
        print_json(data)
        return 0
    out = console()
    precision = result.base_workload.precision_label
    out.print(
        f"[bold]{model.name}[/bold] on {args.num_gpus} x {gpu.name}, seq {args.seq_len}, "
        f"global batch {args.global_batch_size}, {args.mode}{'' if precision == 'bf16' else ', ' + precision}"
        f"{', bf16 main grads' if args.grad_reduce_in_bf16 else ''}: "
        f"{result.considered} layouts considered, "
        f"{len(result.candidates)} fit, {len(result.rejections)} rejected in {result.elapsed_s:.2f} s"
    )
    rows = [
        [
            c.rank,
            c.label,
            c.estimate.step_time_s,
            c.estimate.tokens_per_s_per_gpu,
            c.estimate.model_tflops_per_gpu,
            c.estimate.mfu,
            c.estimate.peak_memory_gib,
        ]
        for c in result.top(args.top)
    ]
    out.print(
        make_table(
            "Top layouts (predicted)",
            ["rank", "layout", "step s", "tok/s/GPU", f"TFLOP/s ({args.flops_convention})", "MFU", "GiB"],
            rows,
        )
    )
    out.print("rejections: " + ", ".join(f"{k} {v}" for k, v in result.rejection_counts().items()))
    out.print(f"report, chart and launcher snippets: {out_dir}")
    return 0
