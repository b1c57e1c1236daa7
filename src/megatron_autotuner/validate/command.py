"""`mat validate` (also `python -m megatron_autotuner.validate`, which needs neither rich nor the rest of
the CLI): real short megatron-core runs of layouts, measured vs predicted."""

from __future__ import annotations

import argparse
import datetime as dt
import json
from pathlib import Path

from .. import SCHEMA_VERSION, __version__
from ..argspec.common import add_launch_reading_arguments, moe_dispatcher_from_args
from ..errors import ConfigError
from ..files import write_text_atomic


def add_stand_in_argument(parser: argparse.ArgumentParser, prefix: str = "") -> None:
    """`--stand-in [stages|all]` of `mat validate` and `mat plan --validate K`."""
    parser.add_argument(
        "--stand-in",
        nargs="?",
        const="stages",
        choices=["stages", "all"],
        help=f"{prefix}memory only, on one GPU: run the first rank of each pipeline stage (or all ranks) of each "
        "layout alone, one after another, over torch's fake process group (collectives move nothing): each rank's "
        "allocated and reserved memory as in the real job; no step times, no NCCL buffers (default: off; given "
        "without a value: stages)",
    )


def register(subparsers: argparse._SubParsersAction) -> None:
    from ..argspec.argtypes import (
        non_empty_path,
        non_negative_int,
        num_layers_or_edge,
        positive_float,
        positive_int,
    )
    from ..argspec.common import (
        add_cross_entropy_fusion_impl_argument,
        add_grad_reduce_argument,
        add_moe_dispatcher_arguments,
        add_moe_overlap_arguments,
        add_precision_arguments,
    )
    from ..argspec.help_format import MatHelpFormatter

    p = subparsers.add_parser(
        "validate",
        formatter_class=MatHelpFormatter,  # also under `python -m megatron_autotuner.validate`
        help="train layouts for a few real steps (megatron-core) and compare with the cost model",
        description="Runs one layout (flags) or a batch (--layouts FILE) with torchrun on this node: warm-up steps, "
        "then timed steps; prints measured vs predicted step time, peak memory and MFU. Results are appended as "
        "layouts finish; a rerun skips finished layouts; OOM / NCCL failures are recorded per layout.",
        epilog="examples:\n"
        "  mat validate --model Llama-3.1-8B --num-layers 4 --gpu H100-SXM --seq-len 4096 --dry-run"
        "   # predict, print the torchrun command\n"
        "  mat validate --layouts benchmarks/validation/h100_x1_layouts.json --gpu H100-SXM --output-dir outputs/val\n"
        "  mat validate --model Qwen3-8B --num-layers max-fit --gpu H200 --seq-len 8192 --stand-in",
    )
    p.add_argument(
        "--layouts",
        metavar="JSON",
        type=non_empty_path,
        help="batch: list of layout objects, or {defaults, layouts, gpu} (default: one layout from the options)",
    )
    p.add_argument(
        "--megatron-args",
        metavar="FILE",
        type=non_empty_path,
        help="one layout from a Megatron-LM launch (flags, or a torchrun ... pretrain_gpt.py command; - for stdin); "
        "--model fills in what its flags leave out, --num-layers reduces the model",
    )
    add_launch_reading_arguments(p, strict=True)
    p.add_argument("--model", help="preset name or HF config path (single layout; required without --layouts)")
    p.add_argument(
        "--num-layers",
        type=num_layers_or_edge,
        help="reduced layer count, or max-fit / min-oom (edge of predicted memory; default: the model's)",
    )
    p.add_argument(
        "--gpu", help="GPU preset the prediction uses, e.g. H200 (required unless the --layouts file names it)"
    )
    p.add_argument("--num-gpus", type=positive_int, default=1, help="GPUs of the layout")
    p.add_argument("--tp", type=positive_int, default=1, help="tensor parallel size")
    p.add_argument("--pp", type=positive_int, default=1, help="pipeline parallel size")
    p.add_argument(
        "--vpp", type=positive_int, default=None, help="virtual pipeline chunks per rank (default: none, plain 1F1B)"
    )
    p.add_argument("--cp", type=positive_int, default=1, help="context parallel size")
    p.add_argument("--ep", type=positive_int, default=1, help="expert parallel size")
    p.add_argument("--etp", type=positive_int, default=None, help="expert tensor parallel size (default: tp)")
    p.add_argument(
        "--sp",
        dest="sequence_parallel",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="sequence parallelism (default: on when tp > 1)",
    )
    p.add_argument(
        "--cp-comm-type", choices=["p2p", "a2a", "allgather"], default="p2p", help="context-parallel attention exchange"
    )
    add_moe_overlap_arguments(p)
    add_moe_dispatcher_arguments(p)
    p.add_argument(
        "--seq-len", type=positive_int, help="tokens per sequence (required for one layout from the options)"
    )
    p.add_argument("--micro-batch-size", type=positive_int, default=1, help="sequences per micro-batch")
    p.add_argument(
        "--global-batch-size",
        type=positive_int,
        default=None,
        help="sequences per step (default: micro-batch x dp)",
    )
    p.add_argument("--recompute", choices=["none", "selective", "full"], default="none", help="activation recompute")
    p.add_argument("--recompute-method", choices=["uniform", "block"], default="uniform", help="with --recompute full")
    p.add_argument(
        "--recompute-num-layers",
        type=non_negative_int,
        default=1,
        help="with --recompute full: layers per group (uniform, >= 1) or per stage (block, 0 allowed)",
    )
    p.add_argument(
        "--recompute-modules", nargs="+", default=["core_attn"], help="with --recompute selective: modules recomputed"
    )
    p.add_argument(
        "--mode",
        choices=["train", "forward"],
        default="train",
        help="train (fwd+bwd+optimizer) or forward (RLHF reference / old-log-prob passes)",
    )
    add_precision_arguments(p)
    p.add_argument(
        "--distributed-optimizer",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="shard the optimizer state over data-parallel ranks",
    )
    add_grad_reduce_argument(p)
    p.add_argument(
        "--overlap-grad-reduce",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="overlap the data-parallel gradient reduce with the backward pass",
    )
    p.add_argument(
        "--overlap-param-gather",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="overlap the distributed optimizer's parameter all-gather with the forward pass",
    )
    p.add_argument(
        "--te",
        dest="use_te",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="Transformer Engine layer spec (default; falls back to the local spec when TE is missing)",
    )
    p.add_argument(
        "--expandable-segments",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="run with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (with --layouts: for every layout; "
        "default: on, or what each layout says; a --megatron-args launch: what its environment says)",
    )
    p.add_argument(
        "--tp-comm-overlap",
        action="store_true",
        help="TE userbuffers overlap of the TP collectives (needs --sp), as Megatron-LM's --tp-comm-overlap",
    )
    p.add_argument(
        "--tp-comm-overlap-cfg", metavar="YAML", help="with --tp-comm-overlap: the userbuffers yaml (mat overlap)"
    )
    p.add_argument(
        "--cross-entropy-fusion", action="store_true", help="fused cross-entropy loss (--cross-entropy-loss-fusion)"
    )
    add_cross_entropy_fusion_impl_argument(p)
    p.add_argument(
        "--moe-permute-fusion", action="store_true", help="TE's fused MoE token permute (--moe-permute-fusion)"
    )
    p.add_argument(
        "--gradient-accumulation-fusion",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="wgrad accumulated into the fp32 main grads (needs APEX; default: as this machine can)",
    )
    p.add_argument("--steps", type=positive_int, default=5, help="timed steps (default 5)")
    p.add_argument("--warmup-steps", type=non_negative_int, default=3, help="untimed steps before the timed ones")
    p.add_argument(
        "--profile",
        action="store_true",
        default=None,
        help="also record a torch-profiler trace of one step (with --layouts: of every layout)",
    )
    p.add_argument(
        "--memory-history",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="record the CUDA allocator's history (memory/<layout>/rank_R.pickle.gz for pytorch.org/memory_viz, and "
        "where reserved-but-unallocated memory came from; slows the timed steps; with --layouts: every layout; "
        "default: off, or what each layout says)",
    )
    p.add_argument(
        "--host-timing",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="record each decoder layer's host issue time in the timed steps (measured.host_timing in results.jsonl; "
        "a few microseconds per layer; with --layouts: every layout; default: off, or what each layout says)",
    )
    p.add_argument(
        "--cpu-affinity",
        choices=("inherit", "gpu_numa"),
        default=None,
        help="where each rank's process runs: inherit the launcher's CPUs, or gpu_numa, the CPUs of its GPU's NUMA "
        "node (as NUMA-binding launchers; each rank's record says where it ran); with --layouts: every layout; "
        "default: inherit, or what each layout says",
    )
    p.add_argument(
        "--output-dir", type=non_empty_path, help="results directory (default outputs/<UTC timestamp>-validate/)"
    )
    p.add_argument(
        "--timeout-s", type=positive_float, default=300.0, help="per-layout time limit in seconds (hang / NCCL timeout)"
    )
    p.add_argument("--retry-failed", action="store_true", help="rerun layouts that failed before")
    p.add_argument(
        "--layouts-per-job",
        type=non_negative_int,
        default=1,
        help="layouts per torchrun job (default 1: a fresh process each, exact memory; 0: one job per world "
        "size, saves ~20-30 s of start-up per layout, memory then reported net of what earlier layouts left)",
    )
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda", help="cpu: functional tests only")
    p.add_argument(
        "--available-gpus",
        type=non_negative_int,
        default=None,
        help="record layouts needing more GPUs than this as failed (default: no limit)",
    )
    p.add_argument(
        "--calibration",
        metavar="JSON",
        type=non_empty_path,
        help="predict with this calibration file (default: the built-in default efficiencies)",
    )
    p.add_argument(
        "--write-calibration",
        metavar="JSON",
        type=non_empty_path,
        help="write a calibration file from the measured runs (default: none)",
    )
    p.add_argument(
        "--measure-host-floor",
        action="store_true",
        help="first measure this machine's host floors: dense models issue a few short steps in the model at each "
        "TP size the layouts use, with each layer's host time recorded; MoE blocks run the testbench moe cases on one "
        "GPU, each in three processes (the median of theirs); then predict with them (written to "
        "OUTPUT_DIR/host_floor/host_floor.calibration.json)",
    )
    add_stand_in_argument(p)
    p.add_argument("--report-only", action="store_true", help="do not run: report what is in --output-dir")
    p.add_argument("--dry-run", action="store_true", help="predict and print the torchrun commands; run nothing")
    p.add_argument(
        "--emit-slurm",
        metavar="FILE",
        type=non_empty_path,
        help="write an sbatch script for the layouts and exit (default: none)",
    )
    p.add_argument("--nodes", type=positive_int, default=1, help="nodes for --emit-slurm")
    p.add_argument("--gpus-per-node", type=positive_int, default=8, help="GPUs per node for --emit-slurm")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.set_defaults(func=run)


