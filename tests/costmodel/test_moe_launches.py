"""A MoE layer's launches in the host's lead (`queued_frees.rank_launches`): held to padded MoE steps on one H200,
predicted before they ran (benchmarks/results/moe_launches_h200, `python benchmarks/moe_launches.py`)."""

from __future__ import annotations

import json

import pytest

from megatron_autotuner.costmodel import defaults as d
from megatron_autotuner.costmodel.queued_frees import rank_launches
from tests.benchmark_scripts import load_script
from tests.evidence import RESULTS, runs_with_prediction_before

FOLDER = "moe_launches_h200"


@pytest.fixture(scope="module")
def report():
    return load_script("moe_launches").build_report()


def test_both_counts_were_predicted_before_the_runs():
    for predicted in ("predicted.json", "predicted_dense_launches.json"):
        assert len(runs_with_prediction_before(FOLDER, predicted)) == 8


def test_what_awaits_at_the_peak_follows_the_moe_layers_launches(report):
    """Where the launch queue bounds the lead (Grok-1's rank, Qwen3-30B-A3B at 16 and 32 local experts), the frees
    awaiting their event at the recorded peak are within 4.1 GiB of the MoE count's (11.2 against 15.2, 2.1 against
    2.6, 1.8 against 1.8) and every one closer than with a dense layer's count (33.5, 7.1, 2.1)."""
    recorded = [row for row in report["layouts"] if row["awaiting_at_peak_gib"] is not None]
    assert len(recorded) == 4
    queue_bound = [row for row in recorded if not row["label"].startswith("Mixtral")]
    for row in queue_bound:
        measured = row["awaiting_at_peak_gib"]
        assert abs(row["pred_awaiting_gib"] - measured) <= 4.1, row["label"]
        assert abs(row["pred_awaiting_gib"] - measured) < abs(row["pred_awaiting_dense_launches_gib"] - measured)


def test_a_moe_layer_pass_launches_what_the_model_counts(report):
    """The profiled padded steps launched 205 (4 local experts) and 318 (16) operations a layer pass; the model counts
    178 and 274: within 15%, the rest the embedding, loss and optimizer-side work of a 2-layer step."""
    for row in report["launches"]:
        assert row["model_per_pass"] == pytest.approx(row["measured_per_pass"], rel=0.15), row["label"]
        assert row["measured_per_pass"] > 2 * sum(d.LAUNCHES_PER_LAYER[False])  # over twice a dense layer's


def test_launches_grow_with_local_experts_and_their_biases():
    dense = rank_launches(4, 0, tp_gt1=False)
    few = rank_launches(0, 4, tp_gt1=False, local_experts=4)
    many = rank_launches(0, 4, tp_gt1=False, local_experts=64)
    assert dense < few < many
    assert rank_launches(0, 4, tp_gt1=False, local_experts=16, expert_bias=True) > rank_launches(
        0, 4, tp_gt1=False, local_experts=16
    )
    # gradient-accumulation fusion: no add per expert parameter
    assert rank_launches(0, 1, False, 8, gradient_accumulation_fusion=True) == pytest.approx(
        rank_launches(0, 1, False, 8, gradient_accumulation_fusion=False) - 2 * 8
    )


def test_the_committed_report_is_what_the_evidence_gives(report):
    committed = json.loads((RESULTS / FOLDER / "report.json").read_text())
    assert committed == json.loads(json.dumps(report))
