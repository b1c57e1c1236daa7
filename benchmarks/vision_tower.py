"""Qwen2.5-VL-7B's vision tower on one H200: its blocks as megatron-core TE layers, predicted, then measured.

The tower's time (`costmodel.vision`) rests on two assumptions a GPU can check: a block is a decoder layer of the
tower's shape (`VisionEncoder.tower_model`) with unmasked attention, and a windowed block is that layer over
sequences of one window (64 patches: verl runs the windows as packed sequences, cu_window_seqlens in
verl/models/mcore/qwen2_5_vl/vision_model.py @ b178a3c; the testbench runs them as a batch of 64-patch sequences,
the same work). The testbench (`mat profile`) times one such layer at TP 1:
- full-attention blocks: sequences of P = 1024 and 4096 patches (images of 256 and 1024 tokens), 2 to 32 of them;
- windowed blocks: 64-patch sequences, as many as 8, 32 and 64 images of 1024 patches hold (128, 512, 1024).

    python benchmarks/vision_tower.py cases     -> the tower's ModelSpec and the case file (benchmarks/testbench/)
    python benchmarks/vision_tower.py predict   -> benchmarks/results/vision_tower_h200/predicted.json, written
                                                   (and committed) before the lease
    bash benchmarks/testbench/h200_x1_vision.sh -> on the GPU machine; unpack to benchmarks/results/vision_tower_h200
    python benchmarks/vision_tower.py           -> benchmarks/results/vision_tower_comparison.json
"""

from __future__ import annotations

import datetime as dt
import json
import sys
from pathlib import Path
from typing import Any

from measured import predict_decoder_ms, predict_empty_queue_ms  # benchmarks/measured.py

from megatron_autotuner import SCHEMA_VERSION, __version__
from megatron_autotuner.specs import load_model_spec

ROOT = Path(__file__).resolve().parent
TOWER = "benchmarks/testbench/qwen2_5_vl_7b_vision_tower.json"  # relative to the repository root, as cases name it
CASES = ROOT / "testbench/h200_x1_vision_cases.json"
LEASE = ROOT / "results/vision_tower_h200"
OUT = ROOT / "results/vision_tower_comparison.json"
GPU = "H200"
WINDOW = 64  # patches of one Qwen2.5-VL attention window: (112 px / 14 px)^2
# (patches per image, images) of the full-attention cases; the windowed cases hold the same patches as 8 x 1024 and
# 32 x 1024
FULL = ((1024, 8), (1024, 32), (4096, 2), (4096, 8), (4096, 16))
WINDOWED_PATCHES = (8 * 1024, 32 * 1024, 64 * 1024)


def tower_spec_json() -> dict[str, Any]:
    """The tower's blocks as a native ModelSpec, window off: a case's sequence is one image or one window."""
    tower = load_model_spec("Qwen2.5-VL-7B-Instruct").vision.tower_model()
    spec = tower.replace(name="Qwen2.5-VL-7B vision tower", window_size=0, window_layer_pattern=())
    return spec.to_dict()


