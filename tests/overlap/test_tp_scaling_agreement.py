"""`mat plan` and the overlap tuner report TP scaling with one definition (costmodel.tp_scaling) fed by the same
collective curves, and the tuner's measured verdict is explained by what its op timings hold."""

import json
from pathlib import Path

import pytest

from megatron_autotuner.costmodel.tp_scaling import TP_SCALING_TOLERANCE, predicted_tp_scaling
from megatron_autotuner.overlap.config import OverlapTunerConfig
from megatron_autotuner.overlap.scaling import predicted_scaling, scaling_check
from megatron_autotuner.search.plan import plan
from megatron_autotuner.specs import get_gpu_spec, load_model_spec

ROOT = Path(__file__).resolve().parents[2]
REPORT = json.loads((ROOT / "benchmarks/results/overlap_h200_x2/tuning_report.json").read_text())


def _measured(model, tp):
    return next(s for s in REPORT["summaries"] if s["model"] == model and s["tp"] == tp)


def test_one_tolerance():
    assert (
        OverlapTunerConfig(models=("Qwen3-8B",)).scaling_tolerance
        == TP_SCALING_TOLERANCE
        == REPORT["config"]["scaling_tolerance"]
    )


@pytest.mark.parametrize("model", ["Llama-3.1-8B", "Qwen3-8B"])
def test_plan_reports_the_tuners_verdict(model):
    """Plan's JSON carries the check the tuner applies (same rule, same times): they agree size by size."""
    result = plan(load_model_spec(model), get_gpu_spec("H200"), 8, 8192, 64)
    reported = result.to_dict(top_k=1)["tp_scaling"]
    tuner, pred = predicted_scaling(model, "H200", 8192)
    assert reported["largest_efficient_tp"] == tuner.largest_efficient_tp == pred.largest_efficient_tp
    assert [(p["tp"], p["efficient"]) for p in reported["points"]] == [(p.tp, p.efficient) for p in tuner.points]
    assert [p["time_ms"] for p in reported["points"]] == pytest.approx([p.time_ms for p in tuner.points])


@pytest.mark.parametrize("model", ["Llama-3.1-8B", "Qwen3-8B"])
def test_predicted_tp1_is_the_tuners_measured_tp1(model):
    """The check prices the quantity the tuner measures: the four GEMM ops of a layer, fwd + bwd, at TP=1."""
    measured = _measured(model, 1)["layer"]["nccl_ms"]
    pred = predicted_tp_scaling(load_model_spec(model), get_gpu_spec("H200"), 8192, 8192, (2,))
    assert pred.tp1_ms == pytest.approx(measured, rel=0.03)


@pytest.mark.parametrize("model", ["Llama-3.1-8B", "Qwen3-8B"])
def test_measured_verdict_differs_by_the_per_op_fixed_cost(model):
    """Measured on 2x H200 TP=2 is 24-26% over ideal (recommended TP 1); predicted 6-11% (TP 2 scales; the upper
    end with the compute the hidden NCCL collectives slow, `defaults.NCCL_OVERLAP_COST`). The gap is
    in the GEMM ops timed from an idle GPU, not in the collectives: the TP=2 ops took more than half their TP=1
    time plus the predicted exposed communication, for every op."""
    tp1, tp2 = _measured(model, 1), _measured(model, 2)
    measured = REPORT["scaling"][model]
    assert measured["recommended_tp"] == 1
    tuner, pred = predicted_scaling(model, "H200", 8192, (2,))
    assert tuner.largest_efficient_tp == 2 and pred.points[0].time_ms / pred.points[0].ideal_ms - 1 < 0.12
    comm_ms = pred.points[0].exposed_comm_ms
    assert comm_ms < 1.0
    for op in ("qkv", "proj", "fc1", "fc2"):
        assert tp2["ops"][op]["nccl_ms"] > tp1["ops"][op]["nccl_ms"] / 2
    gap = tp2["layer"]["nccl_ms"] - tp1["layer"]["nccl_ms"] / 2
    assert gap > 1.5 * comm_ms
    # the same rule on the measured times gives the committed verdict
    best = min(v for k, v in tp2["layer"].items() if v)
    assert scaling_check("layer", tp1["layer"]["nccl_ms"], {2: (best, "tuned", None)}).largest_efficient_tp == 1


def _tp1_layer_check() -> dict:
    """The whole TE layer at TP 1, seq 8192, fwd + bwd, timed by the layer check itself on one H200
    (benchmarks/results/validation_h200_x1/host_probe/layer_check_tp1.json, `h200_x1_host_probe.sh layers`): the
    committed 2x H200 layer check ran at TP 2 only."""
    return json.loads((ROOT / "benchmarks/results/validation_h200_x1/host_probe/layer_check_tp1.json").read_text())


def _tp1_testbench() -> dict:
    """The same layer as the testbench's `decoder` of the 2x H200 machine (benchmarks/results/testbench_h200_x2/rerun/
    dense_fused; with RoPE), in the layer check's format."""
    path = ROOT / "benchmarks/results/testbench_h200_x2/rerun/dense_fused/collect/rank_0.jsonl"
    models = {}
    for line in path.read_text().splitlines():
        rec = json.loads(line)
        case = rec.get("case", {})
        if rec.get("status") == "ok" and case.get("op") == "decoder" and case["tp"] == 1 and case["seq_length"] == 8192:
            models[case["model"]] = {"status": "ok", "median_ms": {"nccl": rec["real"]["fwd_bwd_ms"]["median"]}}
    return {"tp": 1, "seq_len": 8192, "models": models}


