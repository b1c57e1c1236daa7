"""`mat plan`: rank every layout for a model, GPU count and workload; write a report directory."""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ..argspec.argtypes import margin_fraction, non_empty_path, positive_int
from ..argspec.common import add_grad_reduce_argument, add_precision_arguments
from ..costmodel.defaults import HOST_PACE_RANGE
from ..costmodel.estimate import (
    DEFAULT_MEMORY_MARGIN,
    CostOptions,
    estimate,
    moe_graphs_note,
    overlap_connections_note,
    run_settings,
)
from ..errors import AutotunerError, ConfigError
from ..files import CONFIG_LIMIT_BYTES, ensure_output_dir, read_text_bounded, write_text_atomic
from ..report import output_dir_for, write_plan_report
from ..search import GRAPH_MODES, SearchSpace, plan_with_graphs
from ..search.current import CurrentRun, FlagChange, compare_with_best, refused_launch
from ..validate.command import add_stand_in_argument
from .estimate_cmd import (
    add_assumption_arguments,
    add_expandable_segments_argument,
    cost_options_from_args,
    print_notes,
    reject_assumptions_with_launch,
    run_settings_line,
)
from .layout_args import (
    add_flops_convention_argument,
    add_gpu_arguments,
    add_length_arguments,
    add_mode_arguments,
    add_model_arguments,
    add_moe_routing_argument,
    gpu_from_args,
    import_launch,
    launch_run_options,
    lengths_from_args,
    model_from_args,
    moe_routing_from_args,
)
from .output import console, make_table, print_json
from .progress_bar import progress_bar

# --top: each layout shown is exported with its files; an unbounded one exported the whole search (Qwen3-0.6B on
# 4,096 GPUs: 1,811 layouts, 47 MB, 27 s against 6 s at the default; #39)
MAX_TOP = 100


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
    add_moe_routing_argument(p)
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
    add_assumption_arguments(p)
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
    p.add_argument(
        "--top", type=positive_int, default=5, help=f"layouts to show and export (default 5, at most {MAX_TOP})"
    )
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


@dataclass(frozen=True)
class PlanInputs:
    """What the search is asked: from a launch (`current`: its own estimate) or the command line."""

    model: Any
    options: CostOptions
    tp_overlap: bool
    num_gpus: int
    seq: int
    gbs: int
    precision: str
    recipe: str
    fp8_param: bool
    grad_fp32: bool
    graphs: Any
    lengths: Any
    current: Any = None
    # why Megatron-LM would refuse the launch's own layout, and the launch as read: planned all the same
    refused: tuple[str, Any] | None = None
    moe_routing: Any = None  # `specs.parallel.MoeRouting`: the launch's capacity with --moe-load-imbalance


def plan_inputs(args: argparse.Namespace, gpu) -> PlanInputs:
    """The model, run settings and workload to plan: a launch's own (with its estimate), else the options'."""
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
        reject_assumptions_with_launch(args)
        imported = import_launch(args)
        model, mine, work = imported.model, imported.parallel, imported.workload
        options = cost_options_from_args(args, imported.options)  # the launch's own run settings, for every layout
        current, refused = None, None
        try:
            launch_options = launch_run_options(imported, options, gpu)
            current = estimate(model, mine, work, gpu, launch_options).with_notes(imported.notes, imported.not_modelled)
        except ConfigError as exc:
            # a layout Megatron-LM would refuse (24 layers on 16 stages): the model, workload and GPUs still plan
            refused = (str(exc), imported)
        inputs = PlanInputs(
            model, options, mine.tp_comm_overlap, mine.num_gpus, work.seq_length, work.global_batch_size,
            work.precision, work.fp8_recipe, work.fp8_param, mine.grad_reduce_in_fp32,
            work.cuda_graph,  # the launch's CUDA graphs, kept for every candidate
            lengths, current, refused, moe_routing_from_args(args, work.moe_routing),
        )  # fmt: skip
    else:
        model = model_from_args(args)
        for name in ("num_gpus", "seq_len", "global_batch_size"):
            if getattr(args, name) is None:
                raise ConfigError(name, "is required (or give --megatron-args with your launch)")
        inputs = PlanInputs(
            model, cost_options_from_args(args), bool(args.tp_comm_overlap), args.num_gpus, args.seq_len,
            args.global_batch_size, args.precision or "bf16", args.fp8_recipe or "delayed",
            bool(args.fp8_param_gather), not args.grad_reduce_in_bf16, None, lengths,
            moe_routing=moe_routing_from_args(args),
        )  # fmt: skip
    for name, value in (("num_gpus", inputs.num_gpus), ("seq_len", inputs.seq), ("global_batch_size", inputs.gbs)):
        if value < 1:
            raise ConfigError(name, f"must be a positive integer, got {value}")
    return inputs


