"""The wait across ranks at each rank-synchronising collective, on 2 GPUs (and 4 once its batch has run).

    bash benchmarks/validation/x2_rank_wait.sh   # on a 2-GPU host: the layouts, predicted first
    bash benchmarks/validation/x4_rank_wait.sh   # on a 4-GPU host
    python benchmarks/rank_wait.py               # this report, from what those left

Writes benchmarks/results/rank_wait_h200_xN/report.json for each folder that holds results: per layout the step and
peak predicted before the run (`predicted.json`), the measured ones, each rank's median decoder-layer host issue time
(`Layout.host_timing`), and from every rank's profiled step the time each collective kind ran on it. A collective
ends on every rank together, once the last rank has arrived, so its time on the rank that arrived last is the
transfer and each other rank's excess over that is time spent waiting for it: the wait is a rank's kernel time for a
kind minus the smallest of the ranks'. The profiled step's span is kept beside the unprofiled step, since the
profiler's host overhead lengthens the host-paced part of a step (and with it the waits).
"""

from __future__ import annotations

import json
from pathlib import Path

from megatron_autotuner.launch.records import read_records
from megatron_autotuner.validate.results import layer_host_ms_by_rank

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("rank_wait_h200_x2", "rank_wait_h200_x4")


def _predictions(folder: Path) -> tuple[str, dict[str, dict]]:
    doc = json.loads((folder / "predicted.json").read_text())
    return doc["predicted_at"], {row["layout_id"]: row["predicted"] for row in doc["layouts"]}


def _collective_ms(summary: dict) -> dict[str, float]:
    """A rank's GPU time per collective kind in its profiled step (ms)."""
    by = summary["overlap"]["by_collective"]
    return {c["name"]: c["kernel_us"] / 1e3 for c in by}


def _ranks(folder: Path, layout_id: str) -> list[dict]:
    """Per rank: the profiled step's span, GPU idle time and collective time per kind (ms), and the wait per kind."""
    ranks = []
    for path in sorted((folder / "traces").glob(f"{layout_id}.rank_*.summary.json")):
        trace = json.loads(path.read_text())["traces"][0]
        overlap = trace["overlap"]
        ranks.append({"rank": trace["rank"], "span_ms": overlap["span_us"] / 1e3, "idle_ms": overlap["idle_us"] / 1e3,
                      "collective_ms": _collective_ms(trace)})  # fmt: skip
    kinds = {k for r in ranks for k in r["collective_ms"]}
    for r in ranks:
        r["wait_ms"] = {k: r["collective_ms"].get(k, 0.0) - min(o["collective_ms"].get(k, 0.0) for o in ranks)
                        for k in sorted(kinds)}  # fmt: skip
        r["wait_total_ms"] = sum(r["wait_ms"].values())
    return ranks


def report(folder: Path) -> dict:
    predicted_at, predicted = _predictions(folder)
    summary = json.loads((folder / "summary.json").read_text())
    rows = []
    for r in read_records(folder / "results.jsonl"):
        before = predicted[r["layout_id"]]
        ranks = _ranks(folder, r["layout_id"])
        rows.append(
            {
                "label": r["label"],
                "layout_id": r["layout_id"],
                "predicted_step_s": before["step_time_s"],
                "measured_step_s": r["measured"]["step_time_s"],
                "predicted_peak_gib": before["peak_memory_gib"],
                "measured_peak_gib": r["measured"]["peak_gib"],
                "profiled_span_s": max((k["span_ms"] for k in ranks), default=0.0) / 1e3,
                "layer_host_ms": layer_host_ms_by_rank(folder, r["layout_id"]),
                "ranks": ranks,
            }
        )
    return {"gpu": summary["gpu"], "run_date": summary["date"], "predicted_at": predicted_at, "rows": rows}


def main() -> int:
    """Write each folder's report; exit 1 when no folder had results (nothing was reported)."""
    reported = 0
    for name in FOLDERS:
        folder = ROOT / "benchmarks/results" / name
        if not (folder / "results.jsonl").exists():
            print(f"{name}: no results yet (its batch has not run)")
            continue
        doc = report(folder)
        (folder / "report.json").write_text(json.dumps(doc, indent=1) + "\n")
        reported += 1
        for row in doc["rows"]:
            err = row["predicted_step_s"] / row["measured_step_s"] - 1
            waits = " / ".join(f"{k['wait_total_ms']:.0f}" for k in row["ranks"])
            print(f"{name}: {row['label']}: step {err:+.1%}, profiled span {row['profiled_span_s']:.3f} s, "
                  f"wait per rank {waits} ms")  # fmt: skip
    return 0 if reported else 1


if __name__ == "__main__":
    raise SystemExit(main())
