"""`mat validate --measure-host-floor`: the testbench cases it runs, and the calibration it hands the predictions."""

import shutil
from pathlib import Path

import pytest

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
        Layout(model="Qwen3-8B", num_layers=2, seq_length=4096, global_batch_size=8),  # dense: probed in the model
    ]
    cases = host_floor.host_floor_cases(layouts, tmp_path / "models")
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


def test_cases_follow_the_permute_path_and_drop_routing_groups(tmp_path):
    fused = Layout(num_gpus=8, ep=8, moe_permute_fusion=True, **MOE)
    cases = host_floor.host_floor_cases([fused, Layout(num_gpus=1, **MOE)], tmp_path / "models")
    assert {(c.moe_permute_fusion, load_model_spec(c.model).num_moe_experts) for c in cases} == {
        (True, 128),
        (True, 16),
        (False, 128),
    }
    # a rank's experts stand in for the model's: the copy routes without DeepSeek-V3's 8 groups
    deepseek = Layout(model="DeepSeek-V3", num_layers=4, seq_length=4096, global_batch_size=64, num_gpus=32, ep=32)
    (rank,) = [c for c in host_floor.host_floor_cases([deepseek], tmp_path / "ds") if c.model != "DeepSeek-V3"]
    assert load_model_spec(rank.model).moe_router_num_groups == 0


def test_the_host_pace_range_scales_the_fused_floor_too():
    from megatron_autotuner.costmodel.estimate import CostOptions, host_pace_steps
    from megatron_autotuner.specs import ParallelConfig, Workload, get_gpu_spec

    steps = host_pace_steps(
        load_model_spec("Qwen3-30B-A3B"), ParallelConfig(8, ep=8), Workload(4096, 1, 64), get_gpu_spec("H100-SXM"),
        CostOptions(moe_permute_fusion=True),
    )  # fmt: skip
    assert steps is not None and steps[1] > 2 * steps[0]


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


def test_dense_probes_per_model_precision_and_mode():
    layouts = [
        Layout(model="Qwen3-8B", num_layers=2, seq_length=4096, global_batch_size=8),
        Layout(model="Qwen3-8B", num_layers=2, seq_length=4096, global_batch_size=8, micro_batch_size=2),
        Layout(model="Qwen3-8B", num_layers=2, seq_length=4096, global_batch_size=8, precision="fp8"),
        Layout(model="Qwen3-0.6B", seq_length=4096, global_batch_size=8, mode="forward"),
        Layout(model="Qwen3-0.6B", seq_length=4096, global_batch_size=8, use_te=False),  # local layers: no probe
        Layout(num_gpus=1, **MOE),  # MoE: the testbench's block
    ]
    probes = host_floor.host_probe_layouts(layouts)
    got = sorted((p.model, p.model_spec().num_layers, p.precision, p.mode) for p in probes)
    assert got == sorted(
        [("Qwen3-8B", 2, prec, mode) for prec in ("bf16", "fp8") for mode in ("train", "forward")]
        + [("Qwen3-0.6B", 28, "bf16", mode) for mode in ("train", "forward")]
    )
    assert all(
        (p.tp, p.micro_batch_size, p.seq_length, p.cuda_graph_impl, p.host_timing)
        == (1, 1, host_floor.HOST_PROBE_SEQ_LENGTH, "none", True)
        for p in probes
    )


def _probe_row(model, precision, mode, fwd_ms, bwd_ms, recipe="delayed", status="ok", step_ms=None, layers=2):
    timing = {"fwd_ms": fwd_ms, "bwd_ms": bwd_ms if mode == "train" else None, "layers": layers}
    layout = {"model": model, "num_layers": None, "precision": precision, "fp8_recipe": recipe, "mode": mode}
    step_ms = step_ms if step_ms is not None else layers * (fwd_ms + (bwd_ms or 0.0)) + 1.0
    return {"status": status, "layout": layout, "measured": {"host_timing": timing, "step_time_s": step_ms * 1e-3}}


def test_dense_floor_is_the_median_over_probed_models():
    rows = [
        _probe_row("a", "bf16", "train", 3.0, 6.0),
        _probe_row("b", "bf16", "train", 4.0, 7.0),
        _probe_row("c", "bf16", "train", 9.0, 9.0),
        _probe_row("a", "bf16", "forward", 2.5, None),
        _probe_row("d", "bf16", "train", 1.0, 1.0, status="failed"),
        _probe_row("a", "fp8", "train", 5.0, 8.0, recipe="tensorwise"),
    ]
    floors = {(f["precision"], f.get("fp8_recipe")): f for f in host_floor.dense_floors_from_probes(rows)}
    bf16 = floors[("bf16", None)]
    assert (bf16["fwd_s"], bf16["bwd_s"], bf16["fwd_no_grad_s"]) == pytest.approx((4e-3, 7e-3, 2.5e-3))
    assert len(bf16["probes"]) == 4
    fp8 = floors[("fp8", "tensorwise")]
    assert (fp8["fwd_s"], fp8["bwd_s"]) == pytest.approx((5e-3, 8e-3)) and "fwd_no_grad_s" not in fp8
    assert "microbatch_s" not in fp8 and "step_s" not in fp8  # no forward-only probe to split them


