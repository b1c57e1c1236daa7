"""Does a packed forward pass of many growing micro-batches stop at the device (#39)?

    python benchmarks/release_limit.py predict   # before the run: the layouts and their predictions
    bash benchmarks/validation/h100_x1_release_limit.sh   # on 1 H100 (~5 min)
    python benchmarks/release_limit.py           # the report, from what the script left

`theory.memory.released_at_device_limit`: replayed without limit, the logits of hundreds of packed micro-batches,
run small to large as verl orders them, keep a new segment each; PyTorch frees its empty cached segments and
retries when cudaMalloc fails (`release_cached_blocks`), so the model stops them at the memory the plan allows the
GPU. Two forward-only passes of Qwen3-0.6B (vocabulary 151,936: large logits) over GRPO lengths (prompt 512 of
1,024, response 2,500 of 4,096 tokens) at a 16,384-token budget, with the allocator's history: 256 sequences, where
the replay stays under the device (predicted from the replay alone), and 512, where it would pass it (predicted at
the limit).
"""

from __future__ import annotations

import json
import sys
from datetime import datetime, timezone
from pathlib import Path

from megatron_autotuner import __version__
from megatron_autotuner.trace.memory_history import load_snapshot, replay_history
from megatron_autotuner.validate.layout import Layout
from megatron_autotuner.validate.predict import predict

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks/results/release_limit_h100"
LAYOUTS = ROOT / "benchmarks/validation/h100_x1_release_limit_layouts.json"
GIB = 2**30
_BASE = dict(model="Qwen3-0.6B", num_gpus=1, seq_length=5120, prompt_length=(512, 1024),
             response_length=(2500, 4096), max_token_len=16384, mode="forward", warmup_steps=1, steps=2,
             memory_history=True)  # fmt: skip


def layouts() -> list[Layout]:
    return [Layout(**_BASE, global_batch_size=n, name=f"Q3-0.6B forward {n} seq tok16k") for n in (256, 512)]


def cmd_predict() -> int:
    if (OUT / "results.jsonl").exists():  # a prediction is made before its run, never rewritten after it
        print(f"release_limit: error: {OUT.relative_to(ROOT)}: has results; its predictions stay as committed")
        return 2
    # as the runner runs it: no APEX, so unfused weight-gradient accumulation
    rows = [
        {
            "label": lay.label,
            "layout_id": lay.layout_id,
            "predicted": predict(lay, "H100-SXM", gradient_accumulation_fusion=False),
        }
        for lay in layouts()
    ]
    docs = [lay.to_dict() for lay in layouts()]
    LAYOUTS.write_text(json.dumps({"gpu": "H100-SXM", "layouts": docs}, indent=1) + "\n")
    OUT.mkdir(parents=True, exist_ok=True)
    doc = {"kind": "release-limit-prediction", "tool_version": __version__,
           "date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "rows": rows}  # fmt: skip
    (OUT / "predicted.json").write_text(json.dumps(doc, indent=1) + "\n")
    for row in rows:
        p = row["predicted"]
        print(f"{row['label']}: step {p['step_time_s']:.2f} s, peak {p['peak_memory_gib']:.1f} GiB")
    return 0


def cmd_report() -> int:
    rows = []
    for line in (OUT / "results.jsonl").open():
        run = json.loads(line)
        m, p = run.get("measured") or {}, run["predicted"]
        entry = {"label": run["label"], "layout_id": run["layout_id"], "status": run.get("status"),
                 "predicted_step_s": p["step_time_s"], "measured_step_s": m.get("step_time_s"),
                 "predicted_peak_gib": p["peak_memory_gib"], "measured_peak_gib": m.get("peak_gib"),
                 "max_allocated_gib": m.get("max_allocated_gib"),
                 "max_reserved_gib": m.get("max_reserved_gib")}  # fmt: skip
        snap = OUT / "snapshots" / f"{run['layout_id']}.rank_0.pickle.gz"
        if snap.exists():
            snapshot = load_snapshot(snap)
            hist = replay_history(snapshot)
            trace = snapshot["device_traces"][hist.device]
            entry["segment_frees"] = sum(1 for e in trace if e.get("action") == "segment_free")
            entry["history_peak_reserved_gib"] = hist.peak_reserved_bytes / GIB
        rows.append(entry)
    (OUT / "report.json").write_text(json.dumps({"kind": "release-limit-report", "rows": rows}, indent=1) + "\n")
    print(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(cmd_predict() if sys.argv[1:2] == ["predict"] else cmd_report())
