"""Predicted vs published TFLOP/s per GPU for every row of published_runs.csv.

    python benchmarks/published.py [CSV] [--out benchmarks/results/published_comparison.json]

Defaults come from measurements and physics (`costmodel.defaults`), never fitted to these rows;
settings a row leaves open follow `costmodel.published`.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from megatron_autotuner import SCHEMA_VERSION, __version__
from megatron_autotuner.costmodel.published import compare_published, summary

ROOT = Path(__file__).resolve().parent.parent


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("csv", nargs="?", default=str(ROOT / "tests/fixtures/published_runs.csv"))
    parser.add_argument("--out", default=str(ROOT / "benchmarks/results/published_comparison.json"))
    args = parser.parse_args()
    results = compare_published(args.csv)
    head = ("model", "gpus", "layout", "convention", "published", "predicted", "error")
    print("{:16s} {:>5s} {:38s} {:24s} {:>9s} {:>9s} {:>7s}".format(*head))
    for r in results:
        print(
            f"{r.model:16s} {r.num_gpus:5d} {r.layout:38s} {r.convention:24s} {r.published_tflops:9.1f} "
            f"{r.predicted_tflops:9.1f} {r.error:+7.1%}"
        )
    s = summary(results)
    print(f"median |error| {s['median_abs_error']:.1%}, max |error| {s['max_abs_error']:.1%}")
    Path(args.out).write_text(
        json.dumps(
            {
                "schema_version": SCHEMA_VERSION,
                "tool_version": __version__,
                "rows": [r.to_dict() for r in results],
                "summary": s,
            },
            indent=1,
        )
        + "\n"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
