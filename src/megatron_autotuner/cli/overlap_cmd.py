"""`mat overlap`: tune TE userbuffers TP-communication overlap per GEMM and TP size; `mat overlap analyze DIR`."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..argspec.argtypes import (
    fraction,
    non_empty_path,
    non_negative_float,
    non_negative_int,
    positive_float,
    positive_int,
)
from .output import print_json


def add_tune_arguments(p: argparse.ArgumentParser, suppress_defaults: bool = False) -> None:
    """The options of a tuning run: on `mat overlap` itself (`mat overlap --model M` tunes) and on `mat overlap tune`,
    where `suppress_defaults` leaves out the defaults so that options given before `tune` are kept (each help says
    its default); `mat overlap analyze` has none of them."""

    def add(*flags: str, default=None, **kwargs) -> None:
        p.add_argument(*flags, default=argparse.SUPPRESS if suppress_defaults else default, **kwargs)

    add(
        "--model",
        action="append",
        default=[],
        help="model preset or config.json (repeatable, or a,b; required: at least one)",
    )
    add(
        "--max-tp-size",
        type=positive_int,
        default=4,
        help="largest TP size tuned when --tp-sizes is not given (default 4)",
    )
    add(
        "--tp-sizes",
        type=positive_int,
        nargs="+",
        help="TP sizes to tune, powers of two (default: 2, 4, 8 up to --max-tp-size; TP=1 always runs as the baseline)",
    )
    add(
        "--max-token-len",
        type=positive_int,
        default=8192,
        help="sequence length (tokens per micro-batch; default 8192)",
    )
    add("--micro-batch-size", type=positive_int, default=1, help="sequences per micro-batch (default 1)")
    add(
        "--operators",
        nargs="+",
        default=["qkv", "proj", "fc1", "fc2"],
        help="layer GEMMs to tune (default: qkv proj fc1 fc2)",
    )
    add("--min-num-sm", type=positive_int, default=1, help="fewest SMs a userbuffers kernel may use (default 1)")
    add("--max-num-sm", type=positive_int, default=16, help="most SMs a userbuffers kernel may use (default 16)")
    add(
        "--num-splits",
        type=positive_int,
        nargs="+",
        default=[2, 4, 8],
        help="pipeline num_splits to try (default 2 4 8)",
    )
    add("--cga-sizes", type=positive_int, nargs="+", default=[1, 2, 4], help="CGA cluster sizes to try (default 1 2 4)")
    add(
        "--overlap-threshold",
        type=fraction,
        default=0.5,
        help="flag tuned GEMMs whose overlap ratio stays below this, in [0, 1] (default 0.5)",
    )
    add(
        "--scaling-tolerance",
        type=non_negative_float,
        default=0.2,
        help="TP=n counts as efficient when time(TP=n) <= (1 + this) x time(TP=1) / n (default 0.2)",
    )
    add(
        "--backend",
        choices=("te", "symm-mem", "both"),
        default="te",
        help="TE userbuffers, torch symmetric memory, or both (default te)",
    )
    add("--warmup", type=non_negative_int, default=3, help="untimed iterations per measurement (default 3)")
    add("--repeats", type=positive_int, default=10, help="timed iterations per measurement (default 10)")
    add(
        "--verify-passes",
        type=non_negative_int,
        default=1,
        help="extra passes re-measuring TE default / tuned / NCCL (0: none; default 1)",
    )
    add("--case-timeout", type=positive_float, default=60.0, help="seconds before a hung round is killed (default 60)")
    add(
        "--profile",
        choices=("all", "key", "none"),
        default="all",
        help="torch-profiler trace of every round (all), of the fixed and tuned rounds only (key), or none "
        "(default all)",
    )
    add("--fake", action="store_true", default=False, help="synthetic backend on CPU (dry run, no GPU)")
    add("--output-dir", type=non_empty_path, help="run directory (default outputs/<UTC timestamp>-overlap)")
    add("--json", action="store_true", default=False, help="print the report as JSON")


def register(subparsers: argparse._SubParsersAction) -> None:
    tune_examples = (
        "  mat overlap --model Llama-3.1-8B --tp-sizes 2 4 --max-token-len 8192 --backend both "
        "--output-dir outputs/ov\n"
        "  mat overlap --model Qwen3-8B --tp-sizes 2 --fake --output-dir outputs/ov_fake   # CPU dry run, no GPU\n"
    )
    p = subparsers.add_parser(
        "overlap",
        help="tune TP communication/GEMM overlap (TE userbuffers, torch symm-mem) on GPUs",
        description="Measure overlap candidates per GEMM (qkv, proj, fc1, fc2 x fprop/dgrad/wgrad) and TP size, "
        "pick the fastest, check TP scaling against TP=1, write reports and ub yaml files. "
        "`mat overlap --model M ...` is `mat overlap tune --model M ...`; "
        "`mat overlap analyze DIR` redoes the analysis of a finished run without a GPU.",
        epilog="examples:\n" + tune_examples + "  mat overlap analyze benchmarks/results/overlap_h200_x2",
    )
    add_tune_arguments(p)
    actions = p.add_subparsers(dest="action", metavar="ACTION")
    t = actions.add_parser(
        "tune",
        help="measure and pick overlap configs on GPUs (the default action)",
        description="Tune TE userbuffers / symm-mem overlap per GEMM and TP size on this node's GPUs (--fake: a "
        "synthetic CPU backend); writes collect/ records, reports and ub yaml files to --output-dir.",
        epilog="examples:\n" + tune_examples.replace("mat overlap --model", "mat overlap tune --model"),
    )
    add_tune_arguments(t, suppress_defaults=True)
    a = actions.add_parser(
        "analyze",
        help="redo the analysis and reports of a finished tuning run (no GPU)",
        description="Read DIR/collect/ of a `mat overlap` run and rewrite its analysis, reports and ub yaml files "
        "(no GPU, no torch).",
        epilog="examples:\n"
        "  mat overlap analyze benchmarks/results/overlap_h200_x2\n"
        "  mat overlap analyze benchmarks/results/overlap_h200_x2 --json",
    )
    a.add_argument("directory", nargs="?", help="the output directory of a `mat overlap` run (with collect/); required")
    a.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help="print the report as JSON")
    # after add_subparsers: `mat overlap` with no action tunes
    p.set_defaults(func=run, action="tune", directory=None)


def run(args: argparse.Namespace) -> int:
    from ..errors import ConfigError
    from ..overlap import OverlapTuner, OverlapTunerConfig, analyze_and_report
    from ..overlap.report import summary_text

    if args.action == "analyze":
        if not args.directory:
            raise ConfigError("directory", "mat overlap analyze needs the output directory of a run")
        if not (Path(args.directory) / "collect").is_dir():
            raise ConfigError("directory", f"{args.directory} has no collect/ records of a `mat overlap` run")
        report = analyze_and_report(args.directory)
    else:
        models = tuple(m for arg in args.model for m in arg.split(",") if m)
        if not models:
            raise ConfigError("model", "give at least one --model")
        config = OverlapTunerConfig(
            models=models,
            max_tp_size=args.max_tp_size,
            tp_sizes=tuple(args.tp_sizes) if args.tp_sizes else None,
            max_token_len=args.max_token_len,
            micro_batch_size=args.micro_batch_size,
            operators=tuple(args.operators),
            min_num_sm=args.min_num_sm,
            max_num_sm=args.max_num_sm,
            num_splits=tuple(args.num_splits),
            cga_sizes=tuple(args.cga_sizes),
            overlap_threshold=args.overlap_threshold,
            scaling_tolerance=args.scaling_tolerance,
            backend=args.backend,
            warmup=args.warmup,
            repeats=args.repeats,
            verify_passes=args.verify_passes,
            case_timeout_s=args.case_timeout,
            profile=args.profile,
            output_dir=args.output_dir,
            fake=args.fake,
            device="cpu" if args.fake else "cuda",
        )
        tuner = OverlapTuner(config)
        _require_runnable(config, len(tuner.jobs()))
        report = tuner.run()
    if args.json:
        print_json(report)
    else:
        sys.stdout.write(summary_text(report))
    _require_measured(Path(args.directory) if args.action == "analyze" else tuner.out)
    return 0


def _require_runnable(config, jobs: int) -> None:
    """Before any job: the fake backend needs torch (gloo ranks); the real ones a CUDA GPU (else exit 1)."""
    from ..errors import ConfigError
    from ..launch.devices import require_cuda_gpus

    if config.fake:
        try:
            import torch  # noqa: F401
        except ImportError:
            raise ConfigError(
                "fake", "the synthetic backend runs torch.distributed (gloo) ranks on CPU and needs torch installed"
            ) from None
    else:
        require_cuda_gpus(jobs, "tuning jobs", "--fake tries the tuner on CPU with a synthetic backend")


def _require_measured(out: Path) -> None:
    """Exit 1 (one line) when no round of the run has a measurement."""
    from ..errors import NothingMeasuredError
    from ..overlap.jobs import all_round_records

    records = list(all_round_records(out).values())
    if not any(r.get("status") == "ok" for r in records if r.get("kind", "round") == "round"):
        failed = sum(r.get("status") == "failed" for r in records)
        raise NothingMeasuredError(f"no tuning round has a measurement ({failed} failure records) in {out}")
