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


def test_the_gpu_paced_backward_holds_and_the_forward_waits_for_the_host(comparison):
    """At 8192 tokens (16384 routed rows over 4 experts, ffn 8192, hidden 6144) the backward came within 1.5% of the
    model (15.02 ms measured), the forward 21% under it (9.72 ms against 7.70). A profile of that case on another
    H200 (`profile`) found the forward's kernels busy for 7.0 ms, under the model's 7.70, and the backward's for 14.0
    against 15.25: the forward's missing time is the GPU idle while the host issues the router and waits for the token
    counts from the testbench's empty queue, not slow GEMMs."""
    gpu_bound = next(r for r in comparison["rows"] if r["tokens"] == 8192)
    assert gpu_bound["host_fwd_ms"] < 0.6 * gpu_bound["measured_fwd_ms"]
    assert abs(gpu_bound["error_bwd"]) < 0.03
    assert -0.25 < gpu_bound["error_fwd"] < -0.18
    profile = comparison["profile"]
    assert profile["case_id"] == gpu_bound["case_id"]
    for phase in ("fwd", "bwd"):
        assert 0.85 < profile[f"gpu_busy_{phase}_ms"] / profile[f"model_block_gpu_{phase}_ms"] < 1.0
    assert gpu_bound["measured_fwd_ms"] - profile["gpu_busy_fwd_ms"] > 2.0
