"""`mat trace`: summarize Kineto traces, measure comm/compute overlap, merge rank traces for Perfetto."""

from __future__ import annotations

import argparse

from .. import SCHEMA_VERSION, __version__
from ..argspec.argtypes import non_empty_path, non_negative_float, non_negative_int, positive_int, rank_offset
from ..errors import ConfigError
from .output import console, make_table, print_json

# the shipped traces the help's examples read (paths from the repository root)
TRACES = "tests/fixtures/traces/"
# gpt-oss-20b at ep 2 on two H200s under the all-to-all overlap (#40): its host waits drain the output layer
OVERLAP_TRACE = (
    "benchmarks/results/moe_overlap_host_h200_x2/profile_r2/raw/"
    "gpt-oss-20b.L4.g2.tp1.pp1.cp1.ep2.s4096.b1.none.train.9ec4ab9cb1.rank_0.json.gz"
)


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "trace",
        help="analyse torch-profiler (Kineto) traces and CUDA allocator histories: summary, overlap, merge, waits, "
        "syncs, memory",
        description="Analyse torch-profiler (Kineto) traces (.json or .json.gz) without torch: time per kernel "
        "category, comm/compute overlap, rank merge for Perfetto, collective waits across ranks, the host's waits on "
        "the GPU, and CUDA allocator histories.",
        epilog="examples:\n"
        f"  mat trace summary {TRACES}h200_te_layer_tp2_nccl_rank0.json.gz\n"
        f"  mat trace overlap {TRACES}h200_te_layer_tp2_userbuffers_rank0.json.gz --range _LayerNormLinear\n"
        f"  mat trace merge {TRACES}h200_te_layer_tp2_nccl_rank0.json.gz {TRACES}h200_te_layer_tp2_nccl_rank1.json.gz "
        "-o merged.json.gz",
    )
    sub = p.add_subparsers(dest="trace_command", metavar="SUBCOMMAND")
    p.set_defaults(func=_no_subcommand, _trace_parser=p)

    s = sub.add_parser(
        "summary",
        help="time per category and stream, top kernels, comm/compute overlap",
        description="Time per kernel category and stream, top kernels and comm/compute overlap of each trace.",
        epilog="examples:\n"
        f"  mat trace summary {TRACES}h200_te_layer_tp2_nccl_rank0.json.gz\n"
        f"  mat trace summary {TRACES}h200_te_layer_tp2_nccl_rank0.json.gz "
        f"{TRACES}h200_te_layer_tp2_nccl_rank1.json.gz --top 5\n"
        f"  mat trace summary {TRACES}h200_te_layer_tp1_rank0.json.gz --json",
    )
    s.add_argument("traces", nargs="+", metavar="TRACE", help="Kineto trace (.json or .json.gz), one or more")
    s.add_argument("--top", type=positive_int, default=15, help="number of kernels to list (default 15)")
    s.add_argument(
        "--rules",
        metavar="YAML",
        type=non_empty_path,
        help="extra classification rules, tried before the built-in ones (default: the built-in rules only)",
    )
    s.add_argument("--json", action="store_true", help="print JSON instead of tables")
    s.set_defaults(func=run_summary)

    o = sub.add_parser(
        "overlap",
        help="communication/computation overlap of a trace or of a named range",
        description=(
            "Overlap of communication (NCCL, userbuffers, symm-mem, peer copies) with computation. "
            "overlap_ratio = overlap / min(comm, compute); exposed comm = comm not covered by compute."
        ),
        epilog="examples:\n"
        f"  mat trace overlap {TRACES}h200_te_layer_tp2_nccl_rank1.json.gz\n"
        f"  mat trace overlap {TRACES}h200_te_layer_tp2_userbuffers_rank0.json.gz --range _LayerNormLinear --json\n"
        f"  mat trace overlap {TRACES}h200_te_layer_tp2_userbuffers_rank0.json.gz --range LayerNorm --match contains",
    )
    o.add_argument("trace", metavar="TRACE", help="Kineto trace (.json or .json.gz)")
    o.add_argument(
        "--range",
        dest="range_name",
        metavar="NAME",
        help="restrict to a record_function / NVTX range (default: none, the whole trace)",
    )
    o.add_argument("--match", choices=("exact", "contains", "regex"), default="exact", help="how --range matches names")
    o.add_argument(
        "--source",
        choices=("auto", "cpu", "gpu"),
        default="auto",
        help="range kind: cpu (cpu_op/user_annotation, via correlation ids), gpu (gpu_user_annotation), auto",
    )
    o.add_argument(
        "--rules",
        metavar="YAML",
        type=non_empty_path,
        help="extra classification rules, tried before the built-in ones (default: the built-in rules only)",
    )
    o.add_argument("--json", action="store_true", help="print JSON instead of a table")
    o.set_defaults(func=run_overlap)

    m = sub.add_parser(
        "merge",
        help="merge rank traces into one Perfetto / chrome://tracing file",
        description="Merge N rank traces into one file, one process per rank ('rank R'), timestamps aligned.",
        epilog="examples:\n"
        f"  mat trace merge {TRACES}h200_te_layer_tp2_nccl_rank0.json.gz {TRACES}h200_te_layer_tp2_nccl_rank1.json.gz "
        "-o merged.json.gz\n"
        f"  mat trace merge {TRACES}h200_te_layer_tp2_userbuffers_rank0.json.gz "
        f"{TRACES}h200_te_layer_tp2_userbuffers_rank1.json.gz -o merged_ub.json --offset-us 1=-2.5 --json",
    )
    m.add_argument("traces", nargs="+", metavar="TRACE", help="rank traces (.json or .json.gz)")
    m.add_argument(
        "-o", "--output", required=True, metavar="OUT", type=non_empty_path, help="output file (.json or .json.gz)"
    )
    _add_offset_argument(m)
    m.add_argument("--json", action="store_true", help="print what was merged as JSON")
    m.set_defaults(func=run_merge)

    w = sub.add_parser(
        "waits",
        help="per collective, the transfer and each rank's wait for the others, from every rank's trace",
        description=(
            "Match the n-th call of each collective across the ranks' traces of one step: the time all ranks were "
            "inside it is the transfer, a rank's kernel time beyond it its wait for the last rank to arrive."
        ),
        epilog="examples:\n"
        f"  mat trace waits {TRACES}h200_te_layer_tp2_nccl_rank0.json.gz {TRACES}h200_te_layer_tp2_nccl_rank1.json.gz\n"
        f"  mat trace waits {TRACES}h200_te_layer_tp2_nccl_rank0.json.gz {TRACES}h200_te_layer_tp2_nccl_rank1.json.gz "
        "--json",
    )
    w.add_argument("traces", nargs="+", metavar="TRACE", help="one trace per rank, in rank order (two or more)")
    _add_offset_argument(w)
    w.add_argument("--json", action="store_true", help="print JSON instead of a table")
    w.set_defaults(func=run_waits)

    y = sub.add_parser(
        "syncs",
        help="the host's blocking waits on the GPU, and what the GPU ran during each",
        description=(
            "List every cudaStreamSynchronize / cudaEventSynchronize (and driver equivalents) of at least --min-ms on "
            "a host thread, the CPU op around it (aten::item, aten::copy_, none for an event's synchronize) and the "
            "kernels that ran while the host waited. A host-paced step loses each such wait."
        ),
        epilog="examples:\n"
        f"  mat trace syncs {TRACES}h200_te_layer_tp2_nccl_rank0.json.gz --min-ms 0\n"
        f"  mat trace syncs {OVERLAP_TRACE} --min-ms 5 --json",
    )
    y.add_argument("trace", metavar="TRACE", help="one torch-profiler trace (.json or .json.gz)")
    y.add_argument(
        "--min-ms", type=non_negative_float, default=1.0, help="list waits at least this long (ms, default 1)"
    )
    y.add_argument("--top", type=positive_int, default=3, help="kernels to name per wait (default 3)")
    y.add_argument("--json", action="store_true", help="print JSON instead of a table")
    y.set_defaults(func=run_syncs)

    h = sub.add_parser(
        "memory",
        help="where reserved-but-unallocated memory came from, from a CUDA allocator history",
        description=(
            "Replay a torch.cuda.memory._snapshot() pickle (.pickle or .pickle.gz, recorded with "
            "_record_memory_history; `mat validate --memory-history` writes one per rank): peak held and reserved "
            "bytes, and the requests that grew the reservation while enough reserved memory was free but in pieces."
        ),
        epilog="examples:\n"
        "  mat trace memory benchmarks/results/validation_h200_x1/stand_in_memory/memory/rank_1.pickle.gz\n"
        "  mat trace memory benchmarks/results/validation_h200_x1/stand_in_memory/memory/rank_1.pickle.gz "
        "--top 3 --json\n"
        "  mat trace memory benchmarks/results/validation_h200_x1/stand_in_memory/memory/rank_1.pickle.gz "
        "--device 0",
    )
    h.add_argument("snapshot", metavar="SNAPSHOT", help="memory snapshot pickle (.pickle or .pickle.gz)")
    h.add_argument(
        "--device", type=non_negative_int, default=None, help="CUDA device index (default: the one with most events)"
    )
    h.add_argument("--top", type=positive_int, default=10, help="growths and allocations to list (default 10)")
    h.add_argument("--json", action="store_true", help="print JSON instead of tables")
    h.set_defaults(func=run_memory)