def _layouts(args: argparse.Namespace, out: Path):
    from .layout import Layout, load_layouts_file
    from .predict import edge_num_layers

    extra: dict = {}
    if args.layouts:
        layouts, extra = load_layouts_file(args.layouts)
    elif args.megatron_args:
        layouts = [_launch_layout(args, out)]
    else:
        if not args.model or not args.seq_len:
            raise ConfigError("model", "give --layouts FILE, or --model and --seq-len for one layout")
        edge = args.num_layers if args.num_layers in ("max-fit", "min-oom") else None
        try:
            num_layers = None if edge or args.num_layers is None else int(args.num_layers)
        except ValueError as exc:
            raise ConfigError("num_layers", f"must be an integer, max-fit or min-oom, got {args.num_layers!r}") from exc
        layout = Layout(
            model=args.model, seq_length=args.seq_len, num_gpus=args.num_gpus, num_layers=num_layers,
            tp=args.tp, pp=args.pp, vpp=args.vpp, cp=args.cp, ep=args.ep, etp=args.etp,
            sequence_parallel=args.sequence_parallel, cp_comm_type=args.cp_comm_type,
            moe_a2a_overlap=bool(args.moe_a2a_overlap), delay_wgrad_compute=bool(args.delay_wgrad_compute),
            moe_token_dispatcher=moe_dispatcher_from_args(args),
            micro_batch_size=args.micro_batch_size, global_batch_size=args.global_batch_size,
            recompute=args.recompute, recompute_method=args.recompute_method,
            recompute_num_layers=args.recompute_num_layers, recompute_modules=tuple(args.recompute_modules),
            mode=args.mode, precision=args.precision or "bf16", fp8_recipe=args.fp8_recipe or "delayed",
            fp8_param=bool(args.fp8_param_gather),
            use_distributed_optimizer=args.distributed_optimizer,
            grad_reduce_in_fp32=not args.grad_reduce_in_bf16,
            overlap_grad_reduce=args.overlap_grad_reduce, overlap_param_gather=args.overlap_param_gather,
            warmup_steps=args.warmup_steps, steps=args.steps, profile=bool(args.profile), use_te=args.use_te,
            tp_comm_overlap=args.tp_comm_overlap, tp_comm_overlap_cfg=args.tp_comm_overlap_cfg,
            cross_entropy_fusion=args.cross_entropy_fusion,
            gradient_accumulation_fusion=args.gradient_accumulation_fusion,
            moe_permute_fusion=args.moe_permute_fusion,
            cross_entropy_fusion_impl=args.cross_entropy_fusion_impl,
        )  # fmt: skip
        if edge:
            gpu = args.gpu or extra.get("gpu")
            if not gpu:
                raise ConfigError("gpu", f"--num-layers {edge} needs --gpu")
            layout = layout.replace(num_layers=edge_num_layers(layout, gpu, edge), name=f"{edge}")
        layouts = [layout]
    for key in ("expandable_segments", "memory_history", "host_timing", "profile", "cpu_affinity"):
        if getattr(args, key) is not None:
            layouts = [lay.replace(**{key: getattr(args, key)}) for lay in layouts]
    for lay in layouts:
        lay.check()
    return layouts, args.gpu or extra.get("gpu")


