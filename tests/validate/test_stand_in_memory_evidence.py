"""Committed memory stand-in evidence (benchmarks/results/validation_h200_x1/stand_in_memory, README there): every
rank of 7 dense 2-GPU layouts run alone on one H200 over torch's fake process group, with the allocator's
history. Checked against the real 2-GPU runs of the same layouts (../validation_h200_x2/expandable/dense) and
against the current cost model."""

from pathlib import Path

import pytest

from megatron_autotuner.theory.memory import interleaved_logits_fragment_bytes
from megatron_autotuner.trace.memory_history import load_snapshot, replay_history
from megatron_autotuner.validate.layout import Layout
from megatron_autotuner.validate.predict import compare, estimate_layout, predict, predicted_reserved_gib
from megatron_autotuner.validate.results import aggregate

RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results"
STAND_IN = RESULTS / "validation_h200_x1" / "stand_in_memory"
REAL = RESULTS / "validation_h200_x2" / "expandable" / "dense"
GIB = 2**30
BF16_LOGITS_S4096_BYTES = 2 * 4096 * 151936  # Qwen3-8B's vocabulary (padded to 151936), one micro-batch


def _rows(folder: Path) -> dict[str, dict]:
    return {row["layout"]["name"]: row for row in aggregate(folder).values()}


def _gap_gib(rank: dict) -> float:
    return rank["max_reserved_gib"] - rank["max_allocated_gib"]


def test_every_stand_in_ran_and_says_so():
    rows = _rows(STAND_IN)
    assert len(rows) == 7
    for name, row in rows.items():
        assert row["status"] == "ok" and row["stand_in"] and row["ranks_reported"] == [0, 1], name
        # no step time or device peak is offered as a measurement
        assert row["measured"]["step_time_s"] is None and row["measured"]["peak_gib"] is None
        assert row["env"]["pytorch_cuda_alloc_conf"] == "expandable_segments:True"


def test_stand_in_allocates_what_the_real_rank_allocated():
    """Same layout, same rank: the stand-in's max allocated equals the NCCL run's to 1 MiB, and without
    interleaving its reservation does too; the interleaved layout reserved >1 GiB more with NCCL on both ranks."""
    stand_in, real = _rows(STAND_IN), {r["layout"]["name"]: r for r in aggregate(REAL).values()}
    for name in ("8B s4096 pp2", "8B s4096 pp2 vpp2"):
        for s, r in zip(stand_in[name]["per_rank"], real[name]["per_rank"], strict=True):
            assert s["rank"] == r["rank"]
            assert s["max_allocated_gib"] == pytest.approx(r["max_allocated_gib"], abs=1 / 1024), (name, s["rank"])
    for s, r in zip(stand_in["8B s4096 pp2"]["per_rank"], real["8B s4096 pp2"]["per_rank"], strict=True):
        assert s["max_reserved_gib"] == pytest.approx(r["max_reserved_gib"], abs=0.01)
    for s, r in zip(stand_in["8B s4096 pp2 vpp2"]["per_rank"], real["8B s4096 pp2 vpp2"]["per_rank"], strict=True):
        assert 1.0 < r["max_reserved_gib"] - s["max_reserved_gib"] < 1.2


def test_interleaved_last_stage_leaves_one_bf16_logits_buffer():
    """Rank 1 (last stage): reserved unallocated = the stage's bf16 logits with interleaving (within 12%), ~0
    without; the model's rule gives exactly the logits buffer."""
    rows = _rows(STAND_IN)
    for name, row in rows.items():
        lay = Layout.from_record(row)
        if lay.mode != "train":
            continue
        gap = _gap_gib(row["per_rank"][1])
        logits_gib = 2 * lay.micro_batch_size * lay.seq_length * 151936 / GIB
        if lay.vpp:
            assert gap == pytest.approx(logits_gib, rel=0.12), name
        else:
            assert gap < 0.1, name
    parallel = Layout.from_record(rows["8B s4096 pp2 vpp2"]).parallel()
    detail = {"logits_transient": float(BF16_LOGITS_S4096_BYTES)}
    assert interleaved_logits_fragment_bytes(detail, parallel) == BF16_LOGITS_S4096_BYTES
    flat = Layout.from_record(rows["8B s4096 pp2"]).parallel()
    assert interleaved_logits_fragment_bytes(detail, flat) == 0.0


