"""The caching-allocator model (`theory.allocator`) against recorded allocator histories (GPU evidence in
benchmarks/results/moe_fragmentation_h200_x2, from benchmarks/moe_fragmentation.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from megatron_autotuner.errors import ConfigError
from megatron_autotuner.theory.allocator import large_pool_peak
from megatron_autotuner.trace.memory_history import large_pool_requests, load_snapshot, replay_history
from megatron_autotuner.validate.layout import Layout
from megatron_autotuner.validate.predict import estimate_layout

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "benchmarks/results/moe_fragmentation_h200_x2"
GIB = 2**30


@pytest.mark.parametrize(
    "layout_id",
    [
        "Qwen3-30B-A3B.L4.g2.tp1.pp1.cp1.ep2.s4096.b8.none.forward.9449f75716",
        "Qwen3-30B-A3B.L4.g2.tp1.pp1.cp1.ep1.s4096.b8.full.train.0ff377fbdf",
    ],
)
def test_the_allocator_model_replays_a_recorded_moe_history_to_its_reserve(layout_id: str) -> None:
    """2x H200, Qwen3-30B-A3B (128 experts, 4 layers): fed the recorded requests, the large-pool model reserves
    what the GPU reserved (43.27 / 76.99 GiB) within 0.1 GiB, and leaves the same memory unallocated at the peak
    (11.4 / 13.3 GiB)."""
    snapshot = load_snapshot(OUT / "snapshots" / f"{layout_id}.rank_0.pickle.gz")
    recorded = replay_history(snapshot, 0)
    modelled = large_pool_peak(large_pool_requests(snapshot, 0))
    assert recorded.initial_reserved_bytes < 64 * 2**20
    assert abs(modelled.reserved_bytes - recorded.peak_reserved_bytes) < 0.1 * GIB
    assert recorded.reserved_unallocated_at_peak_bytes > 10 * GIB
    assert abs(modelled.unallocated_at_peak_bytes - recorded.reserved_unallocated_at_peak_bytes) < 0.1 * GIB


def test_every_single_stream_history_is_replayed_within_a_tenth_of_a_gib() -> None:
    """The report's replays of every committed history that starts with its process: where no block awaited
    another stream and the allocator released nothing, 27 histories (1-4 GPUs, dense and MoE, forward-only and
    training; 16 of them recorded after the model, moe_holdout_h200_x2 / _x4) within 0.1 GiB; where DDP's stream
    held frees at the peak (per-stream pools, not modelled), off by less than what awaited it. The two histories in
    which cudaMalloc failed and cached segments were freed (release_limit_h100's 512 sequences, one 4-GPU Qwen3-32B
    run) are left out: the replay has no device limit (the cost model stops there)."""
    doc = json.loads((OUT / "report.json").read_text())
    single = [r for r in doc["allocator_replays"] if r["awaiting_at_peak_gib"] == 0 and not r["released_segments"]]
    assert len(single) >= 27
    for r in single:
        assert abs(r["modelled_reserved_gib"] - r["recorded_reserved_gib"]) < 0.1, r["snapshot"]
    for r in doc["allocator_replays"]:
        if r["awaiting_at_peak_gib"] > 0 and not r["released_segments"]:
            assert abs(r["modelled_reserved_gib"] - r["recorded_reserved_gib"]) < r["awaiting_at_peak_gib"]


@pytest.mark.parametrize("folder", ["moe_holdout_h200_x2", "moe_holdout_h200_x4"])
def test_held_out_moe_histories_replay_on_both_ranks(folder: str) -> None:
    """Recorded after the allocator model existed and never used to change it (benchmarks/moe_fragmentation.py
    holdout / holdout4, 2x and 4x H200): Qwen3-30B-A3B at 16k tokens, at EP 1, 2 and 4 and TP 2 x EP 2, Mixtral-8x7B
    with and without full recompute, two ranks each; fed their recorded requests, the model reserves what the GPU
    reserved within 0.3 GiB (0.03 on 4 GPUs), while the cost model's peak stays under the measured one (-1.7 to
    -17.1%): the request sequence is what it lacks."""
    out = ROOT / "benchmarks/results" / folder
    doc = json.loads((out / "report.json").read_text())
    held = [r for r in doc["allocator_replays"] if folder in r["snapshot"]]
    assert len(held) == 8
    for r in held:
        assert abs(r["modelled_reserved_gib"] - r["recorded_reserved_gib"]) < 0.3, r["snapshot"]
    histories = [r for r in doc["rows"] if "memory_history" in r["label"]]
    assert len(histories) == 4
    assert all(r["measured_peak_gib"] > r["predicted_peak_gib"] for r in histories)


def test_the_ep2_step_waits_on_the_rank_whose_gpu_idles() -> None:
    """2x H200, Qwen3-30B-A3B at EP 2 with full recompute, both ranks profiled (moe_holdout_h200_x2): the
    gradient reduce-scatter is not what runs exposed (under 3 ms on either rank); rank 1's GPU idles 81 ms (35 ms
    without recompute) while rank 0's all-to-all kernels take 82 ms against rank 1's 42: rank 0 waits at each
    dispatch for the rank whose host is behind. The slowest rank's host sets the pace."""
    out = ROOT / "benchmarks/results/moe_holdout_h200_x2"
    rows = json.loads((out / "report.json").read_text())["rows"]
    (full,) = [r for r in rows if r["label"] == "e128 L4 tp1 ep2 dp2 mbs8 full profile"]
    (none,) = [r for r in rows if r["label"] == "e128 L4 tp1 ep2 dp2 mbs8 profile"]
    r0, r1 = full["ranks"]
    assert all(r["collectives"]["reduce_scatter"]["exposed_ms"] < 3 for r in (r0, r1))
    assert r0["collectives"]["send_recv"]["kernel_ms"] > 1.8 * r1["collectives"]["send_recv"]["kernel_ms"]
    assert r1["idle_ms"] > 2 * none["ranks"][1]["idle_ms"]


