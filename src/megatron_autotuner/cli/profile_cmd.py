"""`mat profile`: operator testbench on real megatron-core modules (needs GPUs to measure)."""

from __future__ import annotations

import argparse
import datetime as dt
import json
from pathlib import Path

from ..argspec.argtypes import non_empty_path, non_negative_int, positive_float, positive_int, positive_int_list
from ..errors import ConfigError
from ..files import check_output_dir, check_output_file, write_text_atomic
from ..testbench.cases import MODES, OPERATORS, expand_cases, load_case_file
from .output import console, make_table, print_json

COPY_MODE = "copy-bandwidth"


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "profile",
        help="measure megatron-core operators on GPUs: time, memory, TFLOP/s vs theory",
        description="Operator testbench. Expands a case grid (or reads --case-file), runs one torchrun job per "
        "world size, resumes finished cases, records failures and goes on.",
        epilog="examples:\n"
        "  mat profile --model Llama-3.1-8B --ops attention,mlp --tp 1,2 --seq-len 4096,8192 --dry-run"
        "   # list the cases, no GPU\n"
        "  mat profile --model Qwen3-8B --ops decoder --tp 1,2 --output-dir outputs/tb "
        "--calibration-out outputs/tb/calibration.json\n"
        "  mat profile --mode copy-bandwidth --max-copy-gib 16 --calibration-out outputs/cal.json"
        "   # H2D / D2H GB/s, no model",
    )
    p.add_argument(
        "--model",
        action="append",
        help="model preset / config (repeatable, or comma-separated; required without --case-file)",
    )
    p.add_argument(
        "--ops", default="attention,mlp,decoder", help=f"comma-separated operators from: {', '.join(OPERATORS)}"
    )
    p.add_argument("--tp", type=positive_int_list, default=[1], help="comma-separated TP sizes, e.g. 1,2,4")
    p.add_argument("--cp", type=positive_int_list, default=[1], help="comma-separated context-parallel sizes")
    p.add_argument("--ep", type=positive_int_list, default=[1], help="comma-separated expert-parallel sizes")
    p.add_argument("--seq-len", type=positive_int_list, default=[4096], help="comma-separated sequence lengths")
    p.add_argument("--micro-batch-size", type=positive_int_list, default=[1], help="comma-separated micro-batch sizes")
    p.add_argument(
        "--sp",
        dest="sequence_parallel",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="sequence parallel (default: on when tp > 1)",
    )
    p.add_argument("--local-spec", action="store_true", help="megatron-core local spec instead of TE")
    p.add_argument("--num-layers", type=positive_int, default=2, help="layers of the gpt_chunk op")
    p.add_argument(
        "--case-file", type=non_empty_path, help="JSON list of cases instead of the grid (default: none, the grid)"
    )
    p.add_argument(
        "--mode",
        choices=[*MODES, COPY_MODE],
        default="collect",
        help="collect (times and memory), torch-profile (also a Kineto trace), memory-snapshot (also an allocator "
        "snapshot), nsys, or copy-bandwidth (host <-> device copies, pinned and pageable, alone and beside HBM / "
        "NCCL traffic; no model or cases)",
    )
    p.add_argument(
        "--max-copy-gib",
        type=positive_float,
        default=16.0,
        help="copy-bandwidth: largest copy in GiB, bounded by free host and device memory (default 16)",
    )
    p.add_argument(
        "--copy-interference",
        default="none,hbm_d2d,nccl_allreduce,nccl_loopback,gemm",
        help="copy-bandwidth: comma-separated traffic beside the copies: none, hbm_d2d (a second stream copying "
        "in HBM), nccl_allreduce (all-reduces between the GPUs; needs --num-gpus >= 2), nccl_loopback (one GPU: a "
        "one-rank NCCL all-reduce AVG, which NCCL runs as a local kernel), gemm (bf16 GEMMs on a second stream); "
        "the ones the GPU count cannot run are skipped and listed in the summary",
    )
    p.add_argument("--warmup", type=non_negative_int, default=3, help="untimed iterations per case")
    p.add_argument("--repeats", type=positive_int, default=10, help="timed iterations per case")
    p.add_argument("--case-timeout", type=positive_float, default=300.0, help="seconds before a case counts as hung")
    p.add_argument("--retry-failed", action="store_true", help="rerun cases that failed before")
    p.add_argument("--num-gpus", type=positive_int, help="GPUs on this node (default: all visible)")
    p.add_argument(
        "--output-dir", type=non_empty_path, help="results directory (default outputs/<UTC timestamp>-profile/<model>)"
    )
    p.add_argument("--dry-run", action="store_true", help="list the cases and exit")
    p.add_argument(
        "--calibration-out",
        type=non_empty_path,
        help="also write a cost-model calibration file from the results (default: none)",
    )
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.set_defaults(func=run)


