"""Megatron-LM's --manual-gc on one H200: does turning Python's automatic garbage collector off speed up the host?

NVIDIA's published MoE rows run with the collector off (Megatron-Bridge's performance runs set manual_gc True,
interval 100, scripts/performance/utils/overrides.py @ 067f987df), where the cost model's host floors were measured
with it on (the testbench and the validate runner, Python's default). Where the model's step is host-paced those rows
ran 14-31% faster than predicted (benchmarks/results/published_modern.json), so the collector was a candidate. Pair
by pair, the same layout with the collector on and off (`Layout.manual_gc`), in both orders
(validation/h200_x1_manual_gc.sh):

    python benchmarks/manual_gc.py     # results/manual_gc_h200/comparison.json

It is not the cause: off, no host-bound step ran faster (+0.1% to +12.4% slower, the spread of the machine's drift
between runs: the same dense layout took 1.92 s as the first run of the lease, 2.10-2.12 s after), and the GPU-bound
pairs ran the same. The cost model keeps `--manual-gc` as a flag that does not change the step
(`specs.megatron_args`).
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent
LEASE = ROOT / "results/manual_gc_h200"
BATCHES = {"collector on first": LEASE / "results.jsonl", "collector off first": LEASE / "reversed/results.jsonl"}
SUFFIXES = (" 2nd", " manual-gc", " auto-gc")


def _case(label: str) -> str:
    for suffix in SUFFIXES:
        label = label.removesuffix(suffix)
    return label


def pairs() -> list[dict[str, Any]]:
    """Per batch and case: the measured step (median) and the prediction made before, collector on and off."""
    out = []
    for order, path in BATCHES.items():
        by_case: dict[str, dict[str, Any]] = {}
        for line in path.read_text().splitlines():
            rec = json.loads(line)
            if rec["status"] != "ok":
                continue
            side = "off" if rec["layout"]["manual_gc"] else "on"
            entry = by_case.setdefault(_case(rec["label"]), {"order": order, "case": _case(rec["label"])})
            entry[f"step_s_collector_{side}"] = rec["measured"]["step_time_s"]
            entry["predicted_step_s"] = rec["predicted"]["step_time_s"]
        for entry in by_case.values():
            entry["off_over_on"] = entry["step_s_collector_off"] / entry["step_s_collector_on"] - 1.0
            out.append(entry)
    return out


def report() -> dict[str, Any]:
    rows = pairs()
    host_paced = [r for r in rows if r["predicted_step_s"] > 1.2 * r["step_s_collector_on"]]
    by_case: dict[str, list[float]] = {}
    for r in rows:
        by_case.setdefault(r["case"], []).append(r["off_over_on"])
    doc = {
        "gpu": "H200",
        "versions": json.loads((LEASE / "runs/rank_0.jsonl").read_text().splitlines()[0])["env"],
        "rows": rows,
        # both orders averaged: a drift of the machine over the runs cancels
        "off_over_on_by_case": {case: statistics.mean(v) for case, v in by_case.items()},
        "fastest_off_over_on": min(r["off_over_on"] for r in rows),
        "host_paced_cases": sorted({r["case"] for r in host_paced}),
    }
    (LEASE / "comparison.json").write_text(json.dumps(doc, indent=1) + "\n")
    return doc


if __name__ == "__main__":
    result = report()
    for r in result["rows"]:
        on_s, off_s = r["step_s_collector_on"], r["step_s_collector_off"]
        print(f"{r['order']:20} {r['case']:32} on {on_s:.3f} s  off {off_s:.3f} s  {r['off_over_on']:+.1%}")
    print("both orders:", {k: f"{v:+.1%}" for k, v in result["off_over_on_by_case"].items()})
