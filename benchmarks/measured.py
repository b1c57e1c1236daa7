"""Predicted vs measured single-layer times on 2x H200 (benchmarks/results/testbench_h200_x2).

python benchmarks/measured.py  -> benchmarks/results/measured_comparison.json
"""

from __future__ import annotations

import json
from pathlib import Path

from megatron_autotuner import SCHEMA_VERSION, __version__
from megatron_autotuner.costmodel.measured import compare_decoder_rows

ROOT = Path(__file__).resolve().parent


def main() -> int:
    rows = json.loads((ROOT / "results/testbench_h200_x2/dense_summary.json").read_text())["rows"]
    result = compare_decoder_rows(rows, "H200")
    for r in result:
        print(
            f"{r['case_id'][:44]:44s} {r['phase']:8s} measured {r['measured_ms']:7.2f} ms "
            f"predicted {r['predicted_ms']:7.2f} ms {r['error']:+6.1%}"
        )
    (ROOT / "results/measured_comparison.json").write_text(
        json.dumps(
            {"schema_version": SCHEMA_VERSION, "tool_version": __version__, "gpu": "H200", "rows": result}, indent=1
        )
        + "\n"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
