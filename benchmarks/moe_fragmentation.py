"""Why MoE peaks under full recompute and forward-only passes reserve 11-23 GiB more than they hold (#37).

    python benchmarks/moe_fragmentation.py predict   # before the runs: the layouts and their predictions
    bash benchmarks/validation/x2_moe_fragmentation.sh   # on 2 H200 (~8 min): allocator histories, two profiled steps
    python benchmarks/moe_fragmentation.py           # the report, from what the script left
    python benchmarks/moe_fragmentation.py predict recompute  # the recompute set (x2_moe_fragmentation.sh recompute)
    python benchmarks/moe_fragmentation.py report recompute
    python benchmarks/moe_fragmentation.py predict holdout    # held-out shapes (x2_moe_fragmentation.sh holdout)
    python benchmarks/moe_fragmentation.py report holdout
    python benchmarks/moe_fragmentation.py predict holdout4   # 4 GPUs (x4_moe_holdout.sh)

On committed runs (validation_h200_x2/moe_gpu, plan_regret_h200_x4_r2 #106, _r3 #116) the MoE layouts with full
recompute or a forward-only pass held within 5 GiB of the model's allocated sum, but reserved 11-23 GiB beyond it;
with expandable segments the same layouts reserved 1-4 GiB beyond. The runs here record the caching allocator's
history of Qwen3-30B-A3B (all 128 experts, 4 layers) on 2 GPUs under full recompute and without it, at EP 1 (the
routed token counts per rank are fixed) and EP 2 (they vary with routing), plus one control with expandable segments;
and, for the step, the pp2 vpp4 full-recompute shape that ran 14% over its prediction on 4 GPUs (round 3's #116) with
a profiled step, beside the same shape without recompute.

The recompute set asks where a 128-expert block's full recompute spends what the model does not give it (EP 1 ran
16% over its prediction with full recompute, 5% without at EP 2): the 4-layer shape at EP 1 with and without full
recompute, each once with a profiled step and once with its layers' host issue times recorded (`host_timing`).

The holdout set is recorded before any model of the allocator's request sequence exists, to check one later without
tuning to it: allocator histories of both ranks for shapes the first set lacks (Qwen3-30B-A3B at 8192 tokens x 2
sequences and at EP 1 without recompute; Mixtral-8x7B, 8 experts of 14336, at EP 2 with and without full recompute),
and the EP 2 block with and without full recompute, profiled on both ranks (is the reduce-scatter that full recompute
exposes at EP 1 waiting for the other rank?) and with its host issue times.
"""

from __future__ import annotations

import json
import sys
from datetime import datetime, timezone
from functools import cache
from pathlib import Path

