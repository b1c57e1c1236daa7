"""Multi-GPU memory on 4x H200 (round 3 of benchmarks/plan_regret.py and benchmarks/expandable_segments.py): what the
allocator holds at the peak is the memory model's sum; what the peaks miss is memory the caching allocator reserves
beyond it."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

from megatron_autotuner.validate.predict import predicted_allocated_gib

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks/results"


def _rows(folder: Path) -> list[dict]:
    return [json.loads(line) for p in sorted(folder.glob("*/results.jsonl")) for line in p.read_text().splitlines()]


def test_allocated_memory_at_the_peak_is_the_models_sum_on_every_round_3_layout():
    """18 layouts (EP, CP, TP, PP with VPP, distributed optimizer or not): the allocator's max allocated on the worst
    rank 0.16-0.63 GiB over the predicted allocated memory (under 1% of 60-116 GiB), selective recompute apart (its
    saved tensors are more than the model counts: +1.7, +2.0 and +2.8 GiB)."""
    rows = _rows(RESULTS / "plan_regret_h200_x4_r3")
    assert len(rows) == 18 and all(r["status"] == "ok" for r in rows)
    for r in rows:
        measured = max(rank["max_allocated_gib"] for rank in r["per_rank"])
        gap = measured - predicted_allocated_gib(r["predicted"])
        if r["layout"]["recompute"] == "selective":
            assert 1.0 < gap < 3.0, r["label"]
        else:
            assert 0.0 < gap < 0.7, (r["label"], gap)


def test_expandable_segments_close_the_moe_peak_but_not_the_dense_ones():
    """With PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True the MoE layout reserves 1.5 GiB beyond what it holds and
    its peak is the prediction's (-0.1%); the two Qwen3-32B layouts still reserve 13-15 GiB more (default allocator:
    16-19 GiB), which the allowance does not predict. The report is what the script makes of the runs."""
    spec = importlib.util.spec_from_file_location("expandable_segments", ROOT / "benchmarks/expandable_segments.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    rows = module.report_rows()
    committed = json.loads((RESULTS / "expandable_segments_h200_x4/report.json").read_text())["rows"]
    assert rows == committed
    by_case = {r["label"].split()[0] + " " + r["label"].split()[1]: r for r in rows}
    moe = by_case["qwen3-moe-e128-8l #8"]
    assert abs(moe["expandable"]["peak_error"]) < 0.01 and moe["expandable"]["reserved_unallocated_gib"] < 2.0
    assert moe["default"]["reserved_unallocated_gib"] > 15.0
    for case in ("qwen3-32b-16l #74", "qwen3-32b-16l #4"):
        assert by_case[case]["expandable"]["reserved_unallocated_gib"] > 12.0
        assert by_case[case]["expandable"]["peak_error"] < -0.05
