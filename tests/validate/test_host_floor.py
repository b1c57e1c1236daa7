"""`mat validate --measure-host-floor`: the testbench cases it runs, and the calibration it hands the predictions."""

import shutil
from pathlib import Path

from megatron_autotuner.costmodel import calibration_from_dict
from megatron_autotuner.specs import load_model_spec
from megatron_autotuner.validate import host_floor
from megatron_autotuner.validate.layout import Layout
from megatron_autotuner.validate.predict import predict

ROOT = Path(__file__).resolve().parents[2]
LEASE_C = ROOT / "benchmarks/results/validation_h100_x1/moe_host_floor/lease_c"
DENSE_LEASE = ROOT / "benchmarks/results/testbench_h100_x1/host_floor_unfused_rope"
MOE = dict(model="Qwen3-30B-A3B", num_layers=2, seq_length=4096, global_batch_size=8)


def test_cases_cover_each_local_expert_count_precision_and_recipe(tmp_path):
    layouts = [
        Layout(num_gpus=2, ep=2, precision="fp8", fp8_recipe="tensorwise", **MOE),
        Layout(num_gpus=1, **MOE),
        Layout(model="Qwen3-8B", num_layers=2, seq_length=4096, global_batch_size=8),  # dense: a decoder
        Layout(model="Qwen3-8B", num_layers=2, seq_length=4096, global_batch_size=8, micro_batch_size=2),
    ]
    cases = host_floor.host_floor_cases(layouts, tmp_path / "models")
    (decoder,) = [c for c in cases if c.op == "decoder"]
    assert (decoder.model, decoder.tp, decoder.micro_batch_size, decoder.dtype) == ("Qwen3-8B", 1, 1, "bf16")
    cases = [c for c in cases if c.op == "moe"]
    got = {
        (c.dtype, c.fp8_recipe if c.dtype == "fp8" else None, load_model_spec(c.model).num_moe_experts) for c in cases
    }
    assert got == {("fp8", "tensorwise", 128), ("fp8", "tensorwise", 64), ("bf16", None, 128)}
    assert all(c.op == "moe" and c.world_size == 1 and c.seq_length == 4096 for c in cases)
    # the 64-expert copy is the same model otherwise
    (variant,) = [c.model for c in cases if c.model != "Qwen3-30B-A3B"]
    assert Path(variant).parent == tmp_path / "models"
    full, half = load_model_spec("Qwen3-30B-A3B"), load_model_spec(variant)
    assert (half.hidden_size, half.moe_ffn_hidden_size, half.moe_router_topk) == (
        full.hidden_size,
        full.moe_ffn_hidden_size,
        full.moe_router_topk,
    )


def test_measured_floor_reaches_the_predictions(tmp_path, monkeypatch):
    """With the testbench stood in by lease c's committed H100 records, the floor fitted from them replaces the
    default in the predictions, and a calibration the user gave keeps everything else."""
    monkeypatch.chdir(ROOT)  # the committed records name the 64 / 32-expert models by repository paths

    def committed_records(cases, out_dir, **_):
        shutil.copytree(LEASE_C / "testbench" / "testbench_before" / "collect", Path(out_dir) / "collect")

    monkeypatch.setattr("megatron_autotuner.testbench.launcher.run_cases", committed_records)
    lay = Layout(num_gpus=1, **MOE)
    measured = host_floor.measure_host_floor([lay], "H100-SXM", tmp_path / "hf", log=lambda *_: None)
    assert (tmp_path / "hf" / "host_floor.calibration.json").is_file()
    assert {f.precision for f in measured.moe_host_floors} == {"bf16", "fp8"}
    default = predict(lay, "H100-SXM", gradient_accumulation_fusion=False)["step_time_s"]
    own = predict(lay, "H100-SXM", measured, gradient_accumulation_fusion=False)["step_time_s"]
    assert own < 0.95 * default  # lease c's host ran the block faster than the 2x H200 host
    given = calibration_from_dict(
        {"kind": "megatron-autotuner-calibration", "schema_version": 1, "gpu": "H100-SXM", "ops": []}
        | {"memory": {"non_torch_gib": 1.5, "fragmentation_fraction": 0.1}}
    )
    merged = host_floor.measure_host_floor([lay], "H100-SXM", tmp_path / "hf2", given, log=lambda *_: None)
    assert merged.memory == given.memory and merged.moe_host_floors == measured.moe_host_floors



def test_measured_dense_floor_reaches_the_predictions(tmp_path, monkeypatch):
    """The H100 lease's decoder records (host wall times of the forward / backward calls) become the dense floor of
    the predictions, and the testbench's cold single-layer GPU times do not calibrate the model."""

    def committed_records(cases, out_dir, **_):
        shutil.copytree(DENSE_LEASE / "collect", Path(out_dir) / "collect")

    monkeypatch.setattr("megatron_autotuner.testbench.launcher.run_cases", committed_records)
    lay = Layout(model="Qwen3-0.6B", seq_length=4096, global_batch_size=8)
    measured = host_floor.measure_host_floor([lay], "H100-SXM", tmp_path, log=lambda *_: None)
    bf16 = measured.dense_host_floor("bf16", "delayed", 1)
    assert 2e-3 < bf16.fwd_s < 6e-3 and 2e-3 < bf16.bwd_s < 6e-3
    assert measured.dense_host_floor("fp8", "tensorwise", 1).fp8_recipe == "tensorwise"
    assert not measured.layers and not measured.ops
    slower = calibration_from_dict(
        {"kind": "megatron-autotuner-calibration", "schema_version": 1, "gpu": "H100-SXM", "ops": []}
        | {"dense_host_floor": [{"precision": "bf16", "fwd_s": 2 * bf16.fwd_s, "bwd_s": 2 * bf16.bwd_s}]}
    )
    own = predict(lay, "H100-SXM", measured, gradient_accumulation_fusion=False)
    doubled = predict(lay, "H100-SXM", slower, gradient_accumulation_fusion=False)
    assert doubled["step_time_s"] > 1.3 * own["step_time_s"]  # Qwen3-0.6B at micro-batch 1 is host-bound


def test_no_host_bound_case_leaves_the_default(tmp_path, monkeypatch):
    import json

    def gpu_bound_records(cases, out_dir, **_):
        src = LEASE_C / "testbench" / "testbench_before" / "collect" / "rank_0.jsonl"
        (Path(out_dir) / "collect").mkdir(parents=True)
        rows = [json.loads(line) for line in src.read_text().splitlines()]
        rows = [r | {"real": r["real"] | {"fwd_ms": {"median": 0.5}, "bwd_ms": {"median": 1.0}}} for r in rows]
        (Path(out_dir) / "collect" / "rank_0.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))

    monkeypatch.chdir(ROOT)
    monkeypatch.setattr("megatron_autotuner.testbench.launcher.run_cases", gpu_bound_records)
    said = []
    assert host_floor.measure_host_floor([Layout(num_gpus=1, **MOE)], "H100-SXM", tmp_path, log=said.append) is None
    assert "default floors stay" in said[-1]


def test_cli_dry_run_lists_the_cases(tmp_path, capsys):
    from megatron_autotuner.cli import main

    argv = ["validate", "--model", "Qwen3-30B-A3B", "--num-layers", "2", "--num-gpus", "2", "--ep", "2"]
    argv += ["--seq-len", "4096", "--global-batch-size", "8", "--gpu", "H100-SXM", "--measure-host-floor"]
    assert main([*argv, "--dry-run", "--output-dir", str(tmp_path)]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("host floor case:")]
    assert len(lines) == 2 and any("-E64.json" in line for line in lines)