from megatron_autotuner import __version__
from megatron_autotuner.specs.loader import load_model_spec
from megatron_autotuner.theory.allocator import large_pool_peak
from megatron_autotuner.trace.analysis import summarize
from megatron_autotuner.trace.loader import load_trace
from megatron_autotuner.trace.memory_history import (
    MemoryHistory,
    large_pool_requests,
    load_snapshot,
    replay_history,
)
from megatron_autotuner.validate.layout import Layout
from megatron_autotuner.validate.predict import predict

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks/results/moe_fragmentation_h200_x2"
LAYOUTS = ROOT / "benchmarks/validation/x2_moe_fragmentation_layouts.json"
RECOMPUTE_OUT = ROOT / "benchmarks/results/moe_recompute_h200_x2"
RECOMPUTE_LAYOUTS = ROOT / "benchmarks/validation/x2_moe_recompute_layouts.json"
HOLDOUT_OUT = ROOT / "benchmarks/results/moe_holdout_h200_x2"
HOLDOUT_LAYOUTS = ROOT / "benchmarks/validation/x2_moe_holdout_layouts.json"
HOLDOUT4_OUT = ROOT / "benchmarks/results/moe_holdout_h200_x4"
HOLDOUT4_LAYOUTS = ROOT / "benchmarks/validation/x4_moe_holdout_layouts.json"
GIB = 2**30
_BASE = dict(model="Qwen3-30B-A3B", seq_length=4096, num_gpus=2, micro_batch_size=8, warmup_steps=3, steps=4)
SHAPES: tuple[dict, ...] = (
    dict(num_layers=4, global_batch_size=16, ep=1, recompute="full", memory_history=True),
    dict(num_layers=4, global_batch_size=16, ep=2, recompute="full", memory_history=True),
    dict(num_layers=4, global_batch_size=16, ep=2, recompute="none", memory_history=True),
    dict(num_layers=4, global_batch_size=16, ep=2, mode="forward", memory_history=True),
    dict(num_layers=4, global_batch_size=16, ep=2, recompute="full", expandable_segments=True),
    dict(num_layers=8, global_batch_size=16, pp=2, vpp=4, recompute="full", profile=True),
    dict(num_layers=8, global_batch_size=16, pp=2, vpp=4, recompute="none", profile=True),
)
RECOMPUTE_SHAPES: tuple[dict, ...] = (
    dict(num_layers=4, global_batch_size=16, ep=1, recompute="none", profile=True),
    dict(num_layers=4, global_batch_size=16, ep=1, recompute="full", profile=True),
    dict(num_layers=4, global_batch_size=16, ep=1, recompute="none", host_timing=True),
    dict(num_layers=4, global_batch_size=16, ep=1, recompute="full", host_timing=True),
)
_MIXTRAL = dict(model="Mixtral-8x7B", micro_batch_size=4)
HOLDOUT_SHAPES: tuple[dict, ...] = (
    dict(num_layers=4, global_batch_size=8, seq_length=8192, micro_batch_size=2, ep=2, recompute="full",
         memory_history=True),
    dict(num_layers=4, global_batch_size=16, ep=1, recompute="none", memory_history=True),
    dict(_MIXTRAL, num_layers=4, global_batch_size=16, ep=2, recompute="none", memory_history=True),
    dict(_MIXTRAL, num_layers=4, global_batch_size=16, ep=2, recompute="full", memory_history=True),
    dict(num_layers=4, global_batch_size=16, ep=2, recompute="none", profile=True),
    dict(num_layers=4, global_batch_size=16, ep=2, recompute="full", profile=True),
    dict(num_layers=4, global_batch_size=16, ep=2, recompute="full", host_timing=True),
)  # fmt: skip

# 4 GPUs (`x4_moe_holdout.sh`): EP 4 with and without full recompute, TP 2 x EP 2 with sequence parallelism, and
# Mixtral-8x7B at EP 4; allocator histories of rank 0 and rank 3
_X4 = dict(num_gpus=4, num_layers=4, memory_history=True)
HOLDOUT4_SHAPES: tuple[dict, ...] = (
    dict(_X4, global_batch_size=16, micro_batch_size=4, ep=4, recompute="none"),
    dict(_X4, global_batch_size=16, micro_batch_size=4, ep=4, recompute="full"),
    dict(_X4, global_batch_size=16, micro_batch_size=4, tp=2, ep=2, sequence_parallel=True, recompute="none"),
    dict(_X4, model="Mixtral-8x7B", global_batch_size=16, micro_batch_size=2, ep=4, recompute="none"),
)


def layouts(shapes: tuple[dict, ...] = SHAPES) -> list[Layout]:
    out = []
    for shape in shapes:
        lay = Layout(**{**_BASE, **shape})
        tags = [k for k in ("memory_history", "profile", "host_timing") if shape.get(k)]
        experts = load_model_spec(lay.model).num_moe_experts
        out.append(lay.replace(name=f"e{experts} L{lay.num_layers} {lay.label} {' '.join(tags)}".strip()))
    return out


