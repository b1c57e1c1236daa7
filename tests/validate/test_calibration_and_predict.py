"""Predictions through the cost model, memory-edge layer counts, calibration files (pure Python)."""

import json
from dataclasses import replace
from pathlib import Path

import pytest

from megatron_autotuner.validate.calibration import (
    calibration_from_rows,
    layer_model_flops,
    solve_layer_time_ms,
    write_calibration,
)
from megatron_autotuner.validate.layout import Layout
from megatron_autotuner.validate.predict import edge_num_layers, estimate_layout, predict

pytest.importorskip("megatron_autotuner.costmodel")

# PyTorch's default allocator: the calibration tests below compare it with expandable segments
LAY = Layout(
    model="Qwen3-8B", seq_length=4096, num_gpus=2, tp=2, num_layers=4, global_batch_size=8, expandable_segments=False
)


def test_predict_is_for_the_reduced_model():
    full = predict(LAY.replace(num_layers=None), "H200")
    reduced = predict(LAY, "H200")
    assert "error" not in reduced and reduced["fits"] is True
    assert reduced["step_time_s"] < full["step_time_s"] and reduced["peak_memory_gib"] < full["peak_memory_gib"]
    bad = predict(LAY.replace(num_layers=3, pp=2, tp=1, sequence_parallel=False), "H200")
    assert "error" in bad


def test_memory_edge():
    one = Layout(model="Qwen3-8B", seq_length=4096)
    fit, oom = edge_num_layers(one, "H200", "max-fit"), edge_num_layers(one, "H200", "min-oom")
    assert oom == fit + 1
    assert estimate_layout(one.replace(num_layers=fit), "H200").fits
    assert not estimate_layout(one.replace(num_layers=oom), "H200").fits
    pp2 = Layout(model="Qwen3-8B", seq_length=4096, num_gpus=2, pp=2, global_batch_size=2)
    assert edge_num_layers(pp2, "H200", "max-fit") % 2 == 0


def _ok_row(layout, step_s, alloc=10.0, reserved=11.0, non_torch=1.5):
    return {"layout_id": layout.layout_id, "layout": layout.to_dict(), "status": "ok",
            "env": {"device": "NVIDIA H200", "torch": "2.11"}, "measured": {"step_time_s": step_s},
            "predicted": {"memory_breakdown_gib": {"activations": 4.0}},
            "per_rank": [{"rank": 0, "max_allocated_gib": alloc, "max_reserved_gib": reserved,
                          "non_torch_gib": non_torch}]}  # fmt: skip


def test_calibration_reproduces_measured_step(tmp_path):
    from megatron_autotuner.costmodel import load_calibration

    predicted = estimate_layout(LAY, "H200").step_time_s
    measured = 1.3 * predicted
    path = tmp_path / "cal.json"
    doc = write_calibration([_ok_row(LAY, measured)], "H200", path)
    assert doc["kind"] == "megatron-autotuner-calibration" and doc["ops"] == [] and len(doc["layers"]) == 1
    assert doc["layers"][0]["model"] == "Qwen3-8B" and doc["layers"][0]["phase"] == "fwd+bwd"
    # fragmentation: (reserved - allocated) / predicted activations = 1 GiB / 4 GiB
    assert doc["memory"] == {
        "non_torch_gib": 1.5,
        "fragmentation_fraction": pytest.approx(0.25),
        "expandable_segments": False,
    }
    cal = load_calibration(path)
    again = estimate_layout(LAY, "H200", cal).step_time_s
    assert again == pytest.approx(measured, rel=0.01)
    assert json.loads(path.read_text())["gpu"] == "H200"
    # a layer measured in bf16 says nothing of the same layer in fp8: the fp8 layout keeps its default
    assert doc["layers"][0]["precision"] == "bf16"
    fp8 = replace(LAY, precision="fp8")
    assert estimate_layout(fp8, "H200", cal).step_time_s == pytest.approx(estimate_layout(fp8, "H200").step_time_s)


def test_calibration_needs_successful_runs(tmp_path):
    from megatron_autotuner.errors import ConfigError

    with pytest.raises(ConfigError, match="no successful"):
        write_calibration([{"status": "failed", "layout": LAY.to_dict()}], "H200", tmp_path / "c.json")