@pytest.mark.parametrize(("model", "over_ideal"), [("Llama-3.1-8B", 0.046), ("Qwen3-8B", 0.158)])
def test_whole_layers_scale_to_tp2_as_plan_predicts(model, over_ideal):
    """Timed as whole layers, where the host issues the GEMMs ahead of the GPU as in a step, TP=2 with the tuned
    userbuffers is 5% (Llama-3.1-8B) and 16% (Qwen3-8B) over ideal: within the 20% tolerance, efficient, as `mat plan`
    predicts, where the GEMMs timed one at a time were 24-26% over. The testbench's TP 1 layer of the 2x machine
    gives the same verdict (6% / 12%)."""
    from megatron_autotuner.overlap.scaling import whole_layer_scaling

    tp2 = json.loads((ROOT / "benchmarks/results/overlap_h200_x2/layer_check.json").read_text())
    tuner, pred = predicted_scaling(model, "H200", 8192, (2,))
    for tp1, expected in ((_tp1_layer_check(), over_ideal), (_tp1_testbench(), None)):
        whole = whole_layer_scaling([tp1, tp2], model)
        (point,) = whole.points
        assert point.tp == 2 and point.setup == "tuned"
        if expected is not None:
            assert point.time_ms / point.ideal_ms - 1 == pytest.approx(expected, abs=0.005)
        assert whole.largest_efficient_tp == tuner.largest_efficient_tp == pred.largest_efficient_tp == 2
    assert REPORT["scaling"][model]["recommended_tp"] == 1  # the GEMM-level verdict the committed report gave


def test_the_report_recommends_by_the_whole_layer_when_it_has_it():
    from megatron_autotuner.overlap import analyze_run
    from megatron_autotuner.overlap.report import build_report

    ev = ROOT / "benchmarks/results/overlap_h200_x2"
    config = json.loads((ev / "config.json").read_text())
    tp2 = json.loads((ev / "layer_check.json").read_text())
    report = build_report(analyze_run(ev, with_traces=False), config, config["noise_frac"], [_tp1_layer_check(), tp2])
    for model in ("Llama-3.1-8B", "Qwen3-8B"):
        sc = report["scaling"][model]
        assert sc["recommended_tp"] == 2
        assert sc["reason"].startswith("whole layer scales to TP=2") and "one at a time said TP=1" in sc["reason"]
        assert [r["name"] for r in sc["results"]][-2:] == ["layer", "whole layer"]
    # without a TP 1 layer check (the committed folder has TP 2 only), the GEMMs decide, as before
    plain = build_report(analyze_run(ev, with_traces=False), config, config["noise_frac"])["scaling"]
    for model, sc in plain.items():
        assert sc["recommended_tp"] == REPORT["scaling"][model]["recommended_tp"] == 1
        assert "whole layer" not in [r["name"] for r in sc["results"]]


def test_tp4_plan_and_tuner_give_the_same_verdict():
    """4x H200 (benchmarks/overlap/h200_x4.sh): the Qwen3-8B layer at TP 4, seq 8192, with the tuned userbuffers is
    97% over ideal as a whole layer (9.48 ms vs 19.25 ms / 4 at TP 1, the same machine) and its GEMMs 110% over: TP 4
    does not scale. `mat plan` says the same of TP 4 (over the 20% tolerance), and keeps TP 2 efficient as the 2x H200
    tuning measured. The plan's TP 4 layer is still optimistic (4.1 ms against the GEMMs' measured 7.1 ms): the per-op
    fixed cost the TP 2 check found grows with TP."""
    from megatron_autotuner.overlap.scaling import whole_layer_scaling

    ev = ROOT / "benchmarks/results/overlap_h200_x4"
    report = json.loads((ev / "tuning_report.json").read_text())
    checks = [json.loads((ev / name).read_text()) for name in ("layer_check_tp1.json", "layer_check.json")]
    whole = whole_layer_scaling(checks, "Qwen3-8B")
    (point,) = whole.points
    assert point.tp == 4 and point.setup == "tuned"
    assert point.time_ms / point.ideal_ms - 1 == pytest.approx(0.97, abs=0.01)
    assert whole.largest_efficient_tp == 1 == report["scaling"]["Qwen3-8B"]["recommended_tp"]
    tuner, pred = predicted_scaling("Qwen3-8B", "H200", 8192, (2, 4))
    verdicts = {p.tp: p.efficient for p in pred.points}
    assert verdicts == {2: True, 4: False}  # the plan: TP 4 does not scale either
    assert [p.efficient for p in tuner.points] == [p.efficient for p in pred.points]
    result = plan(load_model_spec("Qwen3-8B"), get_gpu_spec("H200"), 4, 8192, 8)
    assert {p["tp"]: p["efficient"] for p in result.to_dict(top_k=1)["tp_scaling"]["points"]} == verdicts
