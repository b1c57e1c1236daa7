"""The blind 4-GPU memory set (#37): ten layouts no run had, predicted before they ran on 4x H100.

    bash benchmarks/validation/x4_memory_blind.sh     # on a 4-GPU host, after the predictions were committed
    python benchmarks/memory_blind.py                 # this report, from what it left

Writes benchmarks/results/memory_blind_h100_x4/report.json: per layout the peak predicted before the run
(`predicted.json`) and measured (the highest rank's device memory in use), the highest rank's allocation against
the predicted allocation (weights, gradients, optimizer states, activations), and the reserve beyond the allocation
(reserved less max allocated, the largest over ranks) against the model's (frees awaiting the GPU plus
fragmentation).
"""

from __future__ import annotations

import json
from pathlib import Path

from megatron_autotuner.launch.records import read_records

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks/results/memory_blind_h100_x4"
ALLOCATED = ("weights", "gradients", "optimizer", "activations", "optimizer_step")


def row(predicted: dict, ran: dict) -> dict:
    b = predicted["memory_breakdown_gib"]
    ranks = ran["per_rank"]
    return {
        "label": ran["label"],
        "layout_id": ran["layout_id"],
        "predicted_peak_gib": predicted["peak_memory_gib"],
        "measured_peak_gib": ran["measured"]["peak_gib"],
        "predicted_allocated_gib": sum(b[k] for k in ALLOCATED),
        "measured_allocated_gib": max(r["max_allocated_gib"] for r in ranks),
        "predicted_reserve_gib": b["allowance"] - b["non_torch"],
        "measured_reserve_gib": max(r["max_reserved_gib"] - r["max_allocated_gib"] for r in ranks),
        "predicted_non_torch_gib": b["non_torch"],
        "measured_non_torch_gib": [r["non_torch_gib"] for r in ranks],
        "predicted_step_s": predicted["step_time_s"],
        "measured_step_s": ran["measured"]["step_time_s"],
    }


def main() -> None:
    before = {r["layout_id"]: r["predicted"] for r in json.loads((OUT / "predicted.json").read_text())["layouts"]}
    ran = read_records(OUT / "results.jsonl")
    rows = [row(before[r["layout_id"]], r) for r in ran]
    report = {"gpu": (OUT / "gpus.txt").read_text().splitlines()[0], "rows": rows}
    (OUT / "report.json").write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
