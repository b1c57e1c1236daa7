"""#40 on two H200s: what CUDA graphs of scope attn / moe_router / moe_preprocess take off an eager MoE layer.

    PART=run bash benchmarks/validation/x2_moe_graphs.sh       # host L: eager vs graphed, timed
    PART=profile bash benchmarks/validation/x2_moe_graphs.sh   # host M: the 32-expert layouts, profiled
    PART=timed bash benchmarks/validation/x2_moe_graphs.sh     # host N: eager / attn / all, layers' host timed
    PART=ranks CAL=... bash benchmarks/validation/x2_moe_graphs.sh  # host O: eager / all profiled, both ranks kept
    python benchmarks/moe_graphs.py                            # this report, from what they left

Writes benchmarks/results/moe_graphs_h200_x2/report.json: per layout the step predicted before the run (default
floors, `predicted_default*.json`), at the run (the host's own three-process MoE floors, results.jsonl), today's
model with those floors, and the measured step and peak; per part the measured step change from the eager layout
against the model's. For the profiled part, from rank 0's raw trace of the profiled step: the forward's
synchronisation points (megatron-core's alltoall dispatcher waits on the host for the token counts once per layer,
`cudaEventSynchronize`), the span between consecutive ones inside a micro-batch (one layer's MoE after the wait, the
next layer's attention, router and preprocess), the GPU's computation in it (kernels other than NCCL's) and the host's
wait at its end. For the timed part, each rank's median layer forward / backward time (`host_timing`; the eager
layout's only: the hooks recorded nothing under TE's graphs). For the ranks part, the spans of every rank's trace
(`traces_by_rank`): which rank issued slower, and how long the other waited for it.
"""

from __future__ import annotations

import gzip
import json
import statistics
from pathlib import Path
from typing import Any

from megatron_autotuner.costmodel.calibration import load_calibration
from megatron_autotuner.launch.records import read_records
from megatron_autotuner.trace.intervals import busy_time, clip, union
from megatron_autotuner.validate.layout import Layout
from megatron_autotuner.validate.predict import predict
from megatron_autotuner.validate.results import layer_host_ms_by_rank

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks/results/moe_graphs_h200_x2"
# part -> (the prediction written before it, the 2-GPU lease it ran on)
PARTS = {
    "run": ("predicted_default.json", "L"),
    "profile": ("predicted_default_profile.json", "M"),
    "timed": ("predicted_default_timed.json", "N"),
    "ranks": ("predicted_default_ranks.json", "O"),
}
# the layers' forward synchronisation: the dispatcher's wait for the token counts
SYNC_EVENT = "cudaEventSynchronize"


def forward_segments(trace_path: Path) -> dict[str, Any]:
    """The profiled step's forward synchronisation spans (see the module doc): median span, GPU computation in it
    and the host's wait at its end, in ms, over the spans inside a micro-batch (those holding no backward)."""
    with gzip.open(trace_path) as f:
        events = json.load(f)["traceEvents"]
    step = next(e for e in events if e.get("name") == "train_step" and e.get("cat") == "user_annotation")
    t0, t1 = step["ts"], step["ts"] + step["dur"]
    syncs = sorted((e for e in events if e.get("name") == SYNC_EVENT and t0 <= e["ts"] <= t1), key=lambda e: e["ts"])
    compute = union(
        (e["ts"], e["ts"] + e["dur"])
        for e in events
        if e.get("cat") == "kernel" and t0 <= e["ts"] <= t1 and not e["name"].startswith("nccl")
    )
    spans = []
    for a, b in zip(syncs, syncs[1:], strict=False):
        start, end = a["ts"] + a["dur"], b["ts"] + b["dur"]
        busy = busy_time(clip(compute, start, end))
        spans.append({"span_ms": (end - start) / 1e3, "compute_ms": busy / 1e3, "wait_ms": b["dur"] / 1e3})
    # a span holding a backward carries tens of ms of computation; the forward's hold one layer's (under 5 ms)
    inside = [s for s in spans if s["compute_ms"] < 5.0]
    return {
        "syncs": len(syncs),
        "step_ms": (t1 - t0) / 1e3,
        "compute_ms": busy_time(compute) / 1e3,
        "forward_spans": len(inside),
        **{f"median_{k}": statistics.median(s[k] for s in inside) for k in ("span_ms", "compute_ms", "wait_ms")},
        # the rank's own issue time of a span (the span less its wait at the end), and that wait, on average
        "mean_issue_ms": statistics.mean(s["span_ms"] - s["wait_ms"] for s in inside),
        "mean_wait_ms": statistics.mean(s["wait_ms"] for s in inside),
    }