def _add_offset_argument(parser: argparse.ArgumentParser) -> None:
    """`--offset-us R=US` of merge and waits: a known clock skew of rank R (`trace.merge.alignment_shifts_us`)."""
    parser.add_argument(
        "--offset-us",
        action="append",
        default=[],
        metavar="R=US",
        type=rank_offset,
        help="shift rank R (>= 0) by US microseconds (repeatable; negative moves it earlier), on top of the "
        "baseTimeNanoseconds alignment (default: no shift)",
    )


def _no_subcommand(args: argparse.Namespace) -> int:
    args._trace_parser.print_help()
    return 2


def _classifier(args: argparse.Namespace):
    from ..trace import Classifier, load_rules

    if not getattr(args, "rules", None):
        return None
    return Classifier(extra_rules=load_rules(args.rules))


def _envelope(payload: dict) -> dict:
    return {"schema_version": SCHEMA_VERSION, "tool_version": __version__, **payload}


def _short(name: str, width: int = 70) -> str:
    text = name[5:] if name.startswith("void ") else name
    cut = text.find("(")
    if cut > 0:
        text = text[:cut]
    return text if len(text) <= width else text[: width - 1] + "…"


def _pct(part: float, whole: float) -> str:
    return f"{100 * part / whole:.1f}%" if whole > 0 else "-"


