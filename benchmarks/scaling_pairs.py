"""What does a second and fourth GPU add to a step that the cost model misses? Pairs of layouts with the same work per
GPU, on 1-2 GPUs and on 4 GPUs of one host.

    python benchmarks/scaling_pairs.py predict   # before a lease: the layouts and their predictions
    bash benchmarks/validation/x4_scaling_pairs.sh  # on 4 GPUs (H100 or H200)
    python benchmarks/scaling_pairs.py report    # after it: per pair, measured and predicted cost of scaling out

Every 4-GPU layout of the ranking benchmark (`plan_regret.py`) ran 6-11% slower than predicted, on dense models with
plain data parallelism too, while one GPU is within a few percent. A pair holds the micro-batch shape and the number
of micro-batches per rank fixed and changes only the group sizes, so the step difference inside a pair is what the
extra ranks cost: the data-parallel gradient reduce-scatter / parameter all-gather, the TP / CP collectives, and
anything that runs slower when four GPUs of one host work at once. The report sets the measured difference beside
the predicted one, and the 1-GPU step beside its own prediction (the host's single-GPU calibration).
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from megatron_autotuner import __version__
from megatron_autotuner.validate.layout import Layout
from megatron_autotuner.validate.predict import predict

ROOT = Path(__file__).resolve().parents[1]
VALIDATION = ROOT / "benchmarks" / "validation"
RESULTS = ROOT / "benchmarks" / "results"
GPUS = {"H100": "H100-SXM", "H200": "H200"}
WARMUP_STEPS = 3
STEPS = 5
# reduced depth, so that the 1-GPU side (optimizer states unsharded) fits an 80 GiB H100 as well as an H200
QWEN = {"model": "Qwen3-4B", "num_layers": 12, "seq_length": 4096}
LLAMA = {"model": "Llama-3.1-8B", "num_layers": 8, "seq_length": 8192}
MOE = {"model": "benchmarks/validation/models/Qwen3-30B-A3B-E64.json", "num_layers": 4, "seq_length": 4096}
# the layouts by name; the 4-GPU Qwen3-4B one is the ranking benchmark's Qwen3-4B #1 at a third of its depth
LAYOUTS: dict[str, dict[str, Any]] = {
    "qwen3-4b 1 gpu mbs4 x1": {**QWEN, "micro_batch_size": 4, "global_batch_size": 4, "profile": True},
    "qwen3-4b dp2 mbs4 x1": {**QWEN, "num_gpus": 2, "micro_batch_size": 4, "global_batch_size": 8},
    "qwen3-4b dp4 mbs4 x1": {**QWEN, "num_gpus": 4, "micro_batch_size": 4, "global_batch_size": 16, "profile": True},
    "qwen3-4b 1 gpu mbs4 x4": {**QWEN, "micro_batch_size": 4, "global_batch_size": 16},
    "qwen3-4b dp4 mbs4 x4": {**QWEN, "num_gpus": 4, "micro_batch_size": 4, "global_batch_size": 64},
    "qwen3-4b tp2 mbs8 x1": {**QWEN, "num_gpus": 2, "tp": 2, "sequence_parallel": False, "micro_batch_size": 8},
    "qwen3-4b tp2 dp2 mbs8 x1": {
        **QWEN,
        "num_gpus": 4,
        "tp": 2,
        "sequence_parallel": False,
        "micro_batch_size": 8,
        "global_batch_size": 16,
        "profile": True,
    },
    "qwen3-4b cp2 mbs8 x1": {**QWEN, "num_gpus": 2, "cp": 2, "micro_batch_size": 8},
    "qwen3-4b cp2 dp2 mbs8 x1": {
        **QWEN,
        "num_gpus": 4,
        "cp": 2,
        "micro_batch_size": 8,
        "global_batch_size": 16,
        "profile": True,
    },
    "llama31-8b 1 gpu mbs1 x2": {**LLAMA, "micro_batch_size": 1, "global_batch_size": 2},
    "llama31-8b dp4 mbs1 x2": {**LLAMA, "num_gpus": 4, "micro_batch_size": 1, "global_batch_size": 8},
    "moe-e64 1 gpu mbs4 x1": {**MOE, "micro_batch_size": 4, "global_batch_size": 4},
    "moe-e64 dp4 mbs4 x1": {**MOE, "num_gpus": 4, "micro_batch_size": 4, "global_batch_size": 16},
    "moe-e64 dp4 ep4 mbs4 x1": {
        **MOE,
        "num_gpus": 4,
        "ep": 4,
        "micro_batch_size": 4,
        "global_batch_size": 16,
        "profile": True,
    },
}
# (pair, smaller layout, larger layout): the same micro-batches per rank; only the group sizes change
PAIRS: list[tuple[str, str, str]] = [
    ("qwen3-4b dp4, 1 micro-batch", "qwen3-4b 1 gpu mbs4 x1", "qwen3-4b dp4 mbs4 x1"),
    ("qwen3-4b dp2, 1 micro-batch", "qwen3-4b 1 gpu mbs4 x1", "qwen3-4b dp2 mbs4 x1"),
    ("qwen3-4b dp4, 4 micro-batches", "qwen3-4b 1 gpu mbs4 x4", "qwen3-4b dp4 mbs4 x4"),
    ("qwen3-4b tp2, + dp2", "qwen3-4b tp2 mbs8 x1", "qwen3-4b tp2 dp2 mbs8 x1"),
    ("qwen3-4b cp2, + dp2", "qwen3-4b cp2 mbs8 x1", "qwen3-4b cp2 dp2 mbs8 x1"),
    ("llama31-8b dp4, 2 micro-batches", "llama31-8b 1 gpu mbs1 x2", "llama31-8b dp4 mbs1 x2"),
    ("moe-e64 dp4, 1 micro-batch", "moe-e64 1 gpu mbs4 x1", "moe-e64 dp4 mbs4 x1"),
    ("moe-e64 dp4 ep4, 1 micro-batch", "moe-e64 1 gpu mbs4 x1", "moe-e64 dp4 ep4 mbs4 x1"),
    ("moe-e64 ep4 vs dp4 alone", "moe-e64 dp4 mbs4 x1", "moe-e64 dp4 ep4 mbs4 x1"),
]


def layout_of(name: str, fields: dict[str, Any]) -> Layout:
    """A runner layout under the runner's defaults (no gradient-accumulation fusion: APEX is absent on the GPU
    machines, see plan_regret.runner_options)."""
    return Layout(
        **fields,
        warmup_steps=WARMUP_STEPS,
        steps=STEPS,
        gradient_accumulation_fusion=False,
        name=name,
    )


def layouts() -> list[Layout]:
    return [layout_of(name, fields) for name, fields in LAYOUTS.items()]


def cmd_predict() -> int:
    for kind, gpu_name in GPUS.items():
        if any((RESULTS / f"scaling_pairs_{kind.lower()}_x4").glob("results.jsonl")):
            print(f"{kind}: runs exist, so its predictions made before them stay as they are")
            continue
        rows = [{"name": lay.name, "label": lay.label, "predicted": predict(lay, gpu_name)} for lay in layouts()]
        (VALIDATION / f"x4_scaling_pairs_{kind.lower()}_layouts.json").write_text(
            json.dumps({"gpu": gpu_name, "layouts": [lay.to_dict() for lay in layouts()]}, indent=1) + "\n"
        )
        doc = {
            "kind": "scaling-pairs-prediction",
            "tool_version": __version__,
            "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "gpu": gpu_name,
            "rows": rows,
        }
        out = RESULTS / f"scaling_pairs_{kind.lower()}_x4" / "predicted.json"
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(doc, indent=1) + "\n")
        for row in rows:
            p = row["predicted"]
            print(f"{kind} {row['label'][:70]:70s} {p['step_time_s']:7.3f} s {p['peak_memory_gib']:6.1f} GiB")
    return 0


def _measured(kind_dir: Path) -> dict[str, dict[str, Any]]:
    """Measured rows by label (the last row of a label wins: a resumed layout is appended again)."""
    rows: dict[str, dict[str, Any]] = {}
    path = kind_dir / "results.jsonl"
    if path.exists():
        for line in path.read_text().splitlines():
            row = json.loads(line)
            rows[row["label"]] = row.get("measured") or {}
    return rows


def side_report(row: dict[str, Any], measured: dict[str, dict[str, Any]], gpu: str) -> dict[str, Any]:
    """One layout: the prediction stored before the run, today's model's (after it), and the measurement."""
    m = measured.get(row["label"], {})
    return {
        "label": row["label"],
        "predicted_step_time_s": row["predicted"].get("step_time_s"),
        "predicted_now_step_time_s": predict(layout_of(row["name"], LAYOUTS[row["name"]]), gpu).get("step_time_s"),
        "measured_step_time_s": m.get("step_time_s"),
        "predicted_peak_memory_gib": row["predicted"].get("peak_memory_gib"),
        "measured_peak_memory_gib": m.get("peak_gib"),
    }


def pair_report(pair: str, small: dict[str, Any], large: dict[str, Any]) -> dict[str, Any]:
    """One pair: each side's predicted and measured step and peak, and the cost of scaling out (larger minus
    smaller step), predicted and measured."""
    out: dict[str, Any] = {"pair": pair, "small": small, "large": large}
    if small["measured_step_time_s"] and large["measured_step_time_s"]:
        out["measured_scale_out_s"] = large["measured_step_time_s"] - small["measured_step_time_s"]
        out["predicted_scale_out_s"] = large["predicted_step_time_s"] - small["predicted_step_time_s"]
        out["predicted_now_scale_out_s"] = large["predicted_now_step_time_s"] - small["predicted_now_step_time_s"]
    return out


def cmd_report() -> int:
    doc: dict[str, Any] = {"kind": "scaling-pairs", "tool_version": __version__, "hosts": []}
    for kind_dir in sorted(RESULTS.glob("scaling_pairs_*_x4")):
        predicted = json.loads((kind_dir / "predicted.json").read_text())
        measured = _measured(kind_dir)
        if not measured:
            continue
        sides = {row["name"]: side_report(row, measured, predicted["gpu"]) for row in predicted["rows"]}
        pairs = [pair_report(pair, sides[small], sides[large]) for pair, small, large in PAIRS]
        doc["hosts"].append(
            {"folder": kind_dir.name, "gpu": predicted["gpu"], "predicted_at": predicted["date"], "pairs": pairs}
        )
    (RESULTS / "scaling_pairs.json").write_text(json.dumps(doc, indent=1) + "\n")
    for host in doc["hosts"]:
        print(host["folder"])
        for p in host["pairs"]:
            s, lg = p["small"], p["large"]
            print(
                f"  {p['pair']:32s} small {s['measured_step_time_s'] or 0:.3f}/{s['predicted_step_time_s']:.3f} s"
                f"  large {lg['measured_step_time_s'] or 0:.3f}/{lg['predicted_step_time_s']:.3f} s"
                f"  scale-out measured {p.get('measured_scale_out_s', float('nan')) * 1e3:+.0f} ms"
                f" predicted {p.get('predicted_scale_out_s', float('nan')) * 1e3:+.0f} ms"
                f" (today {p.get('predicted_now_scale_out_s', float('nan')) * 1e3:+.0f} ms)"
            )
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=("predict", "report"))
    args = parser.parse_args(argv)
    return cmd_predict() if args.command == "predict" else cmd_report()


if __name__ == "__main__":
    sys.exit(main())
