"""Host-bound small dense models on three H100 leases, eager and CUDA-graphed (issue #27; docs/accuracy.md,
"Small dense models"). Today's model re-predicts the committed layouts; the predictions made before each run are
in each folder's results.jsonl."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from megatron_autotuner.validate.layout import Layout
from megatron_autotuner.validate.predict import predict

RESULTS = Path(__file__).resolve().parents[2] / "benchmarks/results/validation_h100_x1"


def _rows(folder: str) -> list[dict]:
    return [json.loads(line) for line in (RESULTS / folder / "results.jsonl").read_text().splitlines()]


def _error_now(row: dict) -> float:
    lay = Layout.from_dict(row["layout"])
    now = predict(lay, "H100-SXM", gradient_accumulation_fusion=row.get("gradient_accumulation_fusion", False))
    return now["step_time_s"] / row["measured"]["step_time_s"] - 1


@pytest.fixture(scope="module")
def graphed_lease() -> list[dict]:
    rows = _rows("graphed_training")
    assert len(rows) == 18 and all(r["status"] == "ok" for r in rows)
    assert all(r["env"]["device"].startswith("NVIDIA H100") for r in rows)
    return rows


def test_graphed_training_captures_now_and_is_predicted_within_6pct(graphed_lease):
    """Every TE-graphed training layout failed at capture on the first lease (DDP's AccumulateGrad nodes on the
    legacy stream); built on a stream of its own, all nine ran, GPU-bound, within 6% and peak memory within 5%."""
    first = [r for r in _rows("host_bound") if "te-graphs" in r["label"] and r["layout"]["mode"] == "train"]
    assert first and all("during capture" in r["error"] for r in first)
    diag = [r for r in _rows("host_diagnostics/graphs") if r["status"] != "ok"]
    assert diag and all("legacy stream depend on a capturing" in r["traceback"] for r in diag)
    graphed = [r for r in graphed_lease if "te-graphs" in r["label"]]
    assert len(graphed) == 9
    for r in graphed:
        assert abs(_error_now(r)) <= 0.06, r["label"]
        assert abs(r["error_rel"]["peak_memory"]) <= 0.05, r["label"]


def test_the_launch_queue_ramp_halves_the_eager_training_miss(graphed_lease):
    """Before the runs (host and GPU simply overlapping) the eager layouts came out 1-27% short, median 16.7%;
    with the host-issue ramp the median is under 10% and no layout moves the wrong way."""
    eager = [r for r in graphed_lease if "eager" in r["label"]]
    before = [r["predicted"]["step_time_s"] / r["measured"]["step_time_s"] - 1 for r in eager]
    now = [_error_now(r) for r in eager]
    assert statistics.median(abs(e) for e in before) > 0.15
    assert statistics.median(abs(e) for e in now) < 0.10
    assert all(abs(n) <= abs(b) + 1e-9 for n, b in zip(now, before, strict=True))


def test_forward_only_small_models_on_the_first_lease():
    """Eager forward-only passes (no-grad host, the output layer's GPU work after the host's last layer, the host's
    work outside the layers): Qwen3-0.6B within 10%; Qwen3-1.7B.L14 at micro-batch 1 16% over, this lease's host
    ran faster than the default (it is the fastest of five leases: `test_host_probe_evidence`)."""
    fwd = [r for r in _rows("host_bound") if r["status"] == "ok" and r["layout"]["mode"] == "forward"]
    assert len(fwd) == 7
    for r in fwd:
        bound = 0.20 if r["label"] == "Q3-1.7B.L14 mbs1 forward eager" else 0.10
        assert abs(_error_now(r)) <= bound, r["label"]


def test_the_host_pace_differs_between_leases_where_graphs_do_not():
    """Why eager small models cannot be held to 10% by one floor: the same eager layout took 52% longer on
    another lease, while graphed layouts and GPU-bound eager ones stay within a few % of the model."""
    by_lease = {f: {r["label"]: r for r in _rows(f) if r["status"] == "ok"} for f in ("host_bound", "graphed_training")}
    label = "Q3-0.6B mbs1 train eager"
    slow, fast = (by_lease[f][label]["measured"]["step_time_s"] for f in ("graphed_training", "host_bound"))
    assert slow / fast > 1.4
    gpu_bound = by_lease["graphed_training"]["Q3-4B.L8 mbs4 train eager"]
    assert abs(_error_now(gpu_bound)) < 0.02


def test_forward_only_predicted_before_the_runs_on_a_fourth_lease():
    """Predicted before the runs by the launch-queue / no-grad host model: every graphed forward within 10%, the
    eager ones within 15% (6 of 9 within 10%: this lease's host ran 0.6B at micro-batch 4 faster, 1.7B / 4B at
    micro-batch 1 slower, than the floor)."""
    rows = [r for r in _rows("small_forward") if r["layout"]["mode"] == "forward"]
    assert len(rows) == 18 and all(r["status"] == "ok" for r in rows)
    before = {r["label"]: r["predicted"]["step_time_s"] / r["measured"]["step_time_s"] - 1 for r in rows}
    graphed = [e for label, e in before.items() if "te-graphs" in label]
    eager = [e for label, e in before.items() if "eager" in label]
    assert len(graphed) == len(eager) == 9
    assert all(abs(e) <= 0.10 for e in graphed)
    assert all(abs(e) <= 0.15 for e in eager) and sum(abs(e) <= 0.10 for e in eager) >= 6
    # today's model, which adds the host's work outside the layers: graphed as before, eager still within 15%
    now = {r["label"]: _error_now(r) for r in rows}
    assert all(abs(now[label] - before[label]) < 1e-6 for label in now if "te-graphs" in label)
    assert all(abs(e) <= 0.15 for label, e in now.items() if "eager" in label)
