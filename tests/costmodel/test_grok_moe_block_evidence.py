"""Grok-1's MoE block as one rank of dgxc's tp 4 ep 2 layout holds it, on one H200 (benchmarks/grok_moe_block.py,
benchmarks/results/grok_moe_block_h200), beside the cost model's prediction written before the lease."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.benchmark_scripts import load_script

LEASE = Path(__file__).resolve().parents[2] / "benchmarks/results/grok_moe_block_h200"


@pytest.fixture(scope="module")
def comparison() -> dict:
    return json.loads((LEASE / "comparison.json").read_text())


def test_predicted_before_the_lease_and_the_report_is_what_the_records_give(comparison):
    assert comparison["predicted_at"] < comparison["env"]["date"]
    assert load_script("grok_moe_block").report() == comparison
    predicted = json.loads((LEASE / "predicted.json").read_text())
    assert len(comparison["rows"]) == len(predicted["rows"]) == 4


def test_the_gpu_paced_backward_holds_and_the_forward_is_a_known_miss(comparison):
    """At 8192 tokens (16384 routed rows over 4 experts, ffn 8192, hidden 6144) the block is GPU-paced both ways (host
    5-7 ms): the backward came within 1.5% of the model (15.02 ms measured), the forward 21% under it (9.72 ms against
    7.70). The forward's grouped GEMMs do half the backward's FLOPs, so it ran at about 510 TFLOP/s where the backward
    ran at about 660: what the forward loses is not found yet (no profile; pinned so a change shows)."""
    gpu_bound = next(r for r in comparison["rows"] if r["tokens"] == 8192)
    assert gpu_bound["host_fwd_ms"] < 0.6 * gpu_bound["measured_fwd_ms"]
    assert abs(gpu_bound["error_bwd"]) < 0.03
    assert -0.25 < gpu_bound["error_fwd"] < -0.18
