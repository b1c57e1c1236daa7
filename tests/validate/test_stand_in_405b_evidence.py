"""NVIDIA's Llama-3.1-405B recipe layout (tp8 pp8 vpp8 cp2, embedding + loss accounted) run as memory stand-ins
on one H200, stage by stage (benchmarks/results/validation_h200_x1/stand_in_405b*, README there)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from megatron_autotuner.costmodel.estimate import padded_vocab
from megatron_autotuner.theory.memory import GIB, ActivationOptions, MemoryAllowance, memory_per_stage
from megatron_autotuner.validate.layout import load_layouts_file

RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "validation_h200_x1"


def _stages(name: str) -> list[tuple[float, float, float, float]]:
    """(predicted allocated, measured max allocated, predicted reserved, measured max reserved) GiB per stage."""
    folder = RESULTS / name
    (layout,), _ = load_layouts_file(folder / "layouts.json")
    model, parallel, workload = layout.model_spec(), layout.parallel(), layout.workload()
    assert parallel.pipeline_layout.describe() == "Et|(tt|)*62tL" and parallel.vpp == 8
    allowance = MemoryAllowance.for_allocator(layout.expandable_segments)
    stages = memory_per_stage(model, parallel, workload, ActivationOptions(), allowance, padded_vocab(model, 8))
    measured = {}
    for path in (folder / "runs").glob("rank_*.jsonl"):
        record = json.loads(path.read_text().splitlines()[0])
        assert record["status"] == "ok" and record["stand_in"]
        measured[record["rank"] // (parallel.num_gpus // parallel.pp)] = record["measured"]
    assert sorted(measured) == list(range(8))
    return [
        (
            s.allocated_bytes / GIB,
            measured[s.stage]["max_allocated_gib"],
            (s.total_bytes - s.non_torch_bytes) / GIB,
            measured[s.stage]["max_reserved_gib"],
        )
        for s in stages
    ]


def test_every_stage_of_the_uneven_layout_is_predicted_within_3pct_in_bf16():
    rows = _stages("stand_in_405b_bf16")
    for pred_alloc, alloc, pred_res, res in rows:
        assert pred_alloc / alloc - 1 == pytest.approx(0, abs=0.02)
        assert pred_res / res - 1 == pytest.approx(0, abs=0.03)
    # the embedding / loss stages hold one layer fewer: both lighter than stage 1, as measured
    assert rows[0][1] < rows[1][1] and rows[7][1] < rows[6][1]


def test_the_fp8_recipe_holds_less_than_predicted_its_fp8_activations_are_not_modelled():
    """Pins the known miss (README): +7..+10% on every stage, from activations TE keeps in fp8."""
    fp8 = _stages("stand_in_405b")
    bf16 = _stages("stand_in_405b_bf16")
    for (pred_alloc, alloc, pred_res, res), (bf_pred, bf_alloc, _, _) in zip(fp8, bf16, strict=True):
        assert pred_alloc == pytest.approx(bf_pred)  # the model sees no difference
        assert 0.06 < pred_alloc / alloc - 1 < 0.10 and 0.06 < pred_res / res - 1 < 0.10
        assert alloc < bf_alloc - 4.0  # the fp8 run holds over 4 GiB less per stage