def run(args: argparse.Namespace) -> int:
    if not 1 <= args.top <= MAX_TOP:
        raise ConfigError("top", f"must be in 1..{MAX_TOP} (each layout is exported with its files), got {args.top}")
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
    inputs = plan_inputs(args, gpu)
    if tuned is not None and not inputs.tp_overlap:
        raise ConfigError("tp_comm_overlap_cfg", "goes with --tp-comm-overlap (the yaml configures TE userbuffers)")
    options, runner_note = options_the_runner_executes(inputs.options, args.validate is not None)
    space = SearchSpace()
    with progress_bar() as progress:
        result = plan_with_graphs(
            inputs.model, gpu, inputs.num_gpus, inputs.seq, inputs.gbs, cuda_graphs=args.cuda_graphs, mode=args.mode,
            precision=inputs.precision, max_token_len=args.max_token_len, memory_margin=args.memory_margin,
            options=options, grad_reduce_in_fp32=inputs.grad_fp32, fp8_recipe=inputs.recipe,
            fp8_param=inputs.fp8_param, lengths=inputs.lengths, cuda_graph=inputs.graphs,
            tp_comm_overlap=inputs.tp_overlap, progress=progress, moe_routing=inputs.moe_routing, space=space,
        )  # fmt: skip
    if runner_note:
        result = replace(result, notes=(*result.notes, runner_note))
    best = result.best.estimate
    if (pairing := overlap_connections_note(best.parallel, result.gpu)) is not None:
        result = replace(result, notes=(*result.notes, f"best layout: {pairing}"))
    if (graphs := moe_graphs_note(best.model, best.workload, best.options, best.time)) is not None:
        result = replace(result, notes=(*result.notes, f"best layout: {graphs}"))
    current = inputs.current
    comparison = compare_with_best(current, best, result.options) if current is not None else None
    out_dir = ensure_output_dir(out_dir)
    settings = run_settings(result.model, result.options, inputs.tp_overlap)
    files = write_plan_report(result, out_dir, args.top, not args.no_chart, comparison, tuned, run_settings=settings)
    validation = run_validation(args, result, out_dir) if args.validate is not None else None
    refused = None
    if inputs.refused is not None:
        refused = refused_launch(*inputs.refused, result.best.estimate, result.options)
    if args.json:
        data = {**result.to_dict(top_k=args.top), "run_settings": settings}
        if comparison is not None:
            data["current_run"] = comparison.to_dict()
        if refused is not None:
            data["current_run"] = refused
        if validation is not None:
            data["validation"] = validation.plan
        data["output_dir"] = str(out_dir)
        data["files"] = files
        print_json(data)
    else:
        print_plan(args, inputs, result, comparison, out_dir, validation, refused, settings)
    _require_validated(validation)
    return 0