EVIDENCE = Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "validation_h200_x2" / "x2"


def test_calibration_round_trip_on_h200_evidence():
    """In sample: the calibration `mat validate --write-calibration` makes from the committed H200 x2
    runs must give back every ok layout's measured step (within 5%; layouts sharing a layer key get
    the median of their solved times). Qwen3-30B-A3B ep=1 DP2 was +82%: its 2.4 G expert gradients
    are exposed over DP at small probe times and hidden at the answer, so a two-probe line missed."""
    from megatron_autotuner.costmodel import calibration_from_dict
    from megatron_autotuner.specs import get_gpu_spec
    from megatron_autotuner.validate.predict import compare
    from megatron_autotuner.validate.results import aggregate

    if not (EVIDENCE / "runs").is_dir():
        pytest.skip("H200 evidence not in this checkout")
    gpu = json.loads((EVIDENCE / "layouts.json").read_text())["gpu"]
    layouts = [Layout.from_dict(e["layout"]) for e in json.loads((EVIDENCE / "layouts.json").read_text())["layouts"]]
    measured = aggregate(EVIDENCE)
    rows = [compare(lay, measured.get(lay.layout_id), predict(lay, gpu), get_gpu_spec(gpu)) for lay in layouts]
    ok = [r for r in rows if r["status"] == "ok"]
    assert len(ok) >= 14 and any(r["label"] == "30B-A3B s4096 dp2" for r in ok)
    doc = calibration_from_rows(rows, gpu)
    assert all(e["model_flops"] > 0 for e in doc["layers"])
    cal = calibration_from_dict(json.loads(json.dumps(doc)), "<evidence>")
    errors = {}
    for r in ok:
        lay = Layout.from_dict(r["layout"])
        errors[r["label"]] = estimate_layout(lay, gpu, cal).step_time_s / r["measured"]["step_time_s"] - 1.0
    bad = {k: f"{v:+.1%}" for k, v in errors.items() if abs(v) > 0.05}
    assert not bad, bad
    # the layouts alone under their key come back exactly
    assert abs(errors["30B-A3B s4096 dp2"]) < 1e-6 and abs(errors["30B-A3B s4096 ep2"]) < 1e-6


def test_solve_handles_hidden_gradient_reduce():
    """The step is piecewise linear in the layer time (DP communication hides under the backward
    once that is long enough): the solve must land on the root, not on a line through two probes."""
    lay = Layout(model="Qwen3-30B-A3B", num_layers=4, num_gpus=2, seq_length=4096, global_batch_size=4)
    for measured in (0.14, 0.3777, 1.0):  # 0.14 s: a layer of 2.4 ms, too short to hide the gradient reduce
        t = solve_layer_time_ms(lay, measured, "H200", 2)
        doc = calibration_from_rows([_ok_row(lay, measured)], "H200")
        assert doc["layers"][0]["time_ms"] == pytest.approx(t)
        from megatron_autotuner.costmodel import calibration_from_dict

        again = estimate_layout(lay, "H200", calibration_from_dict(doc)).step_time_s
        assert again == pytest.approx(measured, rel=1e-6)
    assert solve_layer_time_ms(lay, 1e-4, "H200", 2) is None  # shorter than the rest of the step


def test_layer_model_flops_match_the_testbench_convention():
    from megatron_autotuner.testbench.cases import Case
    from megatron_autotuner.testbench.estimates import estimate_case

    for model, kw in (("Qwen3-8B", {"tp": 2}), ("Qwen3-8B", {"cp": 2}), ("Qwen3-30B-A3B", {"ep": 2})):
        lay = Layout(model=model, num_layers=4, num_gpus=2, seq_length=4096, global_batch_size=8, **kw)
        est = estimate_case(Case(model=model, op="decoder", seq_length=4096, **kw))
        assert layer_model_flops(lay) == pytest.approx(est["fwd_bwd_flops"])
        assert layer_model_flops(lay.replace(mode="forward")) == pytest.approx(est["fwd_flops"])


