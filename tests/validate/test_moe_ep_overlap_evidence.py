"""The 2x H200 MoE evidence of #40 (benchmarks/results/moe_ep_overlap_h200_x2*, `python benchmarks/moe_ep_overlap.py`):
gpt-oss-20b (4 layers) and Mixtral-8x7B (2 layers) at ep 1 and 2, with and without Megatron's all-to-all overlap, and
padded token dropping, predicted before each round. What the model gets right is held; its misses are pinned to the
measured ranges docs/accuracy.md states, so a change in either shows."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from megatron_autotuner.validate.layout import Layout
from megatron_autotuner.validate.predict import predict
from tests.benchmark_scripts import load_script

RESULTS = Path(__file__).resolve().parents[2] / "benchmarks/results"


@pytest.fixture(scope="module")
def report() -> dict:
    return json.loads((RESULTS / "moe_ep_overlap_h200_x2/report.json").read_text())


def _ok(report, label: str) -> list[dict]:
    return [r for r in report["rows"] if r["label"] == label and r["measured_step_s"] is not None]


def test_the_report_is_what_the_committed_runs_give(report):
    assert load_script("moe_ep_overlap").report() == report


def test_each_round_was_predicted_before_it_ran():
    for folder, name in (("moe_ep_overlap_h200_x2", "predicted.json"),
                         ("moe_ep_overlap_h200_x2_r2", "predicted_default.json"),
                         ("moe_ep_overlap_h200_x2_r3", "predicted_default.json")):  # fmt: skip
        predicted_at = json.loads((RESULTS / folder / name).read_text())["predicted_at"]
        run_date = json.loads((RESULTS / folder / "summary.json").read_text())["date"]
        assert predicted_at < run_date, folder


def test_the_all_to_all_moves_as_modelled(report):
    """The profiled ep 2 steps' all-to-alls, matched across both ranks: the transfer is the model's within 10%
    (gpt-oss-20b 166 us against 175, Mixtral 127 against 128); what they lost was waiting for the other rank."""
    profiled = [r for r in report["rows"] if r["collective_waits"] and r["model_all_to_all_ms"]]
    assert len(profiled) == 2
    for r in profiled:
        a2a = next(c for c in r["collective_waits"] if c["collective"] == "send_recv")
        assert a2a["transfer_median_us"] / 1e3 == pytest.approx(r["model_all_to_all_ms"], rel=0.10), r["label"]
        assert max(a2a["wait_sum_us"]) > 10 * a2a["transfer_sum_us"] / a2a["calls"], r["label"]


def test_the_faster_ep_size_is_the_predicted_one(report):
    """EP 2 against EP 1 at dp 2, both models, both unprofiled rounds: regret 0."""
    for model in ("oss20b L4", "mixtral L2"):
        for rnd in ("r1", "r2"):
            ep1 = next(r for r in _ok(report, f"{model} ep1 dp2") if r["round"] == rnd)
            ep2 = next(r for r in _ok(report, f"{model} ep2 dp2") if r["round"] == rnd)
            assert ep2["predicted_before_step_s"] < ep1["predicted_before_step_s"]
            assert ep2["measured_step_s"] < ep1["measured_step_s"], (model, rnd)


def test_the_overlap_gains_nothing_where_the_eager_moe_block_paces_the_layer(report):
    """gpt-oss-20b's MoE blocks are host-paced at ep 2: the combined step ran 16% slower than the serial schedule, and
    the model (now) claims no gain for it; Mixtral's, which the model holds GPU-paced, ran 2-4% faster with it (the
    model: 1%)."""
    serial = _ok(report, "oss20b L4 ep2 dp2")[-1]
    overlap = _ok(report, "oss20b L4 ep2 dp2 a2a-overlap")[0]
    assert overlap["measured_step_s"] > 1.10 * serial["measured_step_s"]
    batch = json.loads((RESULTS.parent / "validation/x2_moe_ep_overlap_layouts.json").read_text())
    oss, defaults = {r["name"]: r for r in batch["layouts"]}, batch["defaults"]
    now = {name: predict(Layout.from_dict({**defaults, **oss[name]}), "H200")["step_time_s"]
           for name in ("oss20b L4 ep2 dp2", "oss20b L4 ep2 dp2 a2a-overlap+delay-wgrad")}  # fmt: skip
    assert now["oss20b L4 ep2 dp2 a2a-overlap+delay-wgrad"] == pytest.approx(now["oss20b L4 ep2 dp2"])
    for rnd in ("r1", "r2"):
        serial, overlap = (next(r["measured_step_s"] for r in _ok(report, label) if r["round"] == rnd)
                           for label in ("mixtral L2 ep2 dp2", "mixtral L2 ep2 dp2 a2a-overlap"))  # fmt: skip
        assert 0.95 * serial < overlap < serial, rnd


def test_known_misses_stay_where_the_docs_put_them(report):
    """Not met, documented (docs/accuracy.md, "The EP all-to-all overlap on two GPUs"): every ep 2 step ran 12-17%
    (gpt-oss-20b) and 13-14% (Mixtral) over the prediction, the ep 1 steps within 8.2%; delayed wgrad slowed the
    overlap by 5-12%; padded token dropping at ep 2 ran 27-30% over its prediction."""

    def err(r):
        return r["predicted_before_step_s"] / r["measured_step_s"] - 1

    for r in _ok(report, "oss20b L4 ep2 dp2"):
        assert -0.18 < err(r) < -0.11
    for r in _ok(report, "mixtral L2 ep2 dp2"):
        assert -0.15 < err(r) < -0.12
    for r in _ok(report, "oss20b L4 ep1 dp2") + _ok(report, "mixtral L2 ep1 dp2"):
        assert abs(err(r)) < 0.085
    for r in _ok(report, "oss20b L4 ep2 dp2 cap1-pad"):
        assert -0.31 < err(r) < -0.26
    dw = _ok(report, "mixtral L2 ep2 dp2 a2a-overlap+delay-wgrad")[0]["measured_step_s"]
    assert dw > 1.10 * _ok(report, "mixtral L2 ep2 dp2 a2a-overlap")[-1]["measured_step_s"]


def test_peaks_serial_gpt_oss_within_5_percent_the_rest_under(report):
    """gpt-oss-20b's serial peaks came within 5%; with the overlap its reserved memory grew 1.3-2.2 GiB over the
    serial run's at the same allocated peak (5-7% over the prediction); Mixtral's reserved memory ran 7-15% over the
    prediction at ep 1 and 2 with its allocated peak within 5%. Known misses: the allocator's reserve, not the
    tensors."""
    for r in report["rows"]:
        if r["measured_peak_gib"] is None:
            continue
        e = r["predicted_before_peak_gib"] / r["measured_peak_gib"] - 1
        if r["label"].startswith("oss20b") and "overlap" not in r["label"]:
            assert abs(e) < 0.05, r["label"]
        else:
            assert -0.15 < e < -0.025, r["label"]
