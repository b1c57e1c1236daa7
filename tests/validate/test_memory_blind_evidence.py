"""The blind 4-GPU memory set on 4x H100 (benchmarks/results/memory_blind_h100_x4, `python benchmarks/memory_blind.py`):
predicted before the run; allocations hold, the reserve beyond them does not (a known miss of #37's memory bar)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from megatron_autotuner.validate.layout import Layout
from megatron_autotuner.validate.predict import predict

RESULTS = Path(__file__).resolve().parents[2] / "benchmarks/results/memory_blind_h100_x4"


@pytest.fixture(scope="module")
def rows() -> list[dict]:
    return json.loads((RESULTS / "report.json").read_text())["rows"]


def test_the_committed_predictions_are_the_runs_own():
    before = {r["layout_id"]: r["predicted"] for r in json.loads((RESULTS / "predicted.json").read_text())["layouts"]}
    for line in (RESULTS / "results.jsonl").open():
        ran = json.loads(line)
        assert ran["predicted"]["peak_memory_gib"] == pytest.approx(before[ran["layout_id"]]["peak_memory_gib"])


def test_the_set_covers_what_the_memory_bar_names():
    layouts = [Layout.from_record(json.loads(line)) for line in (RESULTS / "results.jsonl").open()]
    assert any(lay.tp == 4 for lay in layouts)
    assert any(lay.pp > 1 and lay.parallel().vpp and not lay.pipeline_layout for lay in layouts)
    assert sum(bool(lay.pipeline_layout) for lay in layouts) >= 2  # uneven pipelines
    assert any(lay.cp > 1 for lay in layouts) and any(lay.ep > 1 for lay in layouts)
    assert any(lay.tp == lay.pp == lay.cp == lay.ep == 1 for lay in layouts)  # DP only


def test_every_allocation_is_within_5pct(rows):
    for r in rows:
        assert r["predicted_allocated_gib"] / r["measured_allocated_gib"] - 1 == pytest.approx(0, abs=0.05), r["label"]


def test_known_miss_the_reserve_beyond_the_allocation_is_under_predicted(rows):
    """4 of 10 peaks within 5%, all under by at most 8.4%; the reserve is 0.5-3.7 GiB over the model's on each."""
    errors = [r["predicted_peak_gib"] / r["measured_peak_gib"] - 1 for r in rows]
    assert sum(abs(e) <= 0.05 for e in errors) == 4
    assert all(-0.085 < e <= 0.001 for e in errors)
    assert all(0.4 < r["measured_reserve_gib"] - r["predicted_reserve_gib"] < 3.8 for r in rows)


def test_todays_model_stays_within_10pct_of_every_measured_peak():
    """A guard for later model changes: today's prediction of each blind peak within 10% (the pre-run ones were
    0-8.4% under)."""
    for line in (RESULTS / "results.jsonl").open():
        ran = json.loads(line)
        now = predict(Layout.from_record(ran), "H100-SXM")["peak_memory_gib"]
        assert now / ran["measured"]["peak_gib"] - 1 == pytest.approx(0, abs=0.10), ran["label"]