def test_host_outside_the_layers_is_split_per_micro_batch_and_per_step():
    """A probe's step less its layers' host time: forward-only gives the per-micro-batch work (embedding, output
    layer, loss), training less that gives the optimizer step's, model by model."""
    rows = [
        _probe_row("a", "bf16", "train", 3.0, 6.0, step_ms=2 * 9.0 + 40.0),
        _probe_row("a", "bf16", "forward", 2.5, None, step_ms=2 * 2.5 + 6.0),
        _probe_row("b", "bf16", "train", 3.0, 6.0, layers=4, step_ms=4 * 9.0 + 30.0),
        _probe_row("b", "bf16", "forward", 2.5, None, layers=4, step_ms=4 * 2.5 + 4.0),
    ]
    (floor,) = host_floor.dense_floors_from_probes(rows)
    assert floor["microbatch_s"] == pytest.approx(5e-3)  # median of 6 and 4 ms
    assert floor["step_s"] == pytest.approx(30e-3)  # median of 40 - 6 and 30 - 4 ms
    parsed = calibration_from_dict(
        {"kind": "megatron-autotuner-calibration", "schema_version": 1, "gpu": "H100-SXM", "ops": []}
        | {"dense_host_floor": [{k: v for k, v in floor.items() if k != "probes"}]}
    ).dense_host_floor("bf16", "delayed", 1)
    assert (parsed.microbatch_s, parsed.step_s) == pytest.approx((5e-3, 30e-3))


@pytest.mark.mcore
def test_probes_run_in_the_model_and_reach_the_predictions(tmp_path, tiny):
    """The probes run the real megatron-core model (CPU, local layers here) with host timing, and the floor they
    measure is the one the predictions use: a CPU host issues these layers far slower than the H100 default."""
    pytest.importorskip("torch")
    pytest.importorskip("megatron.core")
    lay = Layout(model=tiny, seq_length=64, global_batch_size=2)
    # TP 2 (gloo): the local layers cannot run sequence parallel
    tp2 = Layout(model=tiny, seq_length=64, global_batch_size=2, num_gpus=2, tp=2, sequence_parallel=False)
    measured = host_floor.measure_host_floor([lay, tp2], "H100-SXM", tmp_path / "hf", log=lambda *_: None, device="cpu")
    assert (tmp_path / "hf" / "host_floor.calibration.json").is_file()
    floor = measured.dense_host_floor("bf16", "delayed", 1)
    assert floor.fwd_s > 0 and floor.bwd_s > 0 and floor.fwd_no_grad_s > 0
    assert floor.microbatch_s is not None and floor.step_s is not None
    assert [(f.tp, f.sequence_parallel) for f in measured.dense_host_floors] == [(1, False), (2, False)]
    assert not measured.ops and not measured.layers
    default = predict(lay, "H100-SXM", gradient_accumulation_fusion=False)
    own = predict(lay, "H100-SXM", measured, gradient_accumulation_fusion=False)
    stage_host = 2 * (floor.fwd_s + floor.bwd_s)  # two layers, one micro-batch per step
    assert own["step_time_s"] >= stage_host > 0
    assert own["step_time_s"] != default["step_time_s"]


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
    out = capsys.readouterr().out.splitlines()
    lines = [line for line in out if line.startswith("host floor case:")]
    assert len(lines) == 2 and any("-E64.json" in line for line in lines)
    # the predictions' advice to measure the floor is what the run will do, and the dry run says so
    assert any(line.startswith("host floors: measured when the batch runs") for line in out)
    assert main([*argv[:-1], "--dry-run", "--output-dir", str(tmp_path / "plain")]) == 0
    assert "host floors: measured" not in capsys.readouterr().out


def test_probes_at_each_tp_size_the_layouts_use():
    """A TP size's probe runs on TP GPUs with the layout's sequence parallelism: its layers' collectives are in its
    host time."""
    layouts = [
        Layout(model="Qwen3-8B", num_layers=2, seq_length=4096, global_batch_size=8),
        Layout(model="Qwen3-8B", num_layers=2, num_gpus=2, tp=2, seq_length=4096, global_batch_size=8),
        Layout(model="Qwen3-8B", num_layers=2, num_gpus=4, tp=2, seq_length=4096, global_batch_size=8),  # same probe
    ]
    probes = host_floor.host_probe_layouts(layouts)
    got = sorted((p.tp, p.num_gpus, p.sequence_parallel, p.mode) for p in probes)
    assert got == [(1, 1, False, "forward"), (1, 1, False, "train"), (2, 2, True, "forward"), (2, 2, True, "train")]


