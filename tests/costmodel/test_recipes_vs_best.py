"""NVIDIA's flagship recipes as Megatron-LM launches against the tool's best layout
(benchmarks/recipes_vs_best.py -> benchmarks/results/recipes_vs_best.json): the committed JSON is what the model
gives now, the 405B recipe is within 10% of the best, and the MoE recipes' gap is the exposed EP all-to-all."""

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
        # within 10% with the NVLink alpha-beta model; 13.7% since TP=8 collectives follow NCCL's protocol curves
        # with the 2x H200 correction (0.75 of NCCL's bus bandwidth; published 8x H100 plateaus are 0.92-1.0) and
        # TE's pipeline reduce-scatter runs at its measured 16-SM rate (benchmarks/results/nccl_curves.json)
        assert row["best_over_recipe_speedup"] < 1.15
    else:  # the MoE recipes: the EP all-to-all the model leaves exposed is most of the gap (docs/recipes.md)
        gap = row["recipe_step_time_s"] - row["best_step_time_s"]
        ep_gap = (
            row["recipe_time_breakdown_s"]["exposed_comm"]["ep"] - row["best_time_breakdown_s"]["exposed_comm"]["ep"]
        )
        assert ep_gap > gap
