"""`mat overlap`: tune TE userbuffers TP-communication overlap per GEMM and TP size; `mat overlap analyze DIR`."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .output import print_json


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "overlap",
        help="tune TP communication/GEMM overlap (TE userbuffers, torch symm-mem) on GPUs",
        description="Measure overlap candidates per GEMM (qkv, proj, fc1, fc2 x fprop/dgrad/wgrad) and TP size, "
        "pick the fastest, check TP scaling against TP=1, write reports and ub yaml files. "
        "`mat overlap analyze DIR` redoes the analysis of a finished run without a GPU.",
    )
    p.add_argument("action", nargs="?", choices=("tune", "analyze"), default="tune", help="tune (default) | analyze")
    p.add_argument("directory", nargs="?", help="analyze: the output directory of a run")
    p.add_argument("--model", action="append", default=[], help="model preset or config.json (repeatable, or a,b)")
    p.add_argument("--max-tp-size", type=int, default=4)
    p.add_argument("--tp-sizes", type=int, nargs="+", help="TP sizes to tune (default 2, 4, 8 up to --max-tp-size)")
    p.add_argument("--max-token-len", type=int, default=8192, help="sequence length (tokens per micro-batch)")
    p.add_argument("--micro-batch-size", type=int, default=1)
    p.add_argument("--operators", nargs="+", default=["qkv", "proj", "fc1", "fc2"])
    p.add_argument("--min-num-sm", type=int, default=1)
    p.add_argument("--max-num-sm", type=int, default=16)
    p.add_argument("--num-splits", type=int, nargs="+", default=[2, 4, 8], help="pipeline num_splits to try")
    p.add_argument("--cga-sizes", type=int, nargs="+", default=[1, 2, 4])
    p.add_argument("--overlap-threshold", type=float, default=0.5, help="flag tuned GEMMs with a lower overlap ratio")
    p.add_argument("--scaling-tolerance", type=float, default=0.2)
    p.add_argument("--backend", choices=("te", "symm-mem", "both"), default="te")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--verify-passes", type=int, default=1)
    p.add_argument("--case-timeout", type=float, default=60.0, help="seconds before a hung round is killed")
    p.add_argument(
        "--profile",
        choices=("all", "key", "none"),
        default="all",
        help="torch-profiler trace of every round (all), of the fixed and tuned rounds only (key), or none",
    )
    p.add_argument("--fake", action="store_true", help="synthetic backend on CPU (dry run, no GPU)")
    p.add_argument("--output-dir", help="default outputs/<UTC timestamp>-overlap")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(func=run)


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
        report = OverlapTuner(config).run()
    if args.json:
        print_json(report)
    else:
        sys.stdout.write(summary_text(report))
    return 0