def cases() -> list[dict[str, Any]]:
    full = [{"model": TOWER, "op": "decoder", "seq_length": p, "micro_batch_size": n} for p, n in FULL]
    windowed = [
        {"model": TOWER, "op": "decoder", "seq_length": WINDOW, "micro_batch_size": patches // WINDOW}
        for patches in WINDOWED_PATCHES
    ]
    return full + windowed


def write_cases() -> None:
    (ROOT.parent / TOWER).write_text(json.dumps(tower_spec_json(), indent=1) + "\n")
    CASES.write_text("[\n" + ",\n".join(" " + json.dumps(c) for c in cases()) + "\n]\n")
    print(f"wrote {TOWER} and {CASES.relative_to(ROOT.parent)}")


def _case_args(case: dict[str, Any]) -> tuple:
    # TP 1, no sequence parallelism, the fused SwiGLU the testbench builds (`testbench.operators`)
    return (str(ROOT.parent / case["model"]), GPU, 1, False, case["seq_length"], case["micro_batch_size"], True)


def predict() -> None:
    rows = []
    for case in cases():
        gpu_f, gpu_b = predict_decoder_ms(*_case_args(case))
        queue_f, queue_b = predict_empty_queue_ms(*_case_args(case))
        gpu_only, queue = {"fwd": gpu_f, "bwd": gpu_b}, {"fwd": queue_f, "bwd": queue_b}
        rows.append({**case, "gpu_only_ms": gpu_only, "empty_queue_ms": queue})
    LEASE.mkdir(parents=True, exist_ok=True)
    doc = {
        "schema_version": SCHEMA_VERSION,
        "tool_version": __version__,
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "gpu": GPU,
        "what": "one tower block per case at TP 1: the GPU's work (gpu_only_ms, as inside a step where the host runs "
        "ahead) and as the testbench times it from an empty launch queue with the default host floor",
        "cases": rows,
    }
    (LEASE / "predicted.json").write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {(LEASE / 'predicted.json').relative_to(ROOT.parent)}")


def _key(case: dict[str, Any]) -> tuple[int, int]:
    return case["seq_length"], case["micro_batch_size"]


def compare(lease: Path = LEASE) -> list[dict[str, Any]]:
    """Per case and phase: the testbench's median CUDA-event time against the prediction written before the lease,
    from an empty queue (as the testbench times it) and the GPU's work alone, and against today's model."""
    written = {_key(c): c for c in json.loads((lease / "predicted.json").read_text())["cases"]}
    rows = []
    for line in (lease / "collect/rank_0.jsonl").read_text().splitlines():
        rec = json.loads(line)
        if rec.get("status") != "ok":
            continue
        pre = written[_key(rec["case"])]
        now = dict(zip(("fwd", "bwd"), predict_empty_queue_ms(*_case_args(rec["case"])), strict=True))
        for phase in ("fwd", "bwd"):
            measured = rec["real"][f"{phase}_ms"]["median"]
            rows.append(
                {
                    "seq_length": rec["case"]["seq_length"],
                    "micro_batch_size": rec["case"]["micro_batch_size"],
                    "block": "windowed" if rec["case"]["seq_length"] == WINDOW else "full attention",
                    "phase": phase,
                    "measured_ms": measured,
                    "host_ms": rec["real"][f"host_{phase}_ms"]["median"],
                    "predicted_ms": pre["empty_queue_ms"][phase],
                    "error": pre["empty_queue_ms"][phase] / measured - 1.0,
                    "gpu_only_ms": pre["gpu_only_ms"][phase],
                    "gpu_only_error": pre["gpu_only_ms"][phase] / measured - 1.0,
                    "now_ms": now[phase],  # today's model, as the testbench times it
                    "now_error": now[phase] / measured - 1.0,
                }
            )
    return rows


def report() -> None:
    rows = compare()
    versions = (LEASE / "versions.txt").read_text().strip() if (LEASE / "versions.txt").exists() else None
    doc = {
        "schema_version": SCHEMA_VERSION,
        "tool_version": __version__,
        "gpu": GPU,
        "lease": str(LEASE.relative_to(ROOT.parent)),
        "versions": versions,
        "rows": rows,
    }
    OUT.write_text(json.dumps(doc, indent=1) + "\n")
    for r in rows:
        print(
            f"{r['block']:>15} s{r['seq_length']:<5} b{r['micro_batch_size']:<4} {r['phase']}: measured "
            f"{r['measured_ms']:7.2f} ms, predicted {r['predicted_ms']:7.2f} ({r['error']:+.1%}), GPU alone "
            f"{r['gpu_only_ms']:7.2f} ({r['gpu_only_error']:+.1%}); today's model {r['now_ms']:7.2f} "
            f"({r['now_error']:+.1%})"
        )


if __name__ == "__main__":
    command = sys.argv[1] if len(sys.argv) > 1 else "report"
    {"cases": write_cases, "predict": predict, "report": report}[command]()
