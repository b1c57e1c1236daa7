"""Predictions through the cost model, memory-edge layer counts, calibration files (pure Python)."""

import json

import pytest

from megatron_autotuner.validate.calibration import write_calibration
from megatron_autotuner.validate.layout import Layout
from megatron_autotuner.validate.predict import edge_num_layers, estimate_layout, predict

pytest.importorskip("megatron_autotuner.costmodel")

LAY = Layout(model="Qwen3-8B", seq_length=4096, num_gpus=2, tp=2, num_layers=4, global_batch_size=8)


def test_predict_is_for_the_reduced_model():
    full = predict(LAY.replace(num_layers=None), "H200")
    reduced = predict(LAY, "H200")
    assert "error" not in reduced and reduced["fits"] is True
    assert reduced["step_time_s"] < full["step_time_s"] and reduced["peak_memory_gib"] < full["peak_memory_gib"]
    bad = predict(LAY.replace(num_layers=3, pp=2, tp=1, sequence_parallel=False), "H200")
    assert "error" in bad


def test_memory_edge():
    one = Layout(model="Qwen3-8B", seq_length=4096)
    fit, oom = edge_num_layers(one, "H200", "max-fit"), edge_num_layers(one, "H200", "min-oom")
    assert oom == fit + 1
    assert estimate_layout(one.replace(num_layers=fit), "H200").fits
    assert not estimate_layout(one.replace(num_layers=oom), "H200").fits
    pp2 = Layout(model="Qwen3-8B", seq_length=4096, num_gpus=2, pp=2, global_batch_size=2)
    assert edge_num_layers(pp2, "H200", "max-fit") % 2 == 0


def _ok_row(layout, step_s, alloc=10.0, reserved=11.0, non_torch=1.5):
    return {"layout_id": layout.layout_id, "layout": layout.to_dict(), "status": "ok",
            "env": {"device": "NVIDIA H200", "torch": "2.11"}, "measured": {"step_time_s": step_s},
            "per_rank": [{"rank": 0, "max_allocated_gib": alloc, "max_reserved_gib": reserved,
                          "non_torch_gib": non_torch}]}  # fmt: skip


def test_calibration_reproduces_measured_step(tmp_path):
    from megatron_autotuner.costmodel import load_calibration

    predicted = estimate_layout(LAY, "H200").step_time_s
    measured = 1.3 * predicted
    path = tmp_path / "cal.json"
    doc = write_calibration([_ok_row(LAY, measured)], "H200", path)
    assert doc["kind"] == "megatron-autotuner-calibration" and doc["ops"] == [] and len(doc["layers"]) == 1
    assert doc["layers"][0]["model"] == "Qwen3-8B" and doc["layers"][0]["phase"] == "fwd+bwd"
    assert doc["memory"] == {"non_torch_gib": 1.5, "fragmentation_fraction": pytest.approx(0.1)}
    cal = load_calibration(path)
    again = estimate_layout(LAY, "H200", cal).step_time_s
    assert again == pytest.approx(measured, rel=0.01)
    assert json.loads(path.read_text())["gpu"] == "H200"


def test_calibration_needs_successful_runs(tmp_path):
    from megatron_autotuner.errors import ConfigError

    with pytest.raises(ConfigError, match="no successful"):
        write_calibration([{"status": "failed", "layout": LAY.to_dict()}], "H200", tmp_path / "c.json")