def _launch_layout(args: argparse.Namespace, out: Path):
    """The layout of `--megatron-args`: the launch read against --model; a model the launch's flags describe is
    written next to the results (`out/launch_model.json`) for the workers to load."""
    from ..argspec.common import launch_variables
    from ..files import ensure_output_dir
    from ..specs import load_model_spec
    from ..specs.megatron_args import launch_device_max_connections, launch_to_specs, read_launch_file
    from .layout import Layout

    base = load_model_spec(args.model) if args.model else None
    launch = read_launch_file(args.megatron_args, launch_variables(args), args.strict)
    imported = launch_to_specs(launch, base, mode=args.mode)
    if imported.model is None or imported.parallel is None:
        raise ConfigError("megatron_args", "the launch must describe the model (or give --model) and its GPU count")
    if args.gpu:
        # the launch as Megatron-LM would start it on that GPU, as `mat estimate` and the plan's row for it hold it
        from ..costmodel.nccl_protocols import architecture
        from ..specs import get_gpu_spec
        from ..specs.megatron_args import accepted_launch_device_max_connections

        blackwell = architecture(get_gpu_spec(args.gpu)) == "blackwell"
        connections = accepted_launch_device_max_connections(launch, imported.parallel, blackwell)
    else:
        connections = launch_device_max_connections(launch)
    model_ref = args.model
    if model_ref is None or imported.model != base:
        ensure_output_dir(out)
        imported.model.save_json(out / "launch_model.json")
        model_ref = str(out / "launch_model.json")
    options = imported.options
    num_layers = None if args.num_layers is None else int(args.num_layers)
    return Layout.from_configs(
        model_ref, imported.parallel, imported.workload, num_layers,
        overlap_grad_reduce=options["overlap_grad_reduce"], overlap_param_gather=options["overlap_param_gather"],
        expandable_segments=options["expandable_segments"], warmup_steps=args.warmup_steps, steps=args.steps,
        profile=bool(args.profile), use_te=args.use_te, cross_entropy_fusion=options["fused_cross_entropy"],
        moe_permute_fusion=options.get("moe_permute_fusion", False),
        cross_entropy_fusion_impl=options.get("cross_entropy_fusion_impl", "native"),
        cuda_device_max_connections=connections, manual_gc=bool(launch.value("manual_gc")),
    )  # fmt: skip