def cmd_predict(shapes: tuple[dict, ...], layouts_file: Path, out: Path) -> int:
    if (out / "results.jsonl").exists():  # a prediction is made before its run, never rewritten after it
        print(f"moe_fragmentation: error: {out.relative_to(ROOT)}: has results; its predictions stay as committed")
        return 2
    rows, docs = [], []
    for lay in layouts(shapes):
        docs.append(lay.to_dict())
        # as the runner runs it: no APEX, so unfused weight-gradient accumulation
        rows.append(
            {
                "label": lay.label,
                "layout_id": lay.layout_id,
                "predicted": predict(lay, "H200", gradient_accumulation_fusion=False),
            }
        )
    layouts_file.write_text(json.dumps({"gpu": "H200", "layouts": docs}, indent=1) + "\n")
    out.mkdir(parents=True, exist_ok=True)
    doc = {
        "kind": "moe-fragmentation-prediction",
        "tool_version": __version__,
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "rows": rows,
    }
    (out / "predicted.json").write_text(json.dumps(doc, indent=1) + "\n")
    for row in rows:
        p = row["predicted"]
        print(f"{row['label']}: step {p['step_time_s']:.3f} s, peak {p['peak_memory_gib']:.1f} GiB")
    return 0


@cache
def _replayed(path: Path) -> tuple[dict, MemoryHistory]:
    """A committed snapshot and its replay (the device with the most events), read once for both reports."""
    snapshot = load_snapshot(path)
    return snapshot, replay_history(snapshot)


def allocator_replays() -> list[dict]:
    """Every committed rank history recorded from the process start under the default allocator, replayed through
    `theory.allocator.large_pool_peak`: the allocator model's reserved memory beside the recorded one."""
    rows = []
    for path in sorted((ROOT / "benchmarks/results").glob("**/*.pickle.gz")):
        snapshot, hist = _replayed(path)
        device = hist.device
        if hist.initial_reserved_bytes > 64 * 2**20:
            continue  # the history began after memory was reserved: nothing to compare
        modelled = large_pool_peak(large_pool_requests(snapshot, device))
        rows.append(
            {
                "snapshot": str(path.relative_to(ROOT)),
                "expandable_segments": any(e.get("action") == "segment_map" for e in snapshot["device_traces"][device]),
                "recorded_reserved_gib": hist.peak_reserved_bytes / GIB,
                "modelled_reserved_gib": modelled.reserved_bytes / GIB,
                "recorded_unallocated_gib": hist.reserved_unallocated_at_peak_bytes / GIB,
                "modelled_unallocated_gib": modelled.unallocated_at_peak_bytes / GIB,
                "awaiting_at_peak_gib": hist.awaiting_at_peak_bytes / GIB,
                # cudaMalloc failed and the allocator freed cached segments (the replay does not model it)
                "released_segments": sum(
                    1 for e in snapshot["device_traces"][device] if e.get("action") == "segment_free"
                ),
            }
        )
    return rows


def _rank_comm_ms(trace_path: Path) -> dict:
    """One rank's profiled step: span, GPU idle, and per collective the kernel time and the time nothing computed
    beside it (an all-to-all kernel that runs long on one rank is waiting for the other)."""
    stats = summarize(load_trace(trace_path)).overlap
    return {
        "trace": trace_path.name,
        "span_ms": stats.span_us / 1e3,
        "idle_ms": stats.idle_us / 1e3,
        "collectives": {
            c.name: {"count": c.count, "kernel_ms": c.kernel_us / 1e3, "exposed_ms": c.exposed_us / 1e3}
            for c in stats.by_collective
        },
    }