def test_one_floor_per_tp_size_the_default_sequence_parallelism_kept():
    rows = [
        _probe_row("a", "bf16", "train", 3.0, 6.0),
        _probe_row("a", "bf16", "forward", 2.5, None),
    ]
    tp2 = [_probe_row("a", "bf16", "train", 4.0, 7.0), _probe_row("a", "bf16", "forward", 3.0, None)]
    tp2_no_sp = [_probe_row("a", "bf16", "train", 9.0, 9.0), _probe_row("a", "bf16", "forward", 9.0, None)]
    for row in tp2:
        row["layout"] |= {"tp": 2, "sequence_parallel": True}
    for row in tp2_no_sp:
        row["layout"] |= {"tp": 2, "sequence_parallel": False}
    floors = host_floor.dense_floors_from_probes(rows + tp2_no_sp + tp2)
    assert [(f["tp"], f["sequence_parallel"], f["fwd_s"]) for f in floors] == [(1, False, 3e-3), (2, True, 4e-3)]
    calibration = calibration_from_dict(
        {"kind": "megatron-autotuner-calibration", "schema_version": 1, "gpu": "H100-SXM", "ops": []}
        | {"dense_host_floor": [{k: v for k, v in f.items() if k != "probes"} for f in floors]}
    )
    assert calibration.dense_host_floor("bf16", "delayed", 2).fwd_s == pytest.approx(4e-3)


REPEAT_LEASE = ROOT / "benchmarks/results/moe_floor_repeat_h200_x2"
OSS_EP = dict(model="gpt-oss-20b", num_layers=4, seq_length=4096, global_batch_size=8, num_gpus=2)


def replay_rounds(tmp_path, monkeypatch):
    """`run_cases` stood in by the repeat lease's records: the round-th call gets that round's rank-0 records of the
    same two gpt-oss-20b cases, re-pointed at this run's model files (the lease's lived on the GPU machine)."""
    import json

    calls = []

    def replay(cases, out_dir, **_):
        calls.append(out_dir)
        by_model = {Path(c.model).name.removesuffix(".json"): c for c in cases}
        src = REPEAT_LEASE / "collect" / f"round{len(calls)}_rank_0.jsonl"
        rows = []
        for rec in map(json.loads, src.read_text().splitlines()):
            case = by_model[Path(rec["case"]["model"]).name.removesuffix(".json")]
            rows.append(rec | {"case_id": case.case_id, "case": rec["case"] | {"model": case.model}})
        (Path(out_dir) / "collect").mkdir(parents=True)
        (Path(out_dir) / "collect" / "rank_0.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))

    monkeypatch.setattr("megatron_autotuner.testbench.launcher.run_cases", replay)
    return calls


def test_the_moe_floor_is_the_median_over_rounds(tmp_path, monkeypatch):
    """Three processes timed the same two cases (repeat lease). The line is fitted to each expert count's median
    over the rounds (hand-read from the records): backward 6.61 ms at 16 local experts (rounds 6.31 / 6.61 / 9.81)
    and 8.38 ms at 32 (8.38 / 8.51 / 8.01), so 0.111 ms per expert; forward 7.80 at 16 and 6.08 at 32 falls with
    more experts, so flat at their mean. Each round has its own folder."""
    calls = replay_rounds(tmp_path, monkeypatch)
    layouts = [Layout(ep=1, **OSS_EP), Layout(ep=2, **OSS_EP)]
    measured = host_floor.measure_host_floor(layouts, "H200", tmp_path / "hf", log=lambda *_: None)
    assert len(calls) == host_floor.HOST_FLOOR_ROUNDS == 3 and len(set(calls)) == 3
    (floor,) = measured.moe_host_floors
    assert floor.bwd_per_local_expert_s == pytest.approx((8.3775 - 6.6069) / 16 * 1e-3, rel=0.01)
    assert floor.backward_s(16) == pytest.approx(6.607e-3, rel=0.01)
    assert floor.fwd_per_local_expert_s == 0.0
    assert floor.forward_s(16) == pytest.approx((7.80 + 6.08) / 2 * 1e-3, rel=0.01)


def test_a_case_that_failed_in_one_round_keeps_the_others():
    """A round whose process failed a case (an OOM, a timeout) leaves the median of the rounds that ran it."""
    from megatron_autotuner.testbench.results import median_over_rounds

    def rec(status: str, bwd_ms: float | None = None) -> dict:
        real = {"fwd_ms": {"median": 5.0}, "bwd_ms": {"median": bwd_ms}} if status == "ok" else {}
        return {"case_id": "c", "rank": 0, "status": status, "real": real}

    (merged,) = median_over_rounds([[rec("ok", 6.0)], [rec("failed")], [rec("ok", 9.0)], [rec("ok", 7.0)]])
    assert merged["real"]["bwd_ms"]["median"] == 7.0 and merged["real"]["bwd_ms"]["round_medians"] == [6.0, 9.0, 7.0]
    assert median_over_rounds([[rec("failed")], [rec("failed")]]) == []