def run_summary(args: argparse.Namespace) -> int:
    from ..trace import load_trace, summarize

    classifier = _classifier(args)
    summaries = [summarize(load_trace(path), top=args.top, classifier=classifier) for path in args.traces]
    if args.json:
        print_json(_envelope({"traces": [s.to_dict() for s in summaries]}))
        return 0
    out = console()
    for s in summaries:
        ov = s.overlap
        out.print(
            f"[bold]{s.path}[/bold]  rank {s.rank if s.rank is not None else '-'}"
            f"/{s.world_size if s.world_size is not None else '-'}  {', '.join(s.device_names) or '-'}  "
            f"{s.gpu_event_count} GPU events  span {ov.span_us / 1000:.3f} ms  busy {ov.busy_us / 1000:.3f} ms  "
            f"idle {ov.idle_us / 1000:.3f} ms"
        )
        rows = [
            [c.category, c.count, c.kernel_us / 1000, c.wall_us / 1000, _pct(c.wall_us, ov.busy_us)]
            for c in s.categories
        ]
        out.print(make_table("Time per category", ["category", "events", "kernel ms", "wall ms", "of busy"], rows))
        rows = [
            [
                _short(k.name),
                f"{k.category}" + (f" ({k.library}{' ' + k.collective if k.collective else ''})" if k.library else ""),
                k.count,
                k.total_us / 1000,
                k.mean_us,
            ]
            for k in s.top_kernels
        ]
        out.print(make_table("Top kernels", ["kernel", "category", "count", "total ms", "mean us"], rows))
        rows = [
            [
                f"dev {st.device} stream {st.stream}",
                st.count,
                st.busy_us / 1000,
                ", ".join(f"{c} {v / 1000:.2f}" for c, v in sorted(st.category_us.items(), key=lambda kv: -kv[1])),
            ]
            for st in s.streams
        ]
        out.print(make_table("Streams", ["stream", "events", "busy ms", "ms per category"], rows))
        _print_overlap(out, ov)
        if s.unmatched_kernels:
            out.print(
                f"[yellow]{len(s.unmatched_kernels)} kernel name(s) matched no rule (counted as compute)[/yellow]"
            )
    return 0