def run_validation(args: argparse.Namespace, result, out_dir: Path):
    """`--validate K`: the top K run as ranked; plan.json gains what they measured."""
    try:
        validate_plan = importlib.import_module("megatron_autotuner.validate").validate_plan
    except (ImportError, AttributeError) as exc:
        raise AutotunerError(f"--validate needs megatron_autotuner.validate.validate_plan ({exc})") from exc
    validation = validate_plan(
        result,
        args.validate,
        out_dir,
        calibration=result.options.calibration,
        measure_host_floor=args.measure_host_floor,
        stand_in=args.stand_in,
        model_source=getattr(args, "model", None),
        ub_yaml=lambda rank: _exported_ub_yaml(out_dir, rank),
        # progress on stderr: with --json, stdout holds the one JSON document
        log=lambda line: print(line, file=sys.stderr, flush=True),
    )
    add_measured_to_plan_json(out_dir / "plan.json", validation.plan)
    return validation


def print_plan(
    args: argparse.Namespace, inputs: PlanInputs, result, comparison, out_dir: Path, validation, refused, settings
) -> None:
    out = console()
    precision = result.base_workload.precision_label
    lengths, seq = inputs.lengths, inputs.seq
    seq_text = f"seq {seq}" if lengths is None else f"{lengths.describe()} (longest {seq})"
    out.print(
        f"[bold]{inputs.model.name}[/bold] on {inputs.num_gpus} x {result.gpu.name}, {seq_text}, "
        f"global batch {inputs.gbs}, {args.mode}{'' if precision == 'bf16' else ', ' + precision}"
        f"{'' if inputs.grad_fp32 else ', bf16 main grads'}: "
        f"{result.considered} layouts considered, {len(result.candidates)} fit"
        f"{f' (and {result.superseded} slower token budgets of them)' if result.superseded else ''}, "
        f"{len(result.rejections)} rejected in {result.elapsed_s:.2f} s"
    )
    out.print(predicted_table(result, args.top, args.flops_convention))
    for note in result.notes:
        out.print(note)
    if result.best.max_token_len_reason:
        out.print(f"max_token_len of the best layout: {result.best.max_token_len_reason}")
    if comparison is not None:
        print_current_run(out, comparison)
    if refused is not None:
        out.print(
            f"[bold]your launch[/bold] would not start: {refused['refused']} (Megatron-LM refuses it too); the "
            f"fastest layout for its model, workload and {inputs.num_gpus} GPUs runs "
            f"{refused['best_step_time_s']:.3f} s/step; change these Megatron-LM flags:"
        )
        for change in refused["flag_changes"]:
            out.print(f"  {FlagChange(**change)}")
        print_notes(out, refused["notes"], refused["not_modelled"])
    out.print("TP scaling (the overlap tuner's check, predicted): " + result.tp_scaling().summary())
    out.print(f"run settings assumed (in every exported launch): {run_settings_line(settings)}")
    out.print("rejections: " + ", ".join(f"{k} {v}" for k, v in result.rejection_counts().items()))
    out.print(f"report, chart and launcher snippets: {out_dir}")
    if validation is not None:
        print_measured(out, validation.plan)


def predicted_table(result, top: int, flops_convention: str):
    """The top layouts' predictions; with the default host floors also the step on the fastest and slowest hosts
    measured (`search.host_pace`), which the ranking stays best across."""
    paced = any(c.host_pace is not None for c in result.top(top))
    lo, hi = HOST_PACE_RANGE
    headers = ["rank", "layout", "step s", *([f"s, hosts {lo}x-{hi}x"] if paced else [])]
    headers += ["tok/s/GPU", f"TFLOP/s ({flops_convention})", "MFU", "GiB"]
    rows = []
    for c in result.top(top):
        e = c.estimate
        spread = [] if not paced else ["-" if c.host_pace is None else "{:.3f}-{:.3f}".format(*c.host_pace.steps_s)]
        rows.append([c.rank, c.label, e.step_time_s, *spread, e.tokens_per_s_per_gpu, e.model_tflops_per_gpu,
                     e.mfu_at_own_peak[0], e.peak_memory_gib])  # fmt: skip
    peak = result.best.estimate.mfu_at_own_peak[1]  # every candidate runs the plan's precision
    return make_table(f"Top layouts (predicted; MFU against the {peak} peak)", headers, rows)


