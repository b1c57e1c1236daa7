"""NVIDIA's flagship recipes as Megatron-LM launches against the tool's best layout
(benchmarks/recipes_vs_best.py -> benchmarks/results/recipes_vs_best.json): the committed JSON is what the model
gives now, the 405B recipe is within 11% of the best (why not 10%: in the test), and the MoE recipes' gap is the
exposed EP all-to-all."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
import recipes_vs_best  # noqa: E402

COMMITTED = {r["launch"]: r for r in json.loads((ROOT / "benchmarks/results/recipes_vs_best.json").read_text())["rows"]}


@pytest.mark.parametrize(("launch", "base"), recipes_vs_best.RECIPES)
def test_recipes_against_the_best_layout(launch, base):
    row = recipes_vs_best.compare(launch, base)
    committed = COMMITTED[row["launch"]]
    assert row["recipe_step_time_s"] == pytest.approx(committed["recipe_step_time_s"], rel=1e-6)
    assert row["best_step_time_s"] == pytest.approx(committed["best_step_time_s"], rel=1e-6)
    assert row["recipe_fits"]
    if "llama31_405b" in launch:
        # 10.8% from the best. TP=8 collectives follow NCCL's protocol curves at the 8-rank bandwidth published for
        # 8x H100 (defaults.NCCL_CHUNKED_BW_FRACTION; the 2-rank 0.75 put it at 13.7%). The rest over 10% is the
        # launch's userbuffers methods: without --tp-comm-overlap-cfg (a YAML path MLM needs; see the fixture's notes)
        # TE runs its defaults, the proj / fc2 forward reduce-scatters by the pipeline kernel on 16 SMs at its
        # measured 144 GB/s (defaults.UB_SM_KERNEL_GBPS, 2x H200), while the recipe's table
        # (userbuffers_fp8_h100_h16384_tp8_cp2_mbs1_seqlen8192) runs them by ring exchange on the copy engines;
        # priced as ring exchange, the gap is 9.6% (exposed TP 4.7 -> 3.7 s). The model prices the launch as written.
        # Since every layout is planned with the launch's own run settings (its TP overlap, fusions), the best found is
        # 13.6% faster (tp2 pp32 vpp4 cp8), where it was 10.8% with the tool's former defaults; charging the compute
        # that hidden NVLink collectives slow (defaults.NCCL_OVERLAP_COST; inter-node ones unmeasured, so not charged)
        # makes the recipe's TP 8 dearer again: 17.1%.
        assert row["best_over_recipe_speedup"] < 1.18
    else:  # the MoE recipes (docs/recipes.md)
        # DeepSeek-V3's node-limited routing (8 groups, 4 per token) caps the nodes its HybridEP dispatch reaches at
        # 3.5 of 7 on average (4.6 unlimited). With the all-to-all overlap held to what the host leaves it
        # (moe_overlap.a2a_overlap_saving_s), the best found is TP 1 + EP 8 (one node's all-to-all) with full
        # recompute, 7.3% faster: the gap is the recipe's exposed EP 64 all-to-all (was 8.4%, against TP 4 + the
        # overlap, its TP collectives)
        gap = row["recipe_step_time_s"] - row["best_step_time_s"]
        ep_gap = (
            row["recipe_time_breakdown_s"]["exposed_comm"]["ep"] - row["best_time_breakdown_s"]["exposed_comm"]["ep"]
        )
        if "qwen3" in launch:
            # The recipe is predicted as NVIDIA published it: 1611-1712 tokens/s/GPU at GBS 8192 on 256 H100
            # (Megatron-Bridge docs/performance-summary-archive.md, 26.02.01 .. 26.04.01; the fixture's header), a
            # step of 76.6-81.4 s. Its all-to-all overlap hides no more than its MoE blocks' GPU time over their host
            # floors (moe_overlap.a2a_overlap_saving_s): the same thread issues both passes of a combined step, so
            # the host holds the rest (it was priced as hidden, 62.3 s). The best layout found, 39% faster, amortises
            # that host time over micro-batch 2 at EP 8; it has not run on 256 GPUs, so the gap stands as the
            # model's claim, and it is the host's time
            tokens = 8192 * 4096
            published_s = (tokens / (1712 * 256), tokens / (1611 * 256))
            assert 0.95 * published_s[0] < row["recipe_step_time_s"] < 1.05 * published_s[1]
            host_gap = row["recipe_time_breakdown_s"]["host_bound"] - row["best_time_breakdown_s"]["host_bound"]
            assert host_gap > 0.8 * gap
        else:
            assert row["best_over_recipe_speedup"] < 1.10 and ep_gap > gap
