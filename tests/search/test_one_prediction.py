"""One prediction: `mat plan`, `mat estimate` and `mat validate --dry-run` give the same step time and peak memory for
the same layout and run settings, because the plan's layouts carry its assumptions into what the runner executes."""

from __future__ import annotations

import json

import pytest

from megatron_autotuner.cli import main
from megatron_autotuner.costmodel.estimate import CostOptions
from megatron_autotuner.search import SearchSpace, plan
from megatron_autotuner.specs import get_gpu_spec, load_model_spec
from megatron_autotuner.validate.layout import Layout
from megatron_autotuner.validate.predict import predict

CASES = [
    # (model, layers, gpus, seq, gbs, options, tp_comm_overlap)
    ("Qwen3-8B", None, 4, 8192, 8, CostOptions(), False),
    ("Qwen3-8B", 8, 8, 4096, 16, CostOptions(fused_cross_entropy=True), True),
    ("Qwen3-30B-A3B", 4, 4, 4096, 16, CostOptions(gradient_accumulation_fusion=False), False),
]


def estimate_args(c, model: str, layers: int | None, gpu: str, lay: Layout) -> list[str]:
    """`mat estimate` flags of a planned candidate and its run settings."""
    p, w = c.parallel, c.workload
    args = ["estimate", "--json", "--model", model, "--gpu", gpu, "--num-gpus", str(p.num_gpus)]
    args += ["--tp", str(p.tp), "--pp", str(p.pp), "--cp", str(p.cp), "--ep", str(p.ep)]
    args += ["--seq-len", str(w.seq_length), "--micro-batch-size", str(w.micro_batch_size)]
    args += ["--global-batch-size", str(w.global_batch_size), "--recompute", w.recompute.granularity]
    if layers:
        args += ["--num-layers", str(layers)]
    if p.etp is not None:
        args += ["--etp", str(p.etp)]
    if p.pipeline_layout is not None:
        args += ["--pipeline-layout", p.pipeline_layout.to_string()]
    elif p.vpp:
        args += ["--vpp", str(p.vpp)]
    args.append("--sp" if p.sequence_parallel else "--no-sp")
    args.append("--distributed-optimizer" if p.use_distributed_optimizer else "--no-distributed-optimizer")
    if p.tp_comm_overlap:
        args.append("--tp-comm-overlap")
    if lay.cross_entropy_fusion:
        args.append("--cross-entropy-fusion")
    if not lay.gradient_accumulation_fusion:
        args.append("--no-gradient-accumulation-fusion")
    return args


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-{c[2]}gpu-overlap{c[6]}")
def test_plan_estimate_and_validate_predict_the_same(case, capsys):
    model, layers, gpus, seq, gbs, options, overlap = case
    spec = load_model_spec(model)
    spec = spec.with_num_layers(layers) if layers else spec
    gpu = "H200"
    # planned as `mat plan --validate` plans: without the EP all-to-all overlap, which the runner does not run
    space = SearchSpace(moe_a2a_overlap=False)
    result = plan(spec, get_gpu_spec(gpu), gpus, seq, gbs, options=options, tp_comm_overlap=overlap, space=space)
    top = result.top(4)
    if overlap:
        assert any(c.parallel.tp_comm_overlap for c in result.candidates)
    for c in top:
        lay = Layout.from_configs(model, c.parallel, c.workload, num_layers=layers, options=result.options)
        assert lay.tp_comm_overlap == c.parallel.tp_comm_overlap
        assert lay.cross_entropy_fusion == options.fused_cross_entropy
        validated = predict(lay, gpu)
        assert validated["step_time_s"] == pytest.approx(c.estimate.step_time_s, rel=1e-12), c.label
        assert validated["peak_memory_gib"] == pytest.approx(c.estimate.peak_memory_gib, rel=1e-12), c.label
        assert main(estimate_args(c, model, layers, gpu, lay)) == 0
        estimated = json.loads(capsys.readouterr().out)
        assert estimated["step_time_s"] == pytest.approx(c.estimate.step_time_s, rel=1e-12), c.label
        assert estimated["peak_memory_gib"] == pytest.approx(c.estimate.peak_memory_gib, rel=1e-12), c.label


def test_the_plans_defaults_are_what_the_runner_executes():
    """Without flags the plan assumes what Megatron-LM and `mat validate` run without flags: the unfused loss, an eager
    (host-bound) MoE block, no TP-communication overlap."""
    options = CostOptions()
    assert not options.fused_cross_entropy and options.moe_host_bound
    spec = load_model_spec("Qwen3-8B")
    result = plan(spec, get_gpu_spec("H200"), 4, 8192, 8)
    assert not any(c.parallel.tp_comm_overlap for c in result.candidates)
    lay = Layout.from_configs("Qwen3-8B", result.best.parallel, result.best.workload, options=result.options)
    assert not lay.tp_comm_overlap and not lay.cross_entropy_fusion and lay.gradient_accumulation_fusion


def test_a_layout_refuses_overlap_without_sequence_parallelism():
    from megatron_autotuner.errors import ConfigError

    with pytest.raises(ConfigError, match="tp_comm_overlap"):
        Layout(model="Qwen3-0.6B", seq_length=1024, num_gpus=2, tp=2, sequence_parallel=False, tp_comm_overlap=True)
    with pytest.raises(ConfigError, match="tp_comm_overlap_cfg"):
        Layout(model="Qwen3-0.6B", seq_length=1024, num_gpus=2, tp=2, tp_comm_overlap_cfg="ub.yaml")


