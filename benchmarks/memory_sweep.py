"""Today's peak-memory prediction (default floors) against every committed multi-GPU training run's measured peak.

    python benchmarks/memory_sweep.py [--json OUT]

Reads every benchmarks/results/**/results.jsonl; prints how many peaks are within 5% and the median errors, and with
--json writes {run: [predicted GiB, measured GiB, label]} so two commits' models can be compared run by run (the
queued-frees change of 64cac8d against its parent 055d322 moved 16 of 314 peaks, all closer; docs/accuracy.md).
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from megatron_autotuner.errors import ConfigError
from megatron_autotuner.launch.records import read_records
from megatron_autotuner.validate.layout import Layout
from megatron_autotuner.validate.predict import predict

ROOT = Path(__file__).resolve().parents[1]
GPU_PRESETS = {"H100": "H100-SXM", "H200": "H200"}


def _comparable(rec: dict) -> bool:
    m, lay = rec.get("measured") or {}, rec.get("layout") or {}
    return (
        rec.get("status") == "ok"
        and bool(m.get("peak_gib"))
        and m.get("memory_comparable", True)
        and not m.get("stand_in")
        and (lay.get("num_gpus") or 1) > 1
        and lay.get("mode", "train") == "train"
    )


def sweep() -> dict[str, list]:
    out: dict[str, list] = {}
    for path in sorted((ROOT / "benchmarks/results").glob("**/results.jsonl")):
        for rec in filter(_comparable, read_records(path)):
            device = (rec.get("env") or {}).get("device", "H200").removeprefix("NVIDIA ").split(" ")[0]
            try:
                predicted = predict(Layout.from_record(rec), GPU_PRESETS.get(device, device))["peak_memory_gib"]
            except ConfigError:  # a layout today's model refuses (a record of a run it no longer takes)
                continue
            rel = path.relative_to(ROOT / "benchmarks/results").parent
            out[f"{rel}:{rec['layout_id']}"] = [predicted, rec["measured"]["peak_gib"], rec["label"]]
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", metavar="OUT", help="write {run: [predicted GiB, measured GiB, label]} here")
    args = ap.parse_args()
    runs = sweep()
    errors = [p / m - 1 for p, m, _ in runs.values()]
    within = sum(abs(e) <= 0.05 for e in errors)
    median_abs, median = statistics.median(abs(e) for e in errors), statistics.median(errors)
    print(f"{len(errors)} runs; peak within 5%: {within}; median |error| {median_abs:.1%}; signed median {median:+.1%}")
    if args.json:
        Path(args.json).write_text(json.dumps(runs, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