def rows() -> list[dict[str, Any]]:
    out = []
    for part, (predicted_file, host) in PARTS.items():
        folder = RESULTS / part
        before = {p["layout_id"]: p["predicted"] for p in json.loads((RESULTS / predicted_file).read_text())["layouts"]}
        # the floors the part measured, or those it was given (CAL: host M's, copied in as calibration.json)
        measured = folder / "host_floor/host_floor.calibration.json"
        calibration = load_calibration(str(measured if measured.exists() else folder / "calibration.json"))
        for rec in read_records(folder / "results.jsonl"):
            layout = Layout.from_record(rec)
            now = predict(layout, "H200", calibration)
            row = {
                "part": part,
                "host": host,
                "layout_id": rec["layout_id"],
                "label": rec["label"],
                "cuda_graph_scope": list(layout.cuda_graph_scope) if layout.cuda_graph_impl != "none" else [],
                "predicted_before_step_s": before[rec["layout_id"]]["step_time_s"],
                "predicted_at_run_step_s": rec["predicted"]["step_time_s"],
                "predicted_now_step_s": now["step_time_s"],
                "measured_step_s": rec["measured"]["step_time_s"],
                "predicted_now_peak_gib": now["peak_memory_gib"],
                "measured_peak_gib": rec["measured"]["peak_gib"],
            }
            timed = layer_host_ms_by_rank(folder, rec["layout_id"])
            if timed:
                row["layer_host_ms_by_rank"] = timed
            traces = sorted((folder / "raw_traces").glob(f"{rec['layout_id']}.rank_*.json.gz"))
            if traces:
                by_rank = [forward_segments(trace) for trace in traces]
                row["trace"] = by_rank[0]
                if len(by_rank) > 1:
                    row["traces_by_rank"] = by_rank
            out.append(row)
    return out


def graph_changes(table: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each graphed layout against the eager one of its part and shape (same label up to 'graphs ...')."""
    out = []
    for row in table:
        if not row["cuda_graph_scope"]:
            continue
        stem = row["label"].split(" graphs ")[0]
        eager = next(
            (r for r in table if r["part"] == row["part"] and r["label"].startswith(stem + " eager")),
            None,
        )
        if eager is None:
            continue
        out.append(
            {
                "part": row["part"],
                "label": row["label"],
                "measured_change": row["measured_step_s"] / eager["measured_step_s"] - 1.0,
                "model_change": row["predicted_now_step_s"] / eager["predicted_now_step_s"] - 1.0,
            }
        )
    return out


def main() -> int:
    table = rows()
    report = {"schema_version": 1, "gpu": "H200", "rows": table, "graph_changes": graph_changes(table)}
    (RESULTS / "report.json").write_text(json.dumps(report, indent=1) + "\n")
    for r in table:
        err = r["predicted_now_step_s"] / r["measured_step_s"] - 1
        print(f"{r['host']} {r['label']:58s} meas {r['measured_step_s'] * 1e3:6.1f} ms  model {err:+.1%}")
    for c in report["graph_changes"]:
        print(f"{c['label']:60s} measured {c['measured_change']:+.1%}  model {c['model_change']:+.1%}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