def _cases(args: argparse.Namespace):
    if args.case_file:
        return load_case_file(args.case_file), []
    if not args.model:
        raise ConfigError("model", "give --model (or --case-file)")
    models = [m for entry in args.model for m in entry.split(",") if m]
    ops = [o for o in args.ops.split(",") if o]
    bad = [o for o in ops if o not in OPERATORS]
    if bad:
        raise ConfigError("ops", f"unknown operator {bad[0]!r}; allowed: {', '.join(OPERATORS)}")
    cases, skipped = expand_cases(
        models,
        ops,
        args.seq_len,
        args.micro_batch_size,
        args.tp,
        args.cp,
        args.ep,
        args.sequence_parallel,
        not args.local_spec,
        args.num_layers,
        args.num_gpus,
    )
    if not cases:
        reasons = "; ".join(sorted({r for _, r in skipped}))[:300]
        raise ConfigError("cases", f"the grid expands to no runnable case ({reasons})")
    return cases, skipped


def run(args: argparse.Namespace) -> int:
    if args.mode == COPY_MODE:
        return _run_copy_bandwidth(args)
    cases, skipped = _cases(args)
    if args.dry_run:
        data = {
            "cases": [dict(case_id=c.case_id, world_size=c.world_size, **c.to_dict()) for c in cases],
            "skipped": [{"case": raw, "reason": why} for raw, why in skipped],
        }
        if args.json:
            print_json(data)
        else:
            rows = [[c.case_id, c.world_size] for c in cases]
            console().print(make_table(f"{len(cases)} cases ({len(skipped)} skipped)", ["case", "GPUs"], rows))
        return 0
    from ..launch.devices import require_cuda_gpus
    from ..testbench.launcher import run_cases
    from ..testbench.results import all_records
    from ..testbench.summary import summary_rows

    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    model_tag = "-".join(sorted({Path(c.model).stem for c in cases}))[:80]
    out_dir = Path(args.output_dir) if args.output_dir else Path("outputs") / f"{stamp}-profile" / model_tag
    check_output_dir(out_dir, "output_dir")  # bad input (exit 2) before the sweep, not after it
    if args.calibration_out:
        check_output_file(args.calibration_out, "calibration_out")
    visible = require_cuda_gpus(len(cases), "cases")  # then exit 1 before any job when there is no GPU
    num_gpus = args.num_gpus or visible
    result = run_cases(
        cases,
        out_dir,
        args.mode,
        args.warmup,
        args.repeats,
        args.case_timeout,
        args.retry_failed,
        "cuda",
        num_gpus,
        progress=not args.json,
    )
    records = all_records(out_dir)
    rows = [r for r in summary_rows(records) if r["case_id"] in {c.case_id for c in cases}]
    write_text_atomic(out_dir / "summary.json", json.dumps(rows, indent=1) + "\n")
    if not any(r["status"] == "ok" for r in rows):
        from ..errors import NothingMeasuredError

        failed = sum(r["status"] != "ok" for r in rows)
        raise NothingMeasuredError(
            f"0 of {len(cases)} cases ran: {failed} failed (logs in {out_dir / 'jobs'}); results in {out_dir}"
        )
    if args.calibration_out:
        from ..testbench.calibration import write_calibration

        write_calibration([out_dir], args.calibration_out)
    if args.json:
        print_json(
            {
                "output_dir": str(out_dir),
                "ran": result.ran,
                "skipped_finished": result.skipped_finished,
                "failed_by_launcher": result.failed_by_launcher,
                "rows": rows,
            }
        )
        return 0
    table_rows = [
        [
            r["case_id"].rsplit(".", 1)[0],
            r["status"],
            r.get("fwd_bwd_ms", "-"),
            r.get("predicted_fwd_bwd_ms", "-"),
            f"{r['fwd_bwd_error']:+.1%}" if "fwd_bwd_error" in r else "-",
            r.get("fwd_bwd_tflops", "-"),
            r.get("fwd_bwd_mfu", "-"),
            r.get("activation_gib", "-"),
            r.get("activation_estimated_gib", "-"),
            r.get("activation_ratio", "-"),
            (r.get("error") or "")[:60],
        ]
        for r in rows
    ]
    columns = ["case", "status", "fwd+bwd ms", "predicted ms", "pred/real-1", "TFLOP/s", "MFU", "act GiB"]
    columns += ["act est GiB", "real/est", "error"]
    console().print(make_table(f"Testbench results in {out_dir}", columns, table_rows))
    return 0


