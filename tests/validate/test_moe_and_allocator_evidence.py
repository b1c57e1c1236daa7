"""Committed 2x H200 evidence (benchmarks/results/validation_h200_x2, README there): GPU-bound MoE steps
(`moe_gpu/`, 2026-11-23) and the same MoE layouts plus the 15 layouts of `x2/` rerun with expandable segments in
a later lease (`expandable/`). Measured figures are re-aggregated from the per-rank records and predicted again
with the current cost model, so neither can drift from what the runs showed."""

import json
import statistics
from pathlib import Path

import pytest

from megatron_autotuner.theory.memory import EXPANDABLE_SEGMENTS_FRAGMENTATION_FRACTION
from megatron_autotuner.validate.calibration import held_out_memory, memory_allowance_from_rows
from megatron_autotuner.validate.layout import Layout
from megatron_autotuner.validate.predict import predict, predicted_allocated_gib
from megatron_autotuner.validate.results import aggregate

EVIDENCE = Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "validation_h200_x2"


def _runs(sub: str) -> list[dict]:
    """ok rows of one evidence folder with the current prediction beside the measured figures."""
    rows = []
    for layout_id, row in aggregate(EVIDENCE / sub).items():
        assert row["status"] == "ok", (sub, layout_id)
        lay = Layout.from_record(row)
        assert lay.layout_id == layout_id  # ids of earlier runs survive new layout fields
        predicted = predict(lay, "H200", gradient_accumulation_fusion=False)
        rows.append({**row, "lay": lay, "predicted": predicted})
    return rows


def _err(row: dict, key: str, measured_key: str) -> float:
    return row["predicted"][key] / row["measured"][measured_key] - 1.0


def _gaps_gib(row: dict) -> list[float]:
    return [p["max_reserved_gib"] - p["max_allocated_gib"] for p in row["per_rank"]]


def _shape(lay: Layout) -> tuple:
    return (lay.seq_length, lay.micro_batch_size, lay.tp, lay.pp, lay.cp, lay.ep, lay.recompute, lay.mode)


def test_gpu_bound_moe_steps_within_10pct_in_two_leases():
    """Qwen3-30B-A3B shapes, 4 layers, 32k tokens per micro-batch over EP2 / DP2 / TP2+SP+EP2 / PP2 / CP2+EP2,
    full recompute, forward-only: every step within 10% (-6.6% .. +8.4%) in both leases, and each layout's step
    reproduced within 3% in the second lease (host-bound runs at 4k tokens moved 9-23%: moe_long/)."""
    first = {_shape(r["lay"]): r for r in _runs("moe_gpu")}
    second = {_shape(r["lay"]): r for r in _runs("expandable/moe")}
    assert len(first) == len(second) == 8 and first.keys() == second.keys()
    assert {"train", "forward"} == {k[-1] for k in first} and "full" in {k[-2] for k in first}
    for shape, a in first.items():
        b = second[shape]
        assert b["lay"].expandable_segments and not a["lay"].expandable_segments
        for row in (a, b):
            assert abs(_err(row, "step_time_s", "step_time_s")) <= 0.10, (shape, row["measured"]["step_time_s"])
        assert b["measured"]["step_time_s"] / a["measured"]["step_time_s"] - 1 == pytest.approx(0, abs=0.03)
    for sub in ("moe_gpu", "expandable/moe"):
        summary = json.loads((EVIDENCE / sub / "summary.json").read_text())
        assert len(summary["rank_agreement"]) == 2 and all(g["predicted_best_ok"] for g in summary["rank_agreement"])


