"""The 2x H200 rank-wait evidence (benchmarks/results/rank_wait_h200_x2, `python benchmarks/rank_wait.py`): round 5's
two MoE shapes on 2 GPUs, predicted before the lease."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

import pytest

from megatron_autotuner.validate.layout import Layout
from megatron_autotuner.validate.predict import predict
from tests.benchmark_scripts import load_script

RESULTS = Path(__file__).resolve().parents[2] / "benchmarks/results/rank_wait_h200_x2"


@pytest.fixture(scope="module")
def report() -> dict:
    return json.loads((RESULTS / "report.json").read_text())


def test_the_report_is_what_the_committed_runs_give(report):
    assert load_script("rank_wait").report(RESULTS) == report


def test_every_layout_was_predicted_before_its_run(report):
    assert datetime.fromisoformat(report["predicted_at"]) < datetime.fromisoformat(report["run_date"])
    layouts = json.loads((RESULTS / "predicted.json").read_text())["layouts"]
    for row in layouts:
        again = predict(Layout.from_dict(row["layout"]), "H200")
        assert again["peak_memory_gib"] == pytest.approx(row["predicted"]["peak_memory_gib"], rel=0.05), row["label"]


def test_two_ranks_keep_the_step_within_10_percent_and_the_peak_within_5(report):
    for r in report["rows"]:
        assert abs(r["predicted_step_s"] / r["measured_step_s"] - 1) <= 0.10, r["label"]
        assert abs(r["predicted_peak_gib"] / r["measured_peak_gib"] - 1) <= 0.05, r["label"]


def test_the_predicted_faster_layout_of_each_pair_ran_faster(report):
    by_model: dict[str, list[dict]] = {}
    for r in report["rows"]:
        by_model.setdefault(r["layout_id"].split(".")[0], []).append(r)
    for rows in by_model.values():
        assert min(rows, key=lambda r: r["predicted_step_s"]) is min(rows, key=lambda r: r["measured_step_s"])


def test_profiled_waits_are_bounded_by_the_profilers_own_lengthening(report):
    """A rank's wait is its time at a collective kind beyond the last-arriving rank's: never negative, and inside
    the profiled step, which the profiler only lengthens."""
    for r in report["rows"]:
        assert r["profiled_span_s"] >= r["measured_step_s"] * 0.99, r["label"]
        assert min(k["wait_total_ms"] for k in r["ranks"]) >= 0
        for k in r["ranks"]:
            assert all(v >= 0 for v in k["wait_ms"].values())
            assert k["wait_total_ms"] / 1e3 < r["profiled_span_s"], r["label"]