def _print_overlap(out, ov) -> None:
    title = "Comm / compute overlap" + (
        f" in range {ov.range_name!r} ({ov.instances} instances)" if ov.range_name else ""
    )
    rows = [
        ["end-to-end (span)", ov.span_us / 1000],
        ["busy", ov.busy_us / 1000],
        ["compute", ov.compute_us / 1000],
        ["communication", ov.comm_us / 1000],
        ["overlap", ov.overlap_us / 1000],
        ["exposed communication", ov.exposed_comm_us / 1000],
    ]
    for cat, us in ov.category_us.items():
        rows.append([f"  {cat}", us / 1000])
    if ov.comm_overlap_any_compute_us is not None:
        rows.append(["comm overlapped by any compute", ov.comm_overlap_any_compute_us / 1000])
    out.print(make_table(title, ["quantity", "ms"], rows))
    out.print(
        f"overlap ratio (overlap / min(comm, compute)) = {ov.overlap_ratio:.3f}; "
        f"overlap / comm = {ov.comm_overlap_fraction:.3f}"
    )
    if ov.by_library or ov.by_collective:
        rows = [
            [kind, b.name, b.count, b.comm_us / 1000, b.overlap_us / 1000, b.exposed_us / 1000]
            for kind, group in (("library", ov.by_library), ("collective", ov.by_collective))
            for b in group
        ]
        out.print(make_table("Communication", ["by", "name", "events", "comm ms", "overlap ms", "exposed ms"], rows))


def run_overlap(args: argparse.Namespace) -> int:
    from ..trace import load_trace, overlap

    trace = load_trace(args.trace)
    stats = overlap(trace, args.range_name, match=args.match, source=args.source, classifier=_classifier(args))
    if args.json:
        print_json(_envelope({"path": trace.path, "rank": trace.rank, "overlap": stats.to_dict()}))
        return 0
    out = console()
    out.print(f"[bold]{trace.path}[/bold]  rank {trace.rank if trace.rank is not None else '-'}")
    _print_overlap(out, stats)
    return 0


def _parse_offsets(items: list[str]) -> dict[int, float]:
    offsets: dict[int, float] = {}
    for item in items:
        rank, sep, value = item.partition("=")
        try:
            if not sep:
                raise ValueError
            offsets[int(rank)] = float(value)
        except ValueError:
            raise ConfigError("--offset-us", f"expected R=US (rank=microseconds), got {item!r}") from None
    return offsets


def run_merge(args: argparse.Namespace) -> int:
    from ..trace import merge_traces

    result = merge_traces(args.traces, args.output, offsets_us=_parse_offsets(args.offset_us))
    if args.json:
        print_json(result.to_dict())
        return 0
    rows = [[f"rank {r.rank}", r.path, r.events, r.gpu_events, r.shift_us] for r in result.ranks]
    out = console()
    out.print(make_table(f"Merged into {result.out}", ["process", "source", "events", "GPU events", "shift us"], rows))
    return 0