def test_expandable_segments_leave_little_reserved_unallocated():
    """Reserved-but-unallocated memory: 0.8-17.9 GiB per MoE training layout with the default allocator, at
    most 2.7 GiB with expandable segments; the cost model's allowance is the median fraction of the
    activations over the 23 expandable runs."""
    default = {_shape(r["lay"]): max(_gaps_gib(r)) for r in _runs("moe_gpu")}
    expandable = {_shape(r["lay"]): max(_gaps_gib(r)) for r in _runs("expandable/moe")}
    trained = [k for k in default if k[-1] == "train"]
    assert len(trained) == 7
    assert all(expandable[k] < default[k] for k in trained)
    assert max(default.values()) > 15 and max(expandable[k] for k in trained) < 3
    rows = [
        json.loads(line)
        for sub in ("dense", "moe")
        for line in (EVIDENCE / "expandable" / sub / "results.jsonl").read_text().splitlines()
    ]
    assert len(rows) == 23
    fraction = memory_allowance_from_rows(rows)["fragmentation_fraction"]
    assert pytest.approx(fraction, abs=5e-4) == EXPANDABLE_SEGMENTS_FRAGMENTATION_FRACTION


def test_peak_memory_with_expandable_segments():
    """Predicted peak (allocator model + memory outside it by communicator + 0.034 x activations) within 5% for
    22 of the 23 expandable layouts, all within 7%: the miss is the last pipeline stage of pp2 vpp2 (2.3 GiB
    reserved unallocated; -10.3% until the interleaved last stage's logits hole was counted, from 1-GPU memory
    stand-ins: `interleaved_logits_fragment_bytes`; -6.2% now, the rest comes with NCCL's asynchronous p2p).
    The MoE forward-only pass (3.8 GiB around 28 GiB of logits) was the second miss until
    the MoE working set left in pieces before the logits was counted (`forward_moe_fragment_bytes`, from 1x H100
    runs): -0.8% now, a check the rule was not derived from."""
    rows = _runs("expandable/dense") + _runs("expandable/moe")
    assert len(rows) == 23
    errors = {r["lay"].label: _err(r, "peak_memory_gib", "peak_gib") for r in rows}
    assert sum(abs(e) <= 0.05 for e in errors.values()) >= 22, errors
    assert abs(errors["30B-A3B s8192 mbs4 ep2 forward-only"]) < 0.05
    assert -0.07 < errors["8B s4096 pp2 vpp2"] < -0.05
    assert all(abs(e) < 0.07 for e in errors.values()), errors
    # the allocator part alone: within 0.6 GiB for every layout
    for r in rows:
        allocated = predicted_allocated_gib(r["predicted"])
        assert allocated == pytest.approx(r["measured"]["max_allocated_gib"], abs=0.6), r["lay"].label
    # held out (the allowance fitted to the other 22 runs, as `mat estimate --calibration` would use it): the
    # forward-only MoE pass keeps its working-set pieces too (-0.9%; -8.9% without them)
    for r in rows:
        r["label"] = r["lay"].label
    held = {h["label"]: h["error"] for h in held_out_memory(rows)}
    assert len(held) == 23 and abs(held["30B-A3B s8192 mbs4 ep2 forward-only"]) < 0.05
    assert sum(abs(e) <= 0.05 for e in held.values()) >= 20, held
    # the same layouts with the default allocator: fragmentation is what misses
    default = _runs("moe_gpu")
    assert statistics.median(max(_gaps_gib(r)) for r in default) > 10


def test_allocated_peak_within_5pct_for_every_run_with_either_allocator():
    """What the allocator handed out (torch.cuda.max_memory_allocated, max over ranks) against the prediction
    without its allowance: within 5% for all 46 comparable runs (15 + 8 with the default allocator, 15 + 8 with
    expandable segments). What misses the 5% target for the device peak is memory reserved but never allocated."""
    rows = [r for sub in ("x2", "moe_gpu", "expandable/dense", "expandable/moe") for r in _runs(sub)]
    assert len(rows) == 46
    for r in rows:
        allocated = predicted_allocated_gib(r["predicted"])
        assert abs(allocated / r["measured"]["max_allocated_gib"] - 1) <= 0.05, r["lay"].label
    for sub in ("x2", "moe_gpu", "expandable/dense", "expandable/moe"):
        t = json.loads((EVIDENCE / sub / "summary.json").read_text())["targets"]
        assert t["allocated_memory_within_5pct"] == t["allocated_memory_compared"] == t["peak_memory_compared"]