def cmd_report(out: Path = OUT) -> int:
    results = {json.loads(line)["layout_id"]: json.loads(line) for line in (out / "results.jsonl").open()}
    rows = []
    for layout_id, row in results.items():
        m, p = row.get("measured") or {}, row["predicted"]
        entry = {
            "label": row["label"],
            "layout_id": layout_id,
            "predicted_step_s": p["step_time_s"],
            "measured_step_s": m.get("step_time_s"),
            "predicted_peak_gib": p["peak_memory_gib"],
            "measured_peak_gib": m.get("peak_gib"),
            "max_allocated_gib": m.get("max_allocated_gib"),
            "max_reserved_gib": m.get("max_reserved_gib"),
        }
        snap = out / "snapshots" / f"{layout_id}.rank_0.pickle.gz"
        if snap.exists():
            hist = _replayed(snap)[1]
            worst = max(hist.growths, key=lambda g: g.excess_bytes)
            entry["reserved_unallocated_at_peak_gib"] = hist.reserved_unallocated_at_peak_bytes / GIB
            entry["largest_excess_growth"] = {
                "request_gib": worst.request_bytes / GIB,
                "free_before_gib": worst.free_before_bytes / GIB,
                "site": worst.frames[0] if worst.frames else "",
            }
        ranks = [_rank_comm_ms(t) for t in sorted((out / "traces").glob(f"{layout_id}.rank_*.json.gz"))]
        if ranks:
            entry["ranks"] = ranks
        rows.append(entry)
    doc = {"kind": "moe-fragmentation-report", "rows": rows, "allocator_replays": allocator_replays()}
    (out / "report.json").write_text(json.dumps(doc, indent=1) + "\n")
    for e in rows:
        print(
            f"{e['label']}: step {e['measured_step_s']:.3f} vs {e['predicted_step_s']:.3f} s; "
            f"peak {e['measured_peak_gib']:.1f} vs {e['predicted_peak_gib']:.1f} GiB"
        )
    for r in doc["allocator_replays"]:
        print(
            f"{r['snapshot']}: recorded {r['recorded_reserved_gib']:.2f}, modelled {r['modelled_reserved_gib']:.2f} GiB"
        )
    return 0


def cmd_recompute_report() -> int:
    """Per layout: the step predicted and measured, the per-layer host issue times (`host_timing`) and, from the
    profiled step's rank-0 trace, the GPU's busy, idle and compute time."""
    rows = []
    for line in (RECOMPUTE_OUT / "results.jsonl").open():
        run = json.loads(line)
        m = run.get("measured") or {}
        entry = {"label": run["label"], "layout_id": run["layout_id"],
                 "predicted_step_s": run["predicted"]["step_time_s"], "measured_step_s": m.get("step_time_s"),
                 "host_timing": m.get("host_timing")}  # fmt: skip
        summary = RECOMPUTE_OUT / "traces" / f"{run['layout_id']}.summary.json"
        if summary.exists():
            overlap = json.loads(summary.read_text())["traces"][0]["overlap"]
            keys = ("span_us", "busy_us", "idle_us", "compute_us", "comm_us")
            entry["trace_ms"] = {k.removesuffix("_us"): overlap[k] / 1e3 for k in keys}
        rows.append(entry)
    doc = {"kind": "moe-recompute-report", "rows": rows}
    (RECOMPUTE_OUT / "report.json").write_text(json.dumps(doc, indent=1) + "\n")
    print(json.dumps(doc, indent=1))
    return 0


def main(argv: list[str]) -> int:
    which = argv[1] if len(argv) > 1 else ""
    if argv[:1] == ["predict"]:
        if which == "recompute":
            return cmd_predict(RECOMPUTE_SHAPES, RECOMPUTE_LAYOUTS, RECOMPUTE_OUT)
        if which == "holdout":
            return cmd_predict(HOLDOUT_SHAPES, HOLDOUT_LAYOUTS, HOLDOUT_OUT)
        if which == "holdout4":
            return cmd_predict(HOLDOUT4_SHAPES, HOLDOUT4_LAYOUTS, HOLDOUT4_OUT)
        return cmd_predict(SHAPES, LAYOUTS, OUT)
    if which == "recompute":
        return cmd_recompute_report()
    return cmd_report({"holdout": HOLDOUT_OUT, "holdout4": HOLDOUT4_OUT}.get(which, OUT))


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