def run(args: argparse.Namespace) -> int:
    from ..files import check_output_dir, check_output_file, ensure_output_dir
    from . import batch, launcher, report

    if args.layouts_per_job < 0:
        raise ConfigError("layouts-per-job", f"must be >= 0 (0: all layouts in one job), got {args.layouts_per_job}")
    if args.stand_in:
        for flag in ("emit_slurm", "write_calibration", "measure_host_floor"):
            if getattr(args, flag):
                option = "--" + flag.replace("_", "-")
                raise ConfigError("stand_in", f"--stand-in measures memory only and cannot be used with {option}")
    out = Path(args.output_dir or f"outputs/{dt.datetime.now(dt.timezone.utc):%Y%m%dT%H%M%SZ}-validate")
    # where results go is checked before the layouts are built and run (--report-only reads the folder)
    if not args.report_only:
        check_output_dir(out, "output_dir")
    elif not out.is_dir():
        raise ConfigError("output_dir", f"{out} is not a folder (--report-only reads the folder of an earlier run)")
    for flag in ("emit_slurm", "write_calibration"):
        if getattr(args, flag) is not None:
            check_output_file(getattr(args, flag), flag)
    layouts, gpu = _layouts(args, out)
    if not gpu:
        raise ConfigError("gpu", "give --gpu (the GPU preset predictions are made for)")
    from ..specs import get_gpu_spec

    get_gpu_spec(gpu)  # an unknown preset is bad input, not a prediction that failed
    if args.emit_slurm:
        ensure_output_dir(out)
        layouts_file = out / "slurm_layouts.json"
        write_text_atomic(layouts_file, json.dumps([lay.to_dict() for lay in layouts], indent=1))
        worlds = {lay.world_size for lay in layouts}
        if worlds != {args.nodes * args.gpus_per_node}:
            raise ConfigError(
                "nodes", f"layouts use {sorted(worlds)} GPUs, the script has {args.nodes} x {args.gpus_per_node}"
            )
        if len({lay.expandable_segments for lay in layouts}) > 1:
            raise ConfigError("expandable_segments", "one Slurm job runs one allocator setting: split the layouts")
        if len({lay.process_settings for lay in layouts}) > 1:
            # the worker sets CUDA_DEVICE_MAX_CONNECTIONS for the all-to-all overlap once, when CUDA starts
            raise ConfigError(
                "moe_a2a_overlap", "one Slurm job runs one CUDA_DEVICE_MAX_CONNECTIONS: split the overlap layouts"
            )
        script = launcher.slurm_script(layouts_file.resolve(), out.resolve(), args.nodes, args.gpus_per_node)
        write_text_atomic(Path(args.emit_slurm), script)
        print(f"wrote {args.emit_slurm} (sbatch {args.emit_slurm})")
        return 0
    calibration = None
    if args.calibration:
        from ..costmodel import load_calibration

        calibration = load_calibration(args.calibration)
    if args.dry_run:
        return _dry_run(args, layouts, gpu, out, calibration)
    if args.device == "cuda" and not args.report_only:
        from ..launch.devices import require_cuda_gpus

        require_cuda_gpus(len(layouts), "layouts")
        require_offload_environment(layouts)
    rep = batch.validate_layouts(
        layouts, out, gpu, device=args.device, layout_timeout_s=args.timeout_s, retry_failed=args.retry_failed,
        available_gpus=args.available_gpus, calibration=calibration, write_calibration_to=args.write_calibration,
        layouts_per_job=args.layouts_per_job or None, measure_host_floor=args.measure_host_floor,
        stand_in=args.stand_in, run=not args.report_only, log=(lambda *_: None) if args.json else print,
    )  # fmt: skip
    if args.json:
        print(json.dumps(rep.summary, indent=1, default=str))
    else:
        print(report.format_report(rep))
        if args.write_calibration:
            print(f"calibration: {args.write_calibration}")
    require_measured(rep, len(layouts), "reported" if args.report_only else "ran")
    return 0


