"""#40 on two H200s: what `--delay-wgrad-compute` does to the EP all-to-all overlap's step, against process noise.

    CAL=... bash benchmarks/validation/x2_delay_wgrad.sh   # host R: three interleaved fresh-process pairs
    python benchmarks/delay_wgrad.py                        # this report, from what it left

Writes benchmarks/results/delay_wgrad_h200_x2/report.json: per repeat the step predicted before the run (host D's
floors, predicted.json) and the measured median step; per pair (the same repeat with and without delayed wgrad, run
one after the other) the step change; beside them, the earlier single runs of the same two layouts
(moe_ep_overlap_h200_x2_r2 on host A, moe_r5_h200_x2 on host D, unprofiled and profiled).
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

from megatron_autotuner.launch.records import read_records

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks/results/delay_wgrad_h200_x2"
# earlier single runs: (folder, host, label without delayed wgrad, label with it)
EARLIER = (
    ("moe_ep_overlap_h200_x2_r2", "A", "mixtral L2 ep2 dp2 a2a-overlap", "mixtral L2 ep2 dp2 a2a-overlap+delay-wgrad"),
    ("moe_r5_h200_x2/more", "D", "mixtral L2 ep2 a2a-overlap", "mixtral L2 ep2 a2a-overlap+delay-wgrad"),
    ("moe_r5_h200_x2/diag", "D profiled", "mixtral L2 ep2 a2a-overlap profiled",
     "mixtral L2 ep2 a2a-overlap+delay-wgrad profiled"),
)  # fmt: skip


def repeat_rows() -> list[dict[str, Any]]:
    before = {p["layout_id"]: p["predicted"] for p in json.loads((RESULTS / "predicted.json").read_text())["layouts"]}
    return [
        {
            "label": rec["label"],
            "delay_wgrad": bool(rec["layout"].get("delay_wgrad_compute")),
            "repeat": int(rec["label"].rsplit(" ", 1)[1]),
            "predicted_before_step_s": before[rec["layout_id"]]["step_time_s"],
            "measured_step_s": rec["measured"]["step_time_s"],
            "measured_peak_gib": rec["measured"]["peak_gib"],
            "predicted_before_peak_gib": before[rec["layout_id"]]["peak_memory_gib"],
        }
        for rec in read_records(RESULTS / "results.jsonl")
    ]


def pairs(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each repeat with delayed wgrad against the same repeat without (run just before it)."""
    out = []
    for k in sorted({r["repeat"] for r in rows}):
        plain = next(r for r in rows if r["repeat"] == k and not r["delay_wgrad"])
        delayed = next(r for r in rows if r["repeat"] == k and r["delay_wgrad"])
        out.append({"repeat": k, "without_s": plain["measured_step_s"], "with_s": delayed["measured_step_s"],
                    "change": delayed["measured_step_s"] / plain["measured_step_s"] - 1.0})  # fmt: skip
    return out


def earlier() -> list[dict[str, Any]]:
    out = []
    for folder, host, plain, delayed in EARLIER:
        steps = {rec["label"]: rec["measured"]["step_time_s"]
                 for rec in read_records(ROOT / "benchmarks/results" / folder / "results.jsonl")
                 if rec.get("status") == "ok"}  # fmt: skip
        out.append({"host": host, "folder": folder, "without_s": steps[plain], "with_s": steps[delayed],
                    "change": steps[delayed] / steps[plain] - 1.0})  # fmt: skip
    return out


def main() -> int:
    rows = repeat_rows()
    report = {"schema_version": 1, "gpu": "H200", "host": "R", "rows": rows, "pairs": pairs(rows), "earlier": earlier()}
    report["median_change"] = statistics.median(p["change"] for p in report["pairs"])
    (RESULTS / "report.json").write_text(json.dumps(report, indent=1) + "\n")
    for r in rows:
        err = r["predicted_before_step_s"] / r["measured_step_s"] - 1
        print(f"{r['label']:50s} {r['measured_step_s'] * 1e3:6.1f} ms  predicted {err:+.1%}")
    for p in report["pairs"] + report["earlier"]:
        print(json.dumps(p))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