def _exported_ub_yaml(out_dir: Path, rank: int) -> Path | None:
    """The userbuffers yaml the plan exported for a TP-overlap layout (rank_<k>/tp_comm_overlap.yaml), if any."""
    path = out_dir / f"rank_{rank}" / "tp_comm_overlap.yaml"
    return path if path.is_file() else None


def add_measured_to_plan_json(path: Path, measured: dict) -> None:
    """plan.json gains what --validate measured (`validate.batch.plan_measured`) under "validation"."""
    data = json.loads(path.read_text())
    data["validation"] = measured
    write_text_atomic(path, json.dumps(data, indent=1, default=str) + "\n")


def print_measured(out, measured: dict) -> None:
    """The ranked layouts' predicted and measured steps and peaks, the measured winner and the plan's regret."""
    rows = [
        [
            r["rank"],
            r["label"],
            r["predicted_step_time_s"],
            r["measured_step_time_s"] if r["measured_step_time_s"] else r["status"],
            "-" if r["step_time_error"] is None else f"{r['step_time_error']:+.1%}",
            r["predicted_peak_memory_gib"],
            r["measured_peak_memory_gib"] or "-",
            "-" if r["peak_memory_error"] is None else f"{r['peak_memory_error']:+.1%}",
        ]
        for r in measured["layouts"]
    ]
    headers = ["rank", "layout", "pred s", "measured s", "err", "pred GiB", "measured GiB", "err"]
    out.print(make_table("Measured (mat plan --validate)", headers, rows))
    best = measured["measured_best"]
    if best is None:
        out.print(f"nothing measured: see {measured['output_dir']}")
        return
    regret = measured["regret"]
    verdict = "" if regret is None else f"; the plan's #1 ran {regret:+.1%} over it (regret)"
    out.print(f"measured fastest: #{best['rank']} {best['label']} at {best['measured_step_time_s']:.3f} s{verdict}")
    out.print(f"runs: {measured['output_dir']}")


def options_the_runner_executes(options: CostOptions, validating: bool) -> tuple[CostOptions, str | None]:
    """With --validate the plan ranks what the runner on this machine will run: without APEX there is no
    gradient-accumulation fusion (Megatron-LM turns it off too), and the plan says so."""
    if not (validating and options.gradient_accumulation_fusion):
        return options, None
    from ..validate.runner import apex_wgrad_fusion_available

    if apex_wgrad_fusion_available():
        return options, None
    why = "ranked without gradient-accumulation fusion: APEX is not importable here, so the runs go without it"
    return replace(options, gradient_accumulation_fusion=False), why


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
        f"[bold]your launch[/bold]: {e.step_time_s:.3f} s/step, {e.tokens_per_s_per_gpu:,.0f} tok/s/GPU, "
        f"MFU ({e.mfu_at_own_peak[1]} peak) {e.mfu_at_own_peak[0]:.3f}, {e.peak_memory_gib:.1f} GiB ({fits})"
    )
    gain = comparison.speedup - 1
    if not e.fits:
        b = comparison.best
        out.print(
            f"your launch does not fit ({e.peak_memory_gib:.1f} of {e.usable_memory_gib:.1f} GiB usable); the fastest "
            f"layout that does runs {b.step_time_s:.3f} s/step; change these Megatron-LM flags:"
        )
        for change in comparison.changes:
            out.print(f"  {change}")
    elif gain > 0:
        out.print(f"the best layout is predicted {gain:.1%} faster; change these Megatron-LM flags:")
        for change in comparison.changes:
            out.print(f"  {change}")
    else:
        out.print("no candidate is predicted faster than your launch")
    print_notes(out, e.notes, e.not_modelled)
