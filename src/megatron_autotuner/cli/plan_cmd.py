"""`mat plan`: rank every layout for a model, GPU count and workload; write a report directory."""

from __future__ import annotations

import argparse
import importlib

from ..argspec.argtypes import margin_fraction, non_empty_path, positive_int
from ..argspec.common import add_grad_reduce_argument, add_precision_arguments
from ..costmodel.estimate import DEFAULT_MEMORY_MARGIN, estimate
from ..errors import AutotunerError, ConfigError
from ..files import CONFIG_LIMIT_BYTES, ensure_output_dir, read_text_bounded
from ..report import output_dir_for, write_plan_report
from ..search import GRAPH_MODES, plan_with_graphs
from ..search.current import CurrentRun, compare_with_best
from ..validate.command import add_stand_in_argument
from .estimate_cmd import add_expandable_segments_argument, cost_options_from_args, print_notes
from .layout_args import (
    add_flops_convention_argument,
    add_gpu_arguments,
    add_length_arguments,
    add_mode_arguments,
    add_model_arguments,
    gpu_from_args,
    import_launch,
    lengths_from_args,
    model_from_args,
)
from .output import console, make_table, print_json


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "plan",
        help="rank all layouts by predicted throughput, with memory pruning and launcher snippets",
        description="Search tp/pp/vpp (even and uneven pipeline layouts)/cp/dp/ep/etp/sp/micro-batch/recompute/"
        "distributed-optimizer layouts. With --megatron-args, your own launch is predicted beside the best ones, "
        "with the flags to change.",
        epilog="examples:\n"
        "  mat plan --model Llama-3.1-8B --gpu H100-SXM --num-gpus 8 --seq-len 8192 --global-batch-size 64\n"
        "  mat plan --megatron-args examples/llama31_8b_h100_8gpu.sh --gpu H100-SXM"
        "   # your run vs the best, and the flags to change\n"
        "  mat plan --model Qwen3-8B --gpu H100-SXM --num-gpus 8 --global-batch-size 256 --prompt-len 1024:2048 "
        "--response-len 2048:6144   # verl RLHF: picks max_token_len with the layout",
    )
    add_model_arguments(p)
    add_gpu_arguments(p, required=True)
    p.add_argument(
        "--num-gpus",
        type=positive_int,
        help="GPUs to plan for (required without --megatron-args; with it, default the launch's world size)",
    )
    p.add_argument(
        "--seq-len",
        type=positive_int,
        help="tokens per sequence (required without --megatron-args or lengths; with it, taken from the launch)",
    )
    p.add_argument(
        "--global-batch-size",
        type=positive_int,
        help="sequences per optimizer step (required without --megatron-args; with it, taken from the launch)",
    )
    add_mode_arguments(p)
    add_length_arguments(p)
    add_precision_arguments(p)
    add_flops_convention_argument(p)
    p.add_argument(
        "--memory-margin",
        type=margin_fraction,
        default=DEFAULT_MEMORY_MARGIN,
        help="fraction of HBM kept free when judging whether a layout fits, in [0, 1); the same default in "
        "mat estimate and mat plan (the memory model is within ~5%% of measured peaks)",
    )
    add_expandable_segments_argument(p)
    add_grad_reduce_argument(p)
    p.add_argument(
        "--calibration",
        type=non_empty_path,
        help="calibration JSON from the testbench (mat profile --calibration-out; default: the built-in "
        "default efficiencies)",
    )
    p.add_argument(
        "--tp-comm-overlap-cfg",
        metavar="YAML",
        type=non_empty_path,
        help="a tuned TE userbuffers yaml (mat overlap writes one) to export with TP-overlap layouts (default: TE's "
        "own userbuffers settings)",
    )
    p.add_argument(
        "--cuda-graphs",
        choices=GRAPH_MODES,
        default="auto",
        help="Transformer Engine per-layer CUDA graphs: auto tries them for every layout when the fastest eager one "
        "waits on the host (small models, small micro-batches), try always, off never (default auto; a launch's "
        "own graphs are kept as given)",
    )
    p.add_argument("--top", type=positive_int, default=5, help="layouts to show and export (default 5)")
    p.add_argument("--output-dir", type=non_empty_path, help="report directory (default outputs/<UTC timestamp>-plan/)")
    p.add_argument("--no-chart", action="store_true", help="skip the PNG chart")
    p.add_argument(
        "--validate",
        type=positive_int,
        default=None,
        metavar="K",
        help="run short real megatron-core runs of the top K (needs GPUs and the validate package; default: none, "
        "predict only)",
    )
    p.add_argument(
        "--measure-host-floor",
        action="store_true",
        help="with --validate: first measure this machine's dense and MoE host floors and predict with them",
    )
    add_stand_in_argument(p, prefix="with --validate: ")
    p.add_argument("--json", action="store_true", help="print the plan as JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.top < 1:
        raise ConfigError("top", f"must be >= 1, got {args.top}")
    gpu = gpu_from_args(args)
    if gpu is None:
        raise ConfigError("gpu", "is required")
    if args.stand_in and (args.validate is None or args.measure_host_floor):
        raise ConfigError("stand_in", "--stand-in goes with --validate K and measures memory only (no host floor)")
    if args.validate is not None:  # the runs need a GPU: say so before the search (exit 1), not after it
        from ..launch.devices import require_cuda_gpus

        require_cuda_gpus(args.validate, "layouts to validate", "drop --validate to plan without a GPU")
    # before the search: an output folder that cannot be written, or an unreadable yaml, fails now, not after it
    out_dir = output_dir_for("plan", args.output_dir, create=False)
    tuned = None
    if args.tp_comm_overlap_cfg:
        tuned = read_text_bounded(args.tp_comm_overlap_cfg, "tp_comm_overlap_cfg", CONFIG_LIMIT_BYTES)
    current = None
    lengths = lengths_from_args(args)
    if lengths is not None:
        if args.megatron_args:
            raise ConfigError("prompt_len", "variable lengths are not read with --megatron-args (the launch is fixed)")
        if args.seq_len is not None:
            raise ConfigError("seq_len", "comes from the lengths (the longest prompt + response) with variable lengths")
        args.seq_len = lengths.max_tokens
    if args.megatron_args:
        for name in ("seq_len", "global_batch_size", "precision", "fp8_recipe", "fp8_param_gather"):
            if getattr(args, name) is not None:
                raise ConfigError(name, f"--{name.replace('_', '-')} comes from the launch with --megatron-args")
        if args.num_layers is not None:
            raise ConfigError("num_layers", "goes in the Megatron-LM launch (--num-layers) with --megatron-args")
        imported = import_launch(args)
        model, mine, work = imported.model, imported.parallel, imported.workload
        current = estimate(model, mine, work, gpu, cost_options_from_args(args, imported.options))
        current = current.with_notes(imported.notes, imported.not_modelled)
        num_gpus, seq, gbs = mine.num_gpus, work.seq_length, work.global_batch_size
        precision, recipe, fp8_param = work.precision, work.fp8_recipe, work.fp8_param
        grad_fp32 = mine.grad_reduce_in_fp32
        graphs = work.cuda_graph  # the launch's CUDA graphs, kept for every candidate
    else:
        model = model_from_args(args)
        for name in ("num_gpus", "seq_len", "global_batch_size"):
            if getattr(args, name) is None:
                raise ConfigError(name, "is required (or give --megatron-args with your launch)")
        num_gpus, seq, gbs = args.num_gpus, args.seq_len, args.global_batch_size
        precision, recipe = args.precision or "bf16", args.fp8_recipe or "delayed"
        fp8_param, grad_fp32 = bool(args.fp8_param_gather), not args.grad_reduce_in_bf16
        graphs = None
    for name, value in (("num_gpus", num_gpus), ("seq_len", seq), ("global_batch_size", gbs)):
        if value < 1:
            raise ConfigError(name, f"must be a positive integer, got {value}")
    options = cost_options_from_args(args)
    result = plan_with_graphs(
        model,
        gpu,
        num_gpus,
        seq,
        gbs,
        cuda_graphs=args.cuda_graphs,
        mode=args.mode,
        precision=precision,
        max_token_len=args.max_token_len,
        memory_margin=args.memory_margin,
        options=options,
        grad_reduce_in_fp32=grad_fp32,
        fp8_recipe=recipe,
        fp8_param=fp8_param,
        lengths=lengths,
        cuda_graph=graphs,
    )
    comparison = compare_with_best(current, result.best.estimate, result.options) if current is not None else None
    out_dir = ensure_output_dir(out_dir)
    files = write_plan_report(result, out_dir, args.top, not args.no_chart, comparison, tuned)
    validation = None
    if args.validate is not None:
        try:
            validate = importlib.import_module("megatron_autotuner.validate")
            validate_plan = validate.validate_plan
        except (ImportError, AttributeError) as exc:
            raise AutotunerError(f"--validate needs megatron_autotuner.validate.validate_plan ({exc})") from exc
        validation = validate_plan(
            result,
            args.validate,
            out_dir,
            calibration=options.calibration,
            measure_host_floor=args.measure_host_floor,
            stand_in=args.stand_in,
        )
    if args.json:
        data = result.to_dict(top_k=args.top)
        if comparison is not None:
            data["current_run"] = comparison.to_dict()
        data["output_dir"] = str(out_dir)
        data["files"] = files
        print_json(data)
        _require_validated(validation)
        return 0
    out = console()
    precision = result.base_workload.precision_label
    seq_text = f"seq {seq}" if lengths is None else f"{lengths.describe()} (longest {seq})"
    out.print(
        f"[bold]{model.name}[/bold] on {num_gpus} x {gpu.name}, {seq_text}, "
        f"global batch {gbs}, {args.mode}{'' if precision == 'bf16' else ', ' + precision}"
        f"{'' if grad_fp32 else ', bf16 main grads'}: "
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
    for note in result.notes:
        out.print(note)
    if result.best.max_token_len_reason:
        out.print(f"max_token_len of the best layout: {result.best.max_token_len_reason}")
    if comparison is not None:
        print_current_run(out, comparison)
    out.print("TP scaling (the overlap tuner's check, predicted): " + result.tp_scaling().summary())
    out.print("rejections: " + ", ".join(f"{k} {v}" for k, v in result.rejection_counts().items()))
    out.print(f"report, chart and launcher snippets: {out_dir}")
    if validation is not None:
        out.print(f"validation of the top {args.validate}: {validation.out_dir}")
    _require_validated(validation)
    return 0


def _require_validated(validation) -> None:
    """With --validate K: exit 1 (one line) when none of the layouts measured anything."""
    if validation is not None:
        from ..validate.command import require_measured

        require_measured(validation, len(validation.rows), "ran")


def print_current_run(out, comparison: CurrentRun) -> None:
    """Your launch beside the best candidate: step time, the gain, and the Megatron-LM flags to change."""
    e = comparison.estimate
    fits = "fits" if e.fits else "DOES NOT FIT"
    out.print(
        f"[bold]your launch[/bold]: {e.step_time_s:.3f} s/step, {e.tokens_per_s_per_gpu:,.0f} tok/s/GPU, MFU "
        f"{e.mfu:.3f}, {e.peak_memory_gib:.1f} GiB ({fits})"
    )
    gain = comparison.speedup - 1
    if gain > 0:
        out.print(f"the best layout is predicted {gain:.1%} faster; change these Megatron-LM flags:")
        for change in comparison.changes:
            out.print(f"  {change}")
    else:
        out.print("no candidate is predicted faster than your launch")
    print_notes(out, (), e.not_modelled)