def _dry_run(args, layouts, gpu, out: Path, calibration) -> int:
    """Predict every layout and print the commands that would run it, as lines or (`--json`) one document:
    {"gpu", "predicted_at", "host_floor_probes", "host_floor_cases" (`--measure-host-floor`), "layouts":
    [{"layout_id", "label", "layout", "predicted", "commands"}]}, the form kept beside GPU evidence as the
    prediction written before a run."""
    from . import batch, launcher

    probes: list[str] = []
    cases: list[str] = []
    if args.measure_host_floor:
        from .host_floor import host_floor_cases, host_probe_layouts

        probes = [f"{probe.label} ({probe.layout_id})" for probe in host_probe_layouts(layouts)]
        for case in host_floor_cases(layouts, out / "host_floor" / "models"):
            recipe = f" {case.fp8_recipe}" if case.dtype == "fp8" else ""
            cases.append(f"{case.case_id} ({case.model}, {case.dtype}{recipe})")
    preds = batch.predictions_for(layouts, gpu, out, calibration)
    rows = []
    job = out / "jobs" / "JOB.json"
    for lay in layouts:
        if args.stand_in:
            world, ranks = lay.world_size, lay.stand_in_ranks(args.stand_in == "all")
            cmds = [launcher.stand_in_command(job, out, r, world, args.device, args.timeout_s) for r in ranks]
        else:
            cmds = [launcher.torchrun_command(lay.world_size, job, out, args.device, args.timeout_s)]
        rows.append(
            {
                "layout_id": lay.layout_id,
                "label": lay.label,
                "layout": lay.to_dict(),
                "predicted": preds[lay.layout_id],
                "commands": [" ".join(cmd) for cmd in cmds],
            }
        )
    if args.json:
        doc = {
            "schema_version": SCHEMA_VERSION,
            "tool_version": __version__,
            "gpu": gpu,
            "predicted_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            "calibration": args.calibration,
            "host_floor_probes": probes,
            "host_floor_cases": cases,
            "layouts": rows,
        }
        print(json.dumps(doc, indent=1, default=str))
        return 0
    for line in probes:
        print(f"host floor probe: {line}")
    for line in cases:
        print(f"host floor case: {line}")
    if probes or cases:
        # the advice in the predictions' notes to measure the floor is what the run will do
        print("host floors: measured when the batch runs, before its layouts; the predictions below use the default "
              "floors until then")  # fmt: skip
    for row in rows:
        print(f"{row['label']} ({row['layout_id']}): predicted {json.dumps(row['predicted'])}")
        for cmd in row["commands"]:
            print("  " + cmd)
    return 0