def _copy_interferences(args: argparse.Namespace) -> list[str]:
    from ..testbench.copy_bandwidth import INTERFERENCES

    wanted = [x for x in args.copy_interference.split(",") if x]
    bad = [x for x in wanted if x not in INTERFERENCES]
    if bad or not wanted:
        raise ConfigError(
            "copy_interference", f"unknown {bad[0] if bad else '(empty)'!r}; allowed: {', '.join(INTERFERENCES)}"
        )
    return wanted


def _run_copy_bandwidth(args: argparse.Namespace) -> int:
    """`--mode copy-bandwidth`: one torchrun job (`testbench.copy_bandwidth`) over --num-gpus GPUs; rank 0 measures.
    Writes OUT/copy_bandwidth/{rank_0.jsonl,summary.json}; --calibration-out gets its `host_copy` table (merged into
    an existing calibration file, whose other tables stay)."""
    import sys

    from ..testbench.copy_bandwidth import GIB, copy_sizes

    interferences = _copy_interferences(args)
    cap = int(args.max_copy_gib * GIB)
    if args.dry_run:
        plan = {
            "mode": COPY_MODE,
            "sizes_up_to_cap": copy_sizes(cap),
            "note": "the largest size is bounded by free host and device memory on the GPU machine",
            "interference": interferences,
            "num_gpus": args.num_gpus or 1,
        }
        print_json(plan) if args.json else console().print(plan)
        return 0
    from ..launch import start_job, watch_job
    from ..launch.devices import require_cuda_gpus

    visible = require_cuda_gpus(1, "copy-bandwidth runs")
    num_gpus = args.num_gpus or 1
    if num_gpus > visible:
        raise ConfigError("num_gpus", f"{num_gpus} GPUs asked, {visible} visible")
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    out_dir = Path(args.output_dir) if args.output_dir else Path("outputs") / f"{stamp}-profile" / COPY_MODE
    check_output_dir(out_dir, "output_dir")
    if args.calibration_out:
        check_output_file(args.calibration_out, "calibration_out")
    out_dir.mkdir(parents=True, exist_ok=True)
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={num_gpus}",
        "-m",
        "megatron_autotuner.testbench.copy_bandwidth",
        "--out-dir",
        str(out_dir),
        "--max-gib",
        str(args.max_copy_gib),
        "--repeats",
        str(args.repeats),
        "--warmup",
        str(max(args.warmup, 1)),
        "--interference",
        ",".join(interferences),
    ]
    log_path = out_dir / "copy_bandwidth.log"
    with open(log_path, "w") as log:
        proc = start_job(cmd, log)
        # no per-item progress file: the whole job gets --case-timeout
        timed_out, _ = watch_job(proc, out_dir / "copy_bandwidth" / "current.txt", args.case_timeout)
    summary_path = out_dir / "copy_bandwidth" / "summary.json"
    if timed_out or proc.returncode != 0 or not summary_path.exists():
        from ..errors import NothingMeasuredError

        why = f"timed out after {args.case_timeout:.0f} s" if timed_out else f"exit code {proc.returncode}"
        raise NothingMeasuredError(f"copy-bandwidth job failed ({why}); log: {log_path}")
    summary = json.loads(summary_path.read_text())
    if args.calibration_out:
        from ..testbench.calibration import write_host_copy_calibration

        write_host_copy_calibration(summary, args.calibration_out)
    if args.json:
        print_json({"output_dir": str(out_dir), **summary})
        return 0
    rows = [
        [
            r["direction"],
            "pinned" if r["pinned"] else "pageable",
            f"{r['nbytes'] / 2**20:.0f}",
            r["interference"],
            f"{r['gbps']:.2f}",
        ]
        for r in summary["host_copy"]
    ]
    title = f"Host <-> device copies in {out_dir} (GB/s = 1e9 bytes/s)"
    console().print(make_table(title, ["direction", "host memory", "MiB", "beside", "GB/s"], rows))
    return 0
