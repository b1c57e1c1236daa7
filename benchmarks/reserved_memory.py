"""Where Qwen3-32B's reserved-but-unallocated memory on 4 GPUs goes: blocks freed on the host, awaiting the GPU.

    bash benchmarks/validation/x4_reserved_memory.sh          # on a 4-GPU H200 host: allocator histories
    bash benchmarks/validation/x4_reserved_memory.sh queue    # launch-queue depth and profiled steps
    python benchmarks/reserved_memory.py                      # this report, from what those left
    python benchmarks/reserved_memory.py predict              # before `x4_reserved_memory.sh blind`: new layouts

Reads rank 0's allocator snapshots (benchmarks/results/reserved_memory_h200_x4/snapshots) and profiled steps
(.../queue/profiled/traces) and writes .../report.json: per layout, the peak of held + awaiting memory, what was
awaiting its stream event then (`free_requested` without `free_completed`), by the code that allocated it; how long
a weight gradient's free waited; and from the traces how many GPU operations the host had launched ahead of the GPU
and how far ahead it ran. `costmodel.queued_frees` models the awaiting memory; tests/costmodel/test_queued_frees.py
holds it to this.
"""

from __future__ import annotations

import bisect
import gzip
import json
import pickle
import statistics
from pathlib import Path

from megatron_autotuner.trace.memory_history import replay_history

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks/results/reserved_memory_h200_x4"
GIB = 2**30
WGRAD_SITES = ("layernorm_linear.py:1063", "linear.py:1630", "layers.py:725")  # TE wgrad GEMMs, output layer
MODEL_CODE = ("transformer_engine", "megatron")


def _weight_gradient_waits_ms(trace: list[dict]) -> list[float]:
    """How long each weight gradient's free (`free_requested`) waited for its `free_completed`."""
    requested: dict[int, dict] = {}
    waits = []
    for e in trace:
        if e["action"] == "free_requested":
            requested[e["addr"]] = e
        elif e["action"] == "free_completed" and (req := requested.pop(e["addr"], None)) is not None:
            frames = [f for f in req.get("frames", []) if any(n in f["filename"] for n in MODEL_CODE)]
            if len(frames) > 1 and f"{frames[1]['filename'].rsplit('/', 1)[-1]}:{frames[1]['line']}" in WGRAD_SITES:
                waits.append((e["time_us"] - req["time_us"]) / 1e3)
    return waits


def snapshot_report(path: Path) -> dict:
    """Rank 0's history replayed (`trace.memory_history`): the peak held, what of it awaited its free, by the code
    that allocated it, and the waits of weight gradients."""
    with gzip.open(path) as f:
        snapshot = pickle.load(f)
    history = replay_history(snapshot, device=0)
    waits_ms = _weight_gradient_waits_ms(snapshot["device_traces"][0])
    return {
        "peak_held_plus_awaiting_gib": history.peak_held_bytes / GIB,
        "held_at_peak_gib": (history.peak_held_bytes - history.awaiting_at_peak_bytes) / GIB,
        "awaiting_at_peak_gib": history.awaiting_at_peak_bytes / GIB,
        "awaiting_at_peak_by_site": [s.to_dict() for s in history.awaiting_at_peak_by_site if s.bytes >= 2**20],
        "weight_gradient_wait_ms": {"n": len(waits_ms), "median": statistics.median(waits_ms) if waits_ms else None},
    }


def trace_report(path: Path) -> dict:
    """GPU operations launched but not started (sampled at every 5th launch) and each one's wait, in one step."""
    with gzip.open(path) as f:
        events = json.load(f)["traceEvents"]
    gpu = {
        e["args"]["correlation"]: e
        for e in events
        if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset") and "correlation" in e.get("args", {})
    }
    pairs = sorted(
        (e["ts"], gpu[e["args"]["correlation"]]["ts"])
        for e in events
        if e.get("cat") in ("cuda_runtime", "cuda_driver") and e.get("args", {}).get("correlation") in gpu
    )
    launch = [p[0] for p in pairs]
    start = sorted(p[1] for p in pairs)
    queued = [bisect.bisect_right(launch, t) - bisect.bisect_right(start, t) for t in launch[::5]]
    lag_ms = sorted((s - t) / 1e3 for t, s in pairs)
    return {
        "gpu_operations": len(pairs),
        "queued_max": max(queued),
        "queued_median": statistics.median(queued),
        "host_lead_ms_median": statistics.median(lag_ms),
    }