def require_offload_environment(layouts, environ=None, te_version: str | None = None) -> None:
    """ConfigError before anything runs when this environment cannot run a layout's activation offloading as
    predicted (`runner.offload_env_problem`: NVTE_CPU_OFFLOAD_V1, which Transformer Engine reads once at import and
    the workers inherit). `te_version` None: the installed one."""
    import os

    from .runner import NVTE_CPU_OFFLOAD_V1_ENV, installed_te_version, offload_env_problem

    environ = os.environ if environ is None else environ
    version = te_version or installed_te_version()
    for lay in layouts:
        problem = offload_env_problem(lay, version, environ)
        if problem:
            raise ConfigError(NVTE_CPU_OFFLOAD_V1_ENV, f"{lay.label}: {problem}")


def require_measured(rep, total: int, verb: str) -> None:
    """`NothingMeasuredError` (exit 1) when no layout of the batch has a measurement."""
    from ..errors import NothingMeasuredError

    if not any(row.get("status") == "ok" for row in rep.rows):
        failed = sum(row.get("status") == "failed" for row in rep.rows)
        why = f"{failed} failed (see the failures above)" if failed else "none has a record yet"
        raise NothingMeasuredError(f"0 of {total} layouts {verb}: {why}; results in {rep.out_dir}")


def main(argv: list[str] | None = None) -> int:
    """Entry point without the rest of the CLI: `python -m megatron_autotuner.validate ...`."""
    import sys

    from ..errors import AutotunerError

    parser = argparse.ArgumentParser(prog="python -m megatron_autotuner.validate")
    sub = parser.add_subparsers(dest="command", required=True)
    register(sub)
    args = parser.parse_args(["validate", *(sys.argv[1:] if argv is None else argv)])
    try:
        return run(args)
    except AutotunerError as exc:
        print(f"mat validate: error: {exc}", file=sys.stderr)
        return 2