def test_the_moe_reserve_grows_at_the_fp32_logits_with_the_unallocated_memory_free_beside_it() -> None:
    """In each of the four MoE histories the request that grew the reserve most beyond need is megatron-core's
    fp32 copy of the logits (18.55 GiB), and what the cache held free then is the peak's reserved-unallocated
    memory; with expandable segments the same layout peaks at its prediction."""
    rows = json.loads((OUT / "report.json").read_text())["rows"]
    histories = [r for r in rows if "largest_excess_growth" in r]
    assert len(histories) == 4
    for r in histories:
        growth = r["largest_excess_growth"]
        assert "cross_entropy" in growth["site"] and growth["request_gib"] == pytest.approx(18.55, abs=0.01)
        assert growth["free_before_gib"] == pytest.approx(r["reserved_unallocated_at_peak_gib"], abs=0.05)
        assert r["measured_peak_gib"] > r["predicted_peak_gib"] * 1.05  # the default allocator's miss
    (control,) = [r for r in rows if "expandable" in r["label"]]
    assert control["predicted_peak_gib"] == pytest.approx(control["measured_peak_gib"], rel=0.01)


@pytest.mark.parametrize(
    "folder",
    [
        "moe_fragmentation_h200_x2",
        "moe_recompute_h200_x2",
        "moe_holdout_h200_x2",
        "moe_holdout_h200_x4",
        "release_limit_h100",
    ],
)
def test_predictions_were_committed_before_the_run(folder: str) -> None:
    out = ROOT / "benchmarks/results" / folder
    predicted = json.loads((out / "predicted.json").read_text())
    runs = [json.loads(line) for line in (out / "results.jsonl").open()]
    assert min(r["env"]["date"] for r in runs) > predicted["date"]
    by_id = {r["layout_id"]: r["predicted"] for r in predicted["rows"]}
    for run in runs:
        assert run["predicted"]["step_time_s"] == pytest.approx(by_id[run["layout_id"]]["step_time_s"], rel=1e-9)


def test_a_device_the_snapshot_lacks_is_a_config_error() -> None:
    with pytest.raises(ConfigError):
        large_pool_requests({"device_traces": [[]]}, 3)


def test_the_recompute_of_a_128_expert_block_costs_its_modelled_gpu_work_and_more_besides() -> None:
    """2x H200, Qwen3-30B-A3B at EP 1, rank 0's profiled steps with and without full recompute: the compute
    kernels grow by the model's recompute time within 10% (+48 vs +49 ms), while the step grows by more than twice
    what the model adds (GPU idle and an exposed gradient reduce-scatter, docs/accuracy.md)."""
    rows = json.loads((ROOT / "benchmarks/results/moe_recompute_h200_x2/report.json").read_text())["rows"]
    (none,) = [r for r in rows if r["label"] == "e128 L4 tp1 dp2 mbs8 profile"]
    (full,) = [r for r in rows if r["label"] == "e128 L4 tp1 dp2 mbs8 full profile"]
    modelled_s = full["predicted_step_s"] - none["predicted_step_s"]
    compute_s = (full["trace_ms"]["compute"] - none["trace_ms"]["compute"]) / 1e3
    doc = json.loads((ROOT / "benchmarks/validation/x2_moe_recompute_layouts.json").read_text())
    lay = Layout(**next(d for d in doc["layouts"] if d["name"] == full["label"]))
    estimate = estimate_layout(lay, "H200", gradient_accumulation_fusion=False)
    recompute_s = estimate.to_dict()["time_breakdown_s"]["compute"]["recompute"]
    assert compute_s == pytest.approx(recompute_s, rel=0.10)
    assert full["measured_step_s"] - none["measured_step_s"] > 2 * modelled_s