def test_calibration_solves_with_the_runs_own_gradient_accumulation_fusion():
    """A run without gradient-accumulation fusion pays the fp32 cast-add outside the decoder layers: the
    solved layer time must not absorb it, whichever machine writes the calibration."""
    from megatron_autotuner.costmodel import calibration_from_dict

    predicted = estimate_layout(LAY, "H200", gradient_accumulation_fusion=True).step_time_s
    rows = {fused: {**_ok_row(LAY, 1.3 * predicted), "gradient_accumulation_fusion": fused} for fused in (True, False)}
    docs = {fused: calibration_from_rows([row], "H200") for fused, row in rows.items()}
    assert docs[False]["layers"][0]["time_ms"] < docs[True]["layers"][0]["time_ms"]
    for fused, doc in docs.items():
        again = estimate_layout(LAY, "H200", calibration_from_dict(doc), gradient_accumulation_fusion=fused)
        assert again.step_time_s == pytest.approx(1.3 * predicted, rel=0.01)


def test_bad_calibration_layer_gets_a_one_line_error_naming_the_field():
    from megatron_autotuner.costmodel import calibration_from_dict
    from megatron_autotuner.errors import ConfigError

    layer = {"model": "Qwen3-8B", "num_gpus": 2, "tp": 2, "cp": 1, "ep": 1, "sequence_parallel": True,
             "seq_length": 4096, "micro_batch_size": 1, "phase": "fwd+bwd", "time_ms": 10.0,
             "model_flops": 1e12}  # fmt: skip
    doc = {"kind": "megatron-autotuner-calibration", "schema_version": 1, "gpu": "H200", "ops": []}
    assert calibration_from_dict({**doc, "layers": [layer]}).layers[0].precision == "bf16"  # absent: bf16
    bad = [({**layer, "precision": "fp4"}, "layers[0].precision: must be bf16 or fp8, got 'fp4'"),
           ({k: v for k, v in layer.items() if k != "num_gpus"}, "layers[0].num_gpus: is required")]  # fmt: skip
    for row, message in bad:
        with pytest.raises(ConfigError) as err:
            calibration_from_dict({**doc, "layers": [row]})
        assert message in str(err.value) and "\n" not in str(err.value)


def test_calibration_keeps_one_memory_allowance_per_allocator(tmp_path):
    """Runs with and without expandable segments leave very different reserved-unallocated memory (0.18 vs
    0.034 x activations on H200): a calibration from both keeps one block per setting, and a prediction uses
    the block of its own setting; a file without settings applies to both; one from a single setting leaves
    the other setting at the cost model's default."""
    from megatron_autotuner.costmodel import CostOptions, calibration_from_dict, load_calibration
    from megatron_autotuner.errors import ConfigError
    from megatron_autotuner.theory.memory import MemoryAllowance

    step = estimate_layout(LAY, "H200").step_time_s
    expandable = LAY.replace(expandable_segments=True)
    rows = [_ok_row(LAY, step, reserved=12.0), _ok_row(expandable, step, reserved=10.2)]
    path = tmp_path / "mixed.json"
    doc = write_calibration(rows, "H200", path)
    assert [(m["expandable_segments"], m["fragmentation_fraction"]) for m in doc["memory"]] == [
        (False, pytest.approx(0.5)),
        (True, pytest.approx(0.05)),
    ]
    cal = load_calibration(path)
    assert cal.memory_for(False).fragmentation_fraction == pytest.approx(0.5)
    assert cal.memory_for(True).fragmentation_fraction == pytest.approx(0.05)
    assert CostOptions(calibration=cal, expandable_segments=True).memory_allowance.fragmentation_fraction == (
        pytest.approx(0.05)
    )
    only_default = calibration_from_dict({**doc, "memory": doc["memory"][0]})
    assert CostOptions(calibration=only_default, expandable_segments=True).memory_allowance == (
        MemoryAllowance.for_allocator(True)
    )
    unstated = calibration_from_dict({**doc, "memory": {"non_torch_gib": 2.0, "fragmentation_fraction": 0.1}})
    assert unstated.memory_for(True) == unstated.memory_for(False) == MemoryAllowance(2.0, 0.1)
    with pytest.raises(ConfigError, match=r"memory: has two blocks"):
        calibration_from_dict({**doc, "memory": [doc["memory"][0], doc["memory"][0]]})
    with pytest.raises(ConfigError, match=r"memory\[1\]\.expandable_segments: must be true or false"):
        calibration_from_dict({**doc, "memory": [doc["memory"][0], {**doc["memory"][1], "expandable_segments": "y"}]})