def run_waits(args: argparse.Namespace) -> int:
    from ..trace import collective_waits, load_trace

    if len(args.traces) < 2:
        raise ConfigError("traces", "give one trace per rank, two or more")
    traces = [load_trace(p) for p in args.traces]
    waits = collective_waits(traces, offsets_us=_parse_offsets(args.offset_us))
    if args.json:
        print_json(_envelope({"traces": list(args.traces), "collectives": [w.to_dict() for w in waits]}))
        return 0
    rows = [
        [w.collective, w.calls, w.transfer_median_us, w.transfer_sum_us / 1000]
        + [f"{s / 1000:.2f} ({m / 1000:.2f})" for s, m in zip(w.wait_sum_us, w.wait_max_us, strict=True)]
        for w in waits
    ]
    ranks = [f"rank {i} wait ms (max)" for i in range(len(traces))]
    console().print(make_table("Collective waits", ["collective", "calls", "transfer us", "transfer ms", *ranks], rows))
    return 0


def run_syncs(args: argparse.Namespace) -> int:
    from ..trace import host_waits, load_trace

    waits = host_waits(load_trace(args.trace), min_ms=args.min_ms, top=args.top)
    if args.json:
        print_json(_envelope(waits.to_dict()))
        return 0
    rows = [
        [f"{w.start_ms:.1f}", w.call, f"{w.duration_ms:.2f}", w.inside or "-",
         "\n".join(f"{ms:.2f} {name[:40]}" for name, ms in w.gpu_during_ms) or "-"]
        for w in waits.waits
    ]  # fmt: skip
    title = f"Host waits >= {waits.min_ms:g} ms ({waits.calls} blocking calls, {waits.total_ms:.1f} ms in all)"
    console().print(make_table(title, ["at ms", "call", "ms", "inside", "GPU ran (ms)"], rows))
    return 0


def run_memory(args: argparse.Namespace) -> int:
    from ..trace.memory_history import load_snapshot, replay_history

    if args.top < 1:
        raise ConfigError("top", f"must be >= 1, got {args.top}")
    history = replay_history(load_snapshot(args.snapshot), device=args.device, top=args.top).to_dict()
    if args.json:
        print_json(_envelope({"snapshot": args.snapshot, **history}))
        return 0
    gib = 1024**3
    out = console()
    out.print(
        f"[bold]{args.snapshot}[/bold]  device {history['device']}  {history['events']} events  "
        f"peak held {history['peak_held_bytes'] / gib:.2f} GiB "
        f"(freed, awaiting another stream: {history['awaiting_at_peak_bytes'] / gib:.2f} GiB)  "
        f"peak reserved {history['peak_reserved_bytes'] / gib:.2f} GiB"
        f"  reserved-unallocated at peak {history['reserved_unallocated_at_peak_bytes'] / gib:.2f} GiB  "
        f"growth beyond need {history['excess_growth_bytes'] / gib:.2f} GiB over {history['growth_events']} growths"
    )
    rows = [
        [
            g["index"],
            g["request_bytes"] / gib,
            g["free_before_bytes"] / gib,
            g["growth_bytes"] / gib,
            g["excess_bytes"] / gib,
            "\n".join(g["frames"][:2]) or "-",
        ]
        for g in history["largest_excess_growths"]
    ]
    largest = history["largest_allocations"]
    headers = ["event", "request GiB", "free before GiB", "grew GiB", "beyond need GiB", "requested at"]
    out.print(make_table("Reservation growths beyond need", headers, rows))
    rows = [[a["index"], a["size_bytes"] / gib, "\n".join(a["frames"][:2]) or "-"] for a in largest]
    out.print(make_table("Largest allocations", ["event", "GiB", "requested at"], rows))
    for note in history["notes"]:
        out.print(f"[yellow]{note}[/yellow]")
    return 0
