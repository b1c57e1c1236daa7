"""Packed (THD) micro-batches, host copies and the verl offload round trip on one H100
(benchmarks/results/validation_h100_x1/rlhf_packing, README there; predictions were written before each run).
The cost model of today re-predicts the committed layouts, so a change that moves a prediction is seen here."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from megatron_autotuner.costmodel.calibration import load_calibration
from megatron_autotuner.validate.layout import load_layouts_file, ran_with_ddp_side_stream
from megatron_autotuner.validate.predict import predict, predicted_allocated_gib, predicted_reserved_gib

RESULTS = Path(__file__).resolve().parents[2] / "benchmarks/results/validation_h100_x1/rlhf_packing"


@pytest.fixture(scope="module")
def layouts_by_label():
    summary = json.loads((RESULTS / "packing/summary.json").read_text())
    layouts, _ = load_layouts_file(RESULTS / "packing/layouts.json")
    by_id = {lay.layout_id: lay for lay in layouts}
    return {row["label"]: by_id[row["layout_id"]] for row in summary["rows"]}


@pytest.fixture(scope="module")
def rows(layouts_by_label):
    summary = json.loads((RESULTS / "packing/summary.json").read_text())
    out = {}
    for row in summary["rows"]:
        assert row["status"] == "ok" and row["env"]["device"].startswith("NVIDIA H100")
        # as it ran: these runs built DDP on the default stream (`ran_with_ddp_side_stream`)
        lay = layouts_by_label[row["label"]].replace(ddp_side_stream=ran_with_ddp_side_stream(row))
        out[row["label"]] = (row, predict(lay, "H100-SXM"))
    assert len(out) == 8
    return out


def _gpu_step_s(layout) -> float:
    """Today's step time without the dense host floor, which the model of the runs' day did not have."""
    from dataclasses import replace

    from megatron_autotuner.validate.predict import _estimate, cost_options

    return _estimate(layout, "H100-SXM", replace(cost_options(layout), host_floor=False)).step_time_s


def test_todays_model_still_predicts_what_was_written_before_the_runs(rows, layouts_by_label):
    for label, (row, now) in rows.items():
        assert _gpu_step_s(layouts_by_label[label]) == pytest.approx(row["predicted"]["step_time_s"], rel=0.01)
        # allocated, not the peak: the stored peak is what was predicted before the runs, without the packed
        # logits hole of forward-only passes (`theory.allocator`) added since
        assert predicted_allocated_gib(now) == pytest.approx(predicted_allocated_gib(row["predicted"]), rel=0.01)
        # the packing the runner built is the one the model priced (verl's balancing, same seed)
        assert now["num_microbatches"] == row["packing"][0]["num_microbatches"]
        assert now["tokens_per_iteration"] == row["packing"][0]["tokens"]


def test_allocated_memory_of_packed_micro_batches_is_predicted_within_3pct(rows):
    """Largest micro-batch, weights, grads and optimizer: what the allocator hands out, train and forward."""
    for row, now in rows.values():
        assert predicted_allocated_gib(now) / row["measured"]["max_allocated_gib"] - 1 == pytest.approx(0, abs=0.03)


def test_gpu_bound_packed_steps_are_predicted_within_2pct(rows):
    for label, (row, now) in rows.items():
        if label.startswith("L3-8B.L4"):
            assert now["step_time_s"] / row["measured"]["step_time_s"] - 1 == pytest.approx(0, abs=0.02)


def test_reserved_memory_with_the_packed_logits_hole(rows):
    """Forward-only: the caching allocator keeps one more logits segment when a packed micro-batch is larger than
    the ones before it (`theory.allocator` replays its large pool): predicted before the runs 26-46% under,
    now within 8%. Training has no such term (its stored activations fill those blocks): unchanged, -1..-14%."""
    for label, (row, now) in rows.items():
        before = row["error_rel"]["reserved_memory"]
        after = predicted_reserved_gib(now) / row["measured"]["max_reserved_gib"] - 1
        if label.endswith("forward"):
            assert before < -0.2
            assert after == pytest.approx(0, abs=0.08)
            assert now["memory_breakdown_gib"]["allowance"] > row["predicted"]["memory_breakdown_gib"]["allowance"]
        else:
            assert before > -0.15
            assert after == pytest.approx(before, abs=0.005)


def test_known_misses_stay_visible(rows):
    """Pinned misses (README): Qwen3-0.6B at 8k tokens per micro-batch is host-bound (issue #27), and training
    reserved memory of Qwen3-0.6B at 16k tokens is 14% under (12.5 GiB reserved unallocated; not modelled)."""
    _, now = rows["Q3-0.6B packed16k train"]
    row = rows["Q3-0.6B packed16k train"][0]
    assert predicted_reserved_gib(now) / row["measured"]["max_reserved_gib"] - 1 < -0.1
    assert rows["Q3-0.6B packed8k train"][0]["error_rel"]["step_time"] < -0.3


def test_host_copies_pinned_vs_pageable_and_the_calibration_reads_them():
    cal = load_calibration(RESULTS / "copy_bandwidth/copy_calibration.json")
    gib = 1 << 30
    for direction in ("h2d", "d2h"):
        pinned = cal.host_copy_gbps(direction, True, 4 * gib)
        pageable = cal.host_copy_gbps(direction, False, 4 * gib)
        assert 45 < pinned < 64  # PCIe Gen5 x16: 63 GB/s per direction at most
        assert pageable < pinned / 3
    # a size between two measured ones interpolates between them
    small, big = cal.host_copy_gbps("h2d", True, 1 << 20), cal.host_copy_gbps("h2d", True, 64 << 20)
    assert min(small, big) <= cal.host_copy_gbps("h2d", True, 8 << 20) <= max(small, big)


def test_offload_round_trip_is_predicted_within_15pct():
    """verl 0.9.1's moves of a 4-layer Qwen3-8B's params and optimizer state, predicted by `rlhf.offload` from the
    measured copy table before the timing."""
    doc = json.loads((RESULTS / "offload_roundtrip.json").read_text())
    assert doc["state_restored"] and len(doc["runs"]) == 4  # the first round trip (pinning) is reported apart
    predicted, measured = doc["predicted_offload_model"], doc["measured"]
    assert predicted["round_trip_s"] / measured["round_trip_s"] - 1 == pytest.approx(0, abs=0.15)
    copies = {(phase, c["tensor"]): c["time_s"] for phase in ("offload", "load") for c in predicted[phase]["copies"]}
    assert copies[("offload", "optimizer")] / measured["offload_optimizer_s"] - 1 == pytest.approx(0, abs=0.1)
    assert copies[("load", "optimizer")] / measured["load_optimizer_s"] - 1 == pytest.approx(0, abs=0.1)
    assert copies[("offload", "params")] / measured["offload_model_s"] - 1 == pytest.approx(0, abs=0.15)
    # the first run called gc.collect() in every phase (verl does not): ~0.3 s a phase, all of it in gc
    laps = json.loads((RESULTS / "diagnostics/offload_laps_with_gc_collect.json").read_text())["runs"][1]
    assert laps["param_phase_laps_s"]["offload.gc"] > 3 * laps["param_phase_laps_s"]["offload.copy_params"]


def test_packed_passes_the_model_was_not_built_from_are_within_5pct_memory_and_10pct_time():
    """benchmarks/results/validation_h100_x1/rlhf_forward_check and rlhf_matrix: two models, training and
    forward-only at two token budgets each, lengths the allocator replay was not built from, predicted before."""
    rows = []
    for name in ("rlhf_forward_check", "rlhf_matrix"):
        rows += json.loads((RESULTS.parent / name / "summary.json").read_text())["rows"]
    assert len(rows) == 9
    cells = {(row["layout"]["model"], row["layout"]["mode"], row["layout"]["max_token_len"]) for row in rows}
    for model, budgets in (("Llama-3.1-8B", (8192, 16384)), ("Qwen3-8B", (12288, 24576))):
        assert {(model, mode, b) for mode in ("train", "forward") for b in budgets} <= cells
    for row in rows:
        assert row["status"] == "ok" and row["layout"]["max_token_len"]
        assert abs(row["error_rel"]["step_time"]) < 0.10
        assert abs(row["error_rel"]["peak_memory"]) < 0.05  # the target: device peak, non-torch included