def test_history_shows_the_logits_gradient_growing_the_segment():
    """The committed snapshot of the last stage of pp2 vpp2 (s4096): the bf16 logits freed by the loss, a 32 MiB
    receive buffer placed at the start of that hole, then a request of the logits' size that grows the segment
    by a whole buffer while more than that is free in pieces."""
    history = replay_history(load_snapshot(STAND_IN / "memory" / "rank_1.pickle.gz"))
    size = BF16_LOGITS_S4096_BYTES
    # asked for by autograd's backward (no Python frame): the logits' gradient
    backward = [g for g in history.growths if g.request_bytes == size and not g.frames]
    assert len(backward) >= 2  # the first step and a later one
    in_pieces = [g for g in backward if g.free_before_bytes > size and g.excess_bytes > 0.99 * size]
    assert [g.index for g in in_pieces] == [g.index for g in backward[:2]]
    assert history.reserved_unallocated_at_peak_bytes / GIB == pytest.approx(1.146, abs=0.01)
    trace = next(t for t in load_snapshot(STAND_IN / "memory" / "rank_1.pickle.gz")["device_traces"] if t)
    freed = next(  # the bf16 logits, freed by the loss in the forward step
        e
        for e in trace
        if e["action"] == "free_completed"
        and e["size"] == size
        and any(f["name"] == "_forward_step" for f in e.get("frames", []))
    )
    after = [e for e in trace[trace.index(freed) :] if e["action"] == "alloc"][:40]
    assert any(e["addr"] == freed["addr"] and e["size"] == 32 * 2**20 for e in after)


def test_model_predicts_every_stand_in_reservation_within_1pct():
    """Predicted reserved memory (peak less memory outside the allocator) against the larger rank's max
    reserved: within 1% for all 7 layouts (4 never run on 2 GPUs); allocated within 2%. The comparison row of
    `mat validate --stand-in` reports the same error."""
    for name, row in _rows(STAND_IN).items():
        lay = Layout.from_record(row)
        predicted = predict(lay, "H200", gradient_accumulation_fusion=False)
        reserved = max(p["max_reserved_gib"] for p in row["per_rank"])
        assert predicted_reserved_gib(predicted) == pytest.approx(reserved, rel=0.01), name
        err = compare(lay, row, predicted, None)["error_rel"]
        assert err["reserved_memory"] == pytest.approx(predicted_reserved_gib(predicted) / reserved - 1)
        assert abs(err["allocated_memory"]) < 0.02 and err["step_time"] is None and err["peak_memory"] is None


def test_full_depth_70b_stages_for_64_gpus_within_2pct():
    """Llama-3.1-70B, all 80 layers, tp4 pp4 vpp5 cp2 (the published NeMo recipe) and tp8 pp4 vpp5 for 64 GPUs: the
    first rank of each of the 4 stages as a stand-in on one H200. Every stage's reserved memory is predicted
    within 2% (-0.1% .. -1.4%), and the first stage is the largest, as predicted."""
    rows = aggregate(RESULTS / "validation_h200_x1" / "stand_in_70b")
    assert len(rows) == 2
    for row in rows.values():
        lay = Layout.from_record(row)
        assert row["status"] == "ok" and row["stand_in"] and lay.num_gpus == 64 and lay.num_layers is None
        assert [p["rank"] for p in row["per_rank"]] == [0, 16, 32, 48]
        est = estimate_layout(lay, "H200", gradient_accumulation_fusion=False).to_dict()
        outside = est["memory_breakdown_gib"]["non_torch"]
        reserved = [p["max_reserved_gib"] for p in row["per_rank"]]
        for predicted, measured in zip(est["memory_per_stage_gib"], reserved, strict=True):
            assert abs((predicted - outside) / measured - 1) < 0.02, (lay.label, predicted - outside, measured)
        assert max(reserved) == reserved[0] and est["memory_breakdown_gib"]["stage"] == 0