# Shapes no run had, predicted before the lease (`predict`), to check `costmodel.queued_frees` blind: dense layouts
# without a pipeline and interleaved, and one non-interleaved pipeline, for which the term is zero.
BLIND = (
    dict(model="Llama-3.1-8B", seq_length=8192, num_layers=16, tp=1, micro_batch_size=2),
    dict(model="Qwen2.5-32B", seq_length=4096, num_layers=12, tp=2, micro_batch_size=2),
    dict(model="Qwen3-8B", seq_length=4096, num_layers=24, pp=2, vpp=4, micro_batch_size=2),
    dict(model="Llama-3.1-8B", seq_length=8192, num_layers=16, tp=2, pp=2, vpp=4, micro_batch_size=1),
    dict(model="Qwen3-8B", seq_length=4096, num_layers=24, pp=2, micro_batch_size=2),
)
BLIND_LAYOUTS = ROOT / "benchmarks/validation/x4_reserved_memory_blind_layouts.json"


def predict_blind() -> int:
    """Write the blind layouts and their predictions (as the runner will run them: no APEX, so unfused wgrads)."""
    from datetime import datetime, timezone

    from megatron_autotuner import __version__
    from megatron_autotuner.validate.layout import Layout
    from megatron_autotuner.validate.predict import predict

    layouts, rows = [], []
    for shape in BLIND:
        lay = Layout(**shape, num_gpus=4, global_batch_size=16, warmup_steps=3, steps=4)
        lay = lay.replace(name=f"blind {shape['model']}.L{shape['num_layers']} {lay.label}")
        layouts.append(lay.to_dict())
        rows.append({"label": lay.label, "layout_id": lay.layout_id,
                     "predicted": predict(lay, "H200", gradient_accumulation_fusion=False)})  # fmt: skip
    BLIND_LAYOUTS.write_text(json.dumps({"gpu": "H200", "layouts": layouts}, indent=1) + "\n")
    (OUT / "blind").mkdir(parents=True, exist_ok=True)
    doc = {"kind": "queued-frees-blind-prediction", "tool_version": __version__,
           "date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "rows": rows}  # fmt: skip
    (OUT / "blind/predicted.json").write_text(json.dumps(doc, indent=1) + "\n")
    for row in rows:
        b = row["predicted"]["memory_breakdown_gib"]
        print(
            f"{row['label']}: peak {row['predicted']['peak_memory_gib']:.1f} GiB, queued frees {b['queued_frees']:.1f}"
        )
    return 0


def main() -> int:
    import sys

    if sys.argv[1:] == ["predict"]:
        return predict_blind()
    rows = []
    results = {json.loads(line)["layout_id"]: json.loads(line) for line in (OUT / "results.jsonl").open()}
    for snap in sorted((OUT / "snapshots").glob("*.rank_0.pickle.gz")):
        layout_id = snap.name.removesuffix(".rank_0.pickle.gz")
        row = results[layout_id]
        measured = row["measured"]
        rows.append(
            {
                "layout_id": layout_id,
                "label": row["label"],
                "max_allocated_gib": measured["max_allocated_gib"],
                "max_reserved_gib": measured["max_reserved_gib"],
                "peak_gib": measured["peak_gib"],
                **snapshot_report(snap),
            }
        )
    traces = {}
    for trace in sorted((OUT / "queue/profiled/traces").glob("*.rank_0.json.gz")):
        traces[trace.name.removesuffix(".rank_0.json.gz")] = trace_report(trace)
    queue = json.loads((OUT / "queue/launch_queue.json").read_text())
    doc = {
        "kind": "reserved-memory-report",
        "device": queue["device"],
        "launch_queue_depth_median": queue["depth_median"],
        "histories": rows,
        "profiled_steps": traces,
    }
    (OUT / "report.json").write_text(json.dumps(doc, indent=1) + "\n")
    print(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
