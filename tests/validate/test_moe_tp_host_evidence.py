"""The 2x H200 evidence on an eager MoE block's host at TP 2 and expert-TP 2 (benchmarks/results/moe_tp_host_h200_x2,
`python benchmarks/moe_tp_host.py`): what the model gets right, and the misses it keeps."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from megatron_autotuner.costmodel.calibration import load_calibration
from megatron_autotuner.validate.layout import Layout
from megatron_autotuner.validate.predict import predict

RESULTS = Path(__file__).resolve().parents[2] / "benchmarks/results/moe_tp_host_h200_x2"


@pytest.fixture(scope="module")
def report() -> dict:
    return json.loads((RESULTS / "report.json").read_text())


@pytest.fixture(scope="module")
def rows(report) -> dict[str, dict]:
    return {r["label"].removeprefix("moe host "): r for r in report["moe"]}


def test_the_runs_own_predictions_are_the_model_with_this_hosts_floor():
    """The prediction each run stored is today's model with the floor the machine measured just before."""
    cal = load_calibration(RESULTS / "moe/host_floor/host_floor.calibration.json")
    for line in (RESULTS / "moe/results.jsonl").open():
        row = json.loads(line)
        now = predict(Layout.from_record(row), "H200", calibration=cal)["step_time_s"]
        assert now == pytest.approx(row["predicted"]["step_time_s"], rel=0.02), row["label"]


def test_this_hosts_floor_paces_a_dp_layout_of_the_same_local_experts(rows):
    assert rows["dp2 e128"]["predicted_measured_floor_s"] / rows["dp2 e128"]["measured_s"] - 1 == pytest.approx(
        0, abs=0.02
    )


def test_a_layers_host_time_does_not_shrink_with_tp(rows):
    """Same 128 local experts, TP 1 and TP 2: the layer's host time within 15% (41.6 vs 46.1 ms)."""

    def per_layer(r: dict) -> float:
        return r["layer_host_fwd_ms"] + r["layer_host_bwd_ms"]

    assert per_layer(rows["tp2 etp1 e128"]) == pytest.approx(per_layer(rows["dp2 e128"]), rel=0.15)


def test_known_misses_the_tp_layouts_run_slower_than_predicted(rows):
    """Pace across ranks and the optimizer's host per parameter tensor are not modelled: the TP layouts ran 10-33%
    over the prediction, and the expert-TP layout's step moved 29% between two runs of one machine."""
    for label in ("tp2 etp1 e128", "tp2 etp2 e128", "tp2 etp1 ep2 e64"):
        r = rows[label]
        assert -0.35 < r["predicted_measured_floor_s"] / r["measured_s"] - 1 < -0.09, label
    etp2 = rows["tp2 etp2 e128"]
    assert etp2["measured_s"] / etp2["rerun_measured_s"] - 1 == pytest.approx(0.29, abs=0.02)
