"""Do multi-GPU peaks come within 5% when the caching allocator grows segments in place?

    python benchmarks/expandable_segments.py predict   # before a lease: the layouts and their predictions
    bash benchmarks/validation/x4_expandable_segments.sh   # on a 4-GPU host
    python benchmarks/expandable_segments.py report    # after it

Round 3 of the ranking benchmark (plan_regret_h200_x4_r3) allocated within 0.6 GiB of the prediction on every layout
without selective recompute, but reserved 8.6-19.2 GiB more than it held at the peak, where the model's default
allocator allowance is 0.18 x the activations (`theory.memory.MemoryAllowance`). Megatron-Bridge's performance
scripts run with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True, for which the allowance is 0.034 x the activations
(measured on 2x H200). The three round-3 layouts that missed their peak most run again here with
`Layout.expandable_segments` (the runner sets the allocator option), predicted before the lease.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path

from megatron_autotuner import __version__
from megatron_autotuner.validate.layout import Layout
from megatron_autotuner.validate.predict import predict

ROOT = Path(__file__).resolve().parents[1]
ROUND = ROOT / "benchmarks/results/plan_regret_h200_x4_r3"
OUT = ROOT / "benchmarks/results/expandable_segments_h200_x4"
LAYOUTS = ROOT / "benchmarks/validation/x4_expandable_segments_layouts.json"
# the round-3 layouts whose peaks were furthest under (labels as run)
PICKED = (
    "qwen3-32b-16l #74 tp2 pp2 vpp8 cp1 dp1 nosp mbs2 rc-none",
    "qwen3-32b-16l #4 tp1 pp1 cp1 dp4 nosp mbs2 rc-none",
    "qwen3-moe-e128-8l #8 tp1 pp1 cp1 dp4 nosp mbs8 rc-none",
)


def _round_rows() -> dict[str, dict]:
    rows = {}
    for path in ROUND.glob("*/results.jsonl"):
        for line in path.read_text().splitlines():
            row = json.loads(line)
            rows[row["label"]] = row
    return rows


def cmd_predict() -> int:
    rows = _round_rows()
    layouts, predicted = [], []
    for label in PICKED:
        base = Layout.from_dict(rows[label]["layout"])
        lay = replace(base, expandable_segments=True, name=f"{label} expandable")
        layouts.append(lay.to_dict())
        predicted.append({"label": lay.label, "default_allocator_label": label, "predicted": predict(lay, "H200")})
    LAYOUTS.write_text(json.dumps({"gpu": "H200", "layouts": layouts}, indent=1) + "\n")
    OUT.mkdir(parents=True, exist_ok=True)
    doc = {"kind": "expandable-segments-prediction", "tool_version": __version__,
           "date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "rows": predicted}  # fmt: skip
    (OUT / "predicted.json").write_text(json.dumps(doc, indent=1) + "\n")
    for row in predicted:
        print(f"{row['label']:70s} {row['predicted']['peak_memory_gib']:6.1f} GiB")
    return 0


def report_rows() -> list[dict]:
    """Per layout: peak predicted before the run and measured, with the default allocator (round 3) and with
    expandable segments; reserved-unallocated at the peak (max over ranks)."""
    predicted = json.loads((OUT / "predicted.json").read_text())["rows"]
    runs = {}
    for line in (OUT / "runs/results.jsonl").read_text().splitlines():
        row = json.loads(line)
        runs[row["label"]] = row
    default = _round_rows()
    out = []
    for p in predicted:
        run, before = runs.get(p["label"]), default[p["default_allocator_label"]]
        entry = {"label": p["default_allocator_label"]}
        for key, r, pred in (("default", before, before["predicted"]), ("expandable", run, p["predicted"])):
            if not r or r.get("status") != "ok":
                entry[key] = None
                continue
            ranks = r["per_rank"]
            peak = max(x["device_used_gib"] for x in ranks)
            entry[key] = {
                "predicted_peak_gib": pred["peak_memory_gib"],
                "measured_peak_gib": peak,
                "peak_error": pred["peak_memory_gib"] / peak - 1.0,
                "reserved_unallocated_gib": max(x["max_reserved_gib"] - x["max_allocated_gib"] for x in ranks),
                "step_time_s": max(x["step_time_s"] for x in ranks),
            }
        out.append(entry)
    return out


def cmd_report() -> int:
    rows = report_rows()
    (OUT / "report.json").write_text(json.dumps({"kind": "expandable-segments-report", "rows": rows}, indent=1) + "\n")
    for r in rows:
        cells = []
        for key in ("default", "expandable"):
            e = r[key]
            if e is None:
                cells.append(f"{key} not run")
                continue
            unallocated, step = e["reserved_unallocated_gib"], e["step_time_s"]
            cells.append(f"{key} peak {e['peak_error']:+.1%} (unallocated {unallocated:.1f} GiB, step {step:.3f} s)")
        print(f"{r['label']:60s} " + " | ".join(cells))
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=("predict", "report"))
    return cmd_predict() if parser.parse_args().command == "predict" else cmd_report()


if __name__ == "__main__":
    raise SystemExit(main())
