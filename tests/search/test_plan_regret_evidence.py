"""The ranking benchmark on 4x H200 (benchmarks/plan_regret.py, benchmarks/validation/x4_plan_regret.sh): four cases,
the plan's top 4 and two lower-ranked layouts each, predicted before the lease. Today's plan still puts first the
layout the lease measured as #1, whose regret (its measured step over the fastest measured, less one) is within 3%."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from megatron_autotuner.search import plan
from megatron_autotuner.specs import get_gpu_spec

ROOT = Path(__file__).resolve().parents[2]
SPEC = importlib.util.spec_from_file_location("plan_regret", ROOT / "benchmarks/plan_regret.py")
plan_regret = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(plan_regret)
REPORT = json.loads((ROOT / "benchmarks/results/plan_regret.json").read_text())
(LEASE,) = [lease for lease in REPORT["leases"] if lease["folder"] == "plan_regret_h200_x4"]


def _round_cases(folder: str) -> list[dict]:
    """A round's cases as `plan_regret.py report` makes them from its runs, checked against the committed report."""
    (lease,) = [lease for lease in REPORT["leases"] if lease["folder"] == folder]
    kind_dir = plan_regret.RESULTS / folder
    predicted = json.loads((kind_dir / "predicted.json").read_text())
    cases = plan_regret.lease_cases(predicted, plan_regret._measured_rows(kind_dir))
    assert cases == lease["cases"]
    return cases


def test_the_committed_report_is_what_the_script_makes_of_the_runs():
    kind_dir = plan_regret.RESULTS / "plan_regret_h200_x4"
    predicted = json.loads((kind_dir / "predicted.json").read_text())
    cases = plan_regret.lease_cases(predicted, plan_regret._measured_rows(kind_dir))
    assert cases == LEASE["cases"]
    assert len(cases) == 4 and all(c["measured"] == c["planned"] == 6 for c in cases)


@pytest.mark.parametrize("case", plan_regret.CASES, ids=lambda c: c["case"])
def test_todays_first_choice_ran_within_3_percent_of_the_fastest(case):
    """The lease's #1 ran within 3% of the fastest; today's plan puts first a layout the lease ran, also within 3%.
    (In the E64 case the lease's #1, EP 2, ran 1.6% slower than DP 4 without EP, which today's plan, with the MoE
    dispatcher's measured kernels, puts first.)"""
    report = next(c for c in LEASE["cases"] if c["case"] == case["case"])
    assert report["regret"] <= 0.03
    result = plan(
        plan_regret.model_of(case), get_gpu_spec("H200"), plan_regret.NUM_GPUS, case["seq_length"],
        case["global_batch_size"], options=plan_regret.runner_options(),
    )  # fmt: skip
    measured = {lay["label"].split(" ", 2)[2]: lay["measured_step_time_s"] for lay in report["layouts"]}
    assert measured[result.best.label] <= 1.03 * min(measured.values())


def test_round_two_planned_with_the_overlap_cost_measured_its_dense_pick_best():
    """Round 2 (`plan_regret.CASES_R2`), planned and predicted by the model that charges hidden NCCL collectives
    (`defaults.NCCL_OVERLAP_COST`) before the runs: the dense case's #1 ran fastest, every step within 10% and every
    peak within 5%; the report is what the script makes of the runs."""
    cases = _round_cases("plan_regret_h200_x4_r2")
    dense = next(c for c in cases if c["case"] == "qwen3-8b-s4096")
    assert dense["measured"] == 6 and dense["regret"] == 0.0
    assert all(
        abs(lay["step_time_error"]) <= 0.10 and abs(lay["peak_memory_error"]) <= 0.05 for lay in dense["layouts"]
    )


def test_round_three_planned_with_the_measured_moe_dispatcher_ran_its_first_choice_fastest_or_within_3_percent():
    """Round 3 (`plan_regret.CASES_R3`: Mixtral-8x7B at 8 layers, Qwen3-30B-A3B's 128 experts at 8 layers, Qwen3-32B at
    16 layers), planned and predicted before the runs by the model with the MoE dispatcher's measured kernels
    (`benchmarks/moe_permute.py`) and the measured NVLink all-to-all / send-recv: every case's #1 measured fastest or
    within 3% of it, and every step within 10% except a full-recompute pipeline layout ranked #116."""
    cases = _round_cases("plan_regret_h200_x4_r3")
    assert [c["case"] for c in cases] == [c["case"] for c in plan_regret.CASES_R3]
    assert all(c["measured"] == c["planned"] == 6 and c["regret"] <= 0.03 for c in cases)
    misses = [lay["label"] for c in cases for lay in c["layouts"] if abs(lay["step_time_error"]) > 0.10]
    assert misses == ["qwen3-moe-e128-8l #116 tp1 pp2 vpp4 cp1 dp2 nosp mbs8 rc-full"]
    assert next(c for c in cases if c["case"] == "qwen3-moe-e128-8l")["spearman"] > 0.95


def test_round_five_dense_picks_ran_fastest_and_every_peak_came_within_5_percent():
    """Round 5 (`plan_regret.CASES_R5`, four shapes no run had, at full depth where the model fits), predicted before
    the lease and run on it: the two dense cases' #1 ran fastest with every step within 10%, and all 24 peaks (TP 4,
    CP 2 / 4, pp2 vpp5 / vpp6 and an uneven interleaved pipeline among them) came within 5% of the prediction. The MoE
    cases are the open misses of docs/accuracy.md: Qwen1.5-MoE's steps ran 9-23% over the prediction, and
    Moonlight's #1 (64 local experts, no EP) ran more than 3% slower than its #4 (EP 4)."""
    cases = _round_cases("plan_regret_h200_x4_r5")
    assert [c["case"] for c in cases] == [c["case"] for c in plan_regret.CASES_R5]
    assert all(c["measured"] == c["planned"] == 6 for c in cases)
    assert all(abs(lay["peak_memory_error"]) <= 0.05 for c in cases for lay in c["layouts"])
    by_case = {c["case"]: c for c in cases}
    for dense in ("qwen25-7b-s8192", "qwen3-1.7b-s16384"):
        assert by_case[dense]["regret"] == 0.0
        assert all(abs(lay["step_time_error"]) <= 0.10 for lay in by_case[dense]["layouts"])
    assert by_case["qwen15-moe-a2.7b"]["regret"] <= 0.03
    assert by_case["moonlight-8l"]["regret"] > 0.03  # known miss: the wait across ranks at each gather chain


def test_round_five_ran_after_its_predictions_and_as_predicted():
    """Every run of round 5 is later than its committed predictions and carries the same predicted step."""
    kind_dir = plan_regret.RESULTS / "plan_regret_h200_x4_r5"
    predicted = json.loads((kind_dir / "predicted.json").read_text())
    by_label = {row["label"]: row["predicted"] for row in predicted["rows"]}
    runs = [json.loads(line) for path in kind_dir.glob("*/results.jsonl") for line in path.open()]
    assert len(runs) == 24
    assert min(run["env"]["date"] for run in runs) > predicted["date"]
    for run in runs:
        assert run["predicted"]["step_time_s"] == pytest.approx(by_label[run["label"]]["step_time_s"], rel=1e-9)
