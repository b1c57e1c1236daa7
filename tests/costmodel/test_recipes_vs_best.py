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
        # The eager MoE block's host floor (measured with the fused permute the recipes run, one H200 lease:
        # defaults.FUSED_MOE_HOST_FLOOR_*) holds the small, host-bound layouts the tool used to pick: Qwen3-235B's
        # recipe is within 10% of the best now (32% before). DeepSeek-V3's node-limited routing (8 groups, 4 per token)
        # caps the nodes its HybridEP dispatch reaches at 3.5 of 7 on average (4.6 unlimited): 10.1% (39% before),
        # against a best of TP 1 + CP 4 beside the all-to-all overlap. That pairing runs with 8 hardware queues, where
        # CP's ring exchange is held exposed (estimate.cp_ring_hides: the upper bound of what 2x H200 measured,
        # benchmarks/results/connections_h200_x2): 8.4%, against TP 4 + the overlap; what is left mostly the
        # recipe's slowest stage's GEMMs and TP 2 collectives against the best's GEMMs and TP 4 collectives
        gap = row["recipe_step_time_s"] - row["best_step_time_s"]
        ep_gap = (
            row["recipe_time_breakdown_s"]["exposed_comm"]["ep"] - row["best_time_breakdown_s"]["exposed_comm"]["ep"]
        )
        if "qwen3" in launch:
            assert row["best_over_recipe_speedup"] < 1.10 and ep_gap > gap
        else:
            recipe, best = row["recipe_time_breakdown_s"], row["best_time_breakdown_s"]
            tp_gap = recipe["compute"]["gemm"] + recipe["exposed_comm"]["tp"] - best["compute"]["gemm"]
            assert row["best_over_recipe_speedup"] < 1.10 and tp_gap > ep_gap