def test_the_runner_refuses_what_it_cannot_run():
    """A layout that asks for gradient-accumulation fusion where APEX is missing, or for userbuffers without CUDA, is
    refused with the reason: the prediction assumed them."""
    from megatron_autotuner.errors import ConfigError
    from megatron_autotuner.validate.runner import (
        apex_wgrad_fusion_available,
        config_overrides,
        gradient_accumulation_fusion,
    )

    fused = Layout(model="Qwen3-0.6B", seq_length=1024, gradient_accumulation_fusion=True)
    if not apex_wgrad_fusion_available():
        with pytest.raises(ConfigError, match="APEX"):
            gradient_accumulation_fusion(fused, use_te=True, cuda=True)
    assert gradient_accumulation_fusion(fused.replace(gradient_accumulation_fusion=False), True, True) is False
    overlap = Layout(model="Qwen3-0.6B", seq_length=1024, num_gpus=2, tp=2, tp_comm_overlap=True)
    with pytest.raises(ConfigError, match="tp_comm_overlap"):
        config_overrides(overlap, use_te=False, device="cpu")
    ce = config_overrides(Layout(model="Qwen3-0.6B", seq_length=1024, cross_entropy_fusion=True), False, "cpu")
    assert ce["cross_entropy_loss_fusion"] is True


def test_plan_validate_ran_exactly_the_ranked_layouts_on_4x_h100():
    """`mat plan --validate 2` on a 4x H100 lease (benchmarks/validation/x4_plan_validate.sh): the layouts that ran
    are the plan's top 2 as re-planned here (same ids), the runner predicted them as the plan did then (both stored
    at the run; today's model may differ), and what plan.json records beside them (measured steps, winner, regret)
    is what `plan_measured` makes of the runs."""
    from pathlib import Path

    from megatron_autotuner.validate.batch import ValidationReport, plan_layouts, plan_measured, planned_candidates

    root = Path(__file__).resolve().parents[2] / "benchmarks/results/plan_validate_h100_x4/plan"
    committed = json.loads((root / "plan.json").read_text())
    rows = [json.loads(line) for line in (root / "validate/results.jsonl").read_text().splitlines()]
    # the lease had no APEX: the plan ranked without gradient-accumulation fusion, and said so; it ran before the plan
    # assumed expandable segments
    assert any("APEX" in note for note in committed["notes"])
    result = plan(load_model_spec("Qwen3-1.7B"), get_gpu_spec("H100-SXM"), 4, 4096, 16,
                  options=CostOptions(gradient_accumulation_fusion=False, expandable_segments=False))  # fmt: skip
    layouts = plan_layouts(result, 2, None, "Qwen3-1.7B", None, steps=5, warmup_steps=3)[:2]
    assert [lay.layout_id for lay in layouts] == [row["layout_id"] for row in rows]
    for row, planned in zip(rows, committed["validation"]["layouts"], strict=True):
        assert row["predicted"]["step_time_s"] == pytest.approx(planned["predicted_step_time_s"], rel=1e-9)
    report = ValidationReport(root / "validate", tuple(rows), (), {})
    measured = plan_measured(planned_candidates(result, 2)[:2], report, layouts)
    for mine, theirs in zip(measured["layouts"][:2], committed["validation"]["layouts"], strict=True):
        assert mine.keys() == theirs.keys()
        for key in ("rank", "label", "status", "error", "measured_step_time_s", "measured_peak_memory_gib"):
            value = theirs[key]
            assert mine[key] == (pytest.approx(value) if isinstance(value, float) else value), key
    assert measured["measured_best"]["rank"] == 1 and measured["regret"] == 0.0
    assert committed["validation"]["regret"] == 0.0


def test_a_userbuffers_yaml_without_tp_overlap_is_one_line(tmp_path, capsys):
    ub = tmp_path / "ub.yaml"
    ub.write_text("qkv_fprop:\n  method: ring_exchange\n")
    args = ["plan", "--model", "Qwen3-0.6B", "--gpu", "H100-SXM", "--num-gpus", "2", "--seq-len", "1024"]
    args += ["--global-batch-size", "2", "--no-chart", "--output-dir", str(tmp_path / "p"), "--tp-comm-overlap-cfg"]
    assert main([*args, str(ub)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == ("mat: error: tp_comm_overlap_cfg: goes with --tp-comm-overlap (the yaml configures TE userbuffers)")
    assert main([*args, str(ub), "--tp-comm-overlap", "--json"]) == 0


def test_run_setting_flags_bad_input_is_one_line(tmp_path, capsys):
    """A launch says its own run settings: the tool's flags beside --megatron-args are refused in one line, as is
    TP overlap without sequence parallelism in `mat validate`."""
    launch = ["--megatron-args", "examples/llama31_8b_h100_8gpu.sh", "--gpu", "H100-SXM"]
    assert main(["estimate", *launch, "--cross-entropy-fusion"]) == 2
    assert capsys.readouterr().err.strip() == (
        "mat: error: cross_entropy_fusion: goes in the Megatron-LM launch (--cross-entropy-loss-fusion) with "
        "--megatron-args"
    )
    assert main(["plan", *launch, "--tp-comm-overlap", "--output-dir", str(tmp_path / "p")]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "mat: error: tp_comm_overlap: goes in the Megatron-LM launch (--tp-comm-overlap) with --megatron-args"
    ]
    bad = ["validate", "--model", "Qwen3-0.6B", "--num-gpus", "2", "--tp", "2", "--no-sp", "--tp-comm-overlap"]
    assert main([*bad, "--seq-len", "1024", "--dry-run", "--output-dir", str(tmp_path / "v")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("mat: error: tp_comm_overlap: needs sequence_parallel")
