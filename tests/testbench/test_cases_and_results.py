import json

import pytest

from megatron_autotuner.errors import ConfigError
from megatron_autotuner.testbench.cases import Case, expand_cases, group_by_world_size, load_case_file
from megatron_autotuner.testbench.estimates import estimate_case
from megatron_autotuner.testbench.results import append_record, finished_case_ids, rank_file, read_records
from megatron_autotuner.theory.memory import layer_activation_bytes


def test_grid_expansion_skips_impossible_combinations():
    cases, skipped = expand_cases(
        ["Qwen3-8B", "Qwen3-30B-A3B"], ["attention", "moe"], [4096, 8192], tps=[1, 2, 16], eps=[1, 2]
    )
    ids = {c.case_id for c in cases}
    assert len(ids) == len(cases)
    # Qwen3-8B has no MoE; tp=16 does not divide 8 KV groups; ep>1 only for MoE ops
    assert not any(c.model == "Qwen3-8B" and c.op == "moe" for c in cases)
    assert not any(c.tp == 16 for c in cases)
    assert not any(c.ep > 1 and c.op == "attention" for c in cases)
    assert {c.world_size for c in cases} == {1, 2, 4}
    reasons = " ".join(r for _, r in skipped)
    assert "no MoE layers" in reasons and "tp=16" in reasons
    # tp>1 turns sequence parallel on by default
    assert all(c.sequence_parallel == (c.tp > 1) for c in cases)


def test_world_size_and_grouping():
    assert Case(model="Qwen3-30B-A3B", op="moe", seq_length=4096, ep=4).world_size == 4
    assert Case(model="Qwen3-30B-A3B", op="moe", seq_length=4096, tp=2, ep=2, etp=1).world_size == 2
    assert Case(model="Qwen3-8B", op="attention", seq_length=4096, tp=2, cp=2).world_size == 4
    cases, _ = expand_cases(["Qwen3-8B"], ["mlp"], [4096], tps=[1, 2, 4])
    assert list(group_by_world_size(cases)) == [1, 2, 4]


def test_case_validation_and_case_file(tmp_path):
    with pytest.raises(ConfigError, match="^ops"):
        Case(model="Qwen3-8B", op="conv", seq_length=8)
    with pytest.raises(ConfigError, match="^seq_length"):
        Case(model="Qwen3-8B", op="mlp", seq_length=4097, tp=2)
    f = tmp_path / "cases.json"
    f.write_text(json.dumps([{"model": "Llama-3.1-8B", "op": "decoder", "seq_length": 8192, "tp": 2}]))
    (case,) = load_case_file(f)
    assert case.sequence_parallel and case.etp == 2
    f.write_text(json.dumps([{"model": "Llama-3.1-8B", "op": "decoder", "seq": 8192}]))
    with pytest.raises(ConfigError, match="^seq"):
        load_case_file(f)
    f.write_text("{")
    with pytest.raises(ConfigError, match="not valid JSON"):
        load_case_file(f)


def test_input_shapes_and_estimates_follow_the_split():
    one = estimate_case(Case(model="Llama-3.1-8B", op="decoder", seq_length=8192))
    two = estimate_case(Case(model="Llama-3.1-8B", op="decoder", seq_length=8192, tp=2))
    assert one["tokens_per_rank"] == 8192
    assert two["fwd_flops"] == pytest.approx(one["fwd_flops"] / 2)
    assert two["bwd_flops"] == pytest.approx(2 * two["fwd_flops"])
    # with SP everything in the layer's activations is split by tp
    assert two["activation_bytes"] == pytest.approx(one["activation_bytes"] / 2)
    case = Case(model="Llama-3.1-8B", op="decoder", seq_length=8192)
    assert one["activation_bytes"] == layer_activation_bytes(case.model_spec(), case.parallel(), case.workload())
    attn = estimate_case(Case(model="Llama-3.1-8B", op="attention", seq_length=8192))
    mlp = estimate_case(Case(model="Llama-3.1-8B", op="mlp", seq_length=8192))
    assert attn["fwd_flops"] + mlp["fwd_flops"] == pytest.approx(one["fwd_flops"])
    assert attn["activation_bytes"] + mlp["activation_bytes"] == pytest.approx(one["activation_bytes"])
    moe1 = estimate_case(Case(model="Qwen3-30B-A3B", op="moe", seq_length=4096))
    moe2 = estimate_case(Case(model="Qwen3-30B-A3B", op="moe", seq_length=4096, ep=2))
    assert moe2["weight_params"] < moe1["weight_params"]
    assert moe2["fwd_flops"] == pytest.approx(moe1["fwd_flops"])  # ep splits experts, not tokens


def test_results_resume_and_truncated_lines(tmp_path):
    out = tmp_path / "run"
    a = Case(model="Qwen3-8B", op="mlp", seq_length=4096)
    b = Case(model="Qwen3-8B", op="attention", seq_length=4096)
    append_record(rank_file(out, 0), {"case_id": a.case_id, "status": "ok", "rank": 0})
    append_record(rank_file(out, 0), {"case_id": b.case_id, "status": "failed", "rank": 0, "error": "OOM"})
    with open(rank_file(out, 0), "a") as f:
        f.write('{"case_id": "half')  # a writer killed mid-line
    records = read_records(rank_file(out, 0))
    assert [r["schema_version"] for r in records] == [1, 1]
    assert finished_case_ids(out) == {a.case_id, b.case_id}
    assert finished_case_ids(out, retry_failed=True) == {a.case_id}


def test_fp8_case_sets_the_hybrid_recipe_and_needs_te():
    from megatron_autotuner.testbench.operators import build_operator, te_available, transformer_config_kwargs

    fp8 = Case(model="Llama-2-7b", op="column_linear", seq_length=4096, dtype="fp8")
    bf16 = Case(model="Llama-2-7b", op="column_linear", seq_length=4096)
    assert transformer_config_kwargs(fp8.model_spec(), fp8)["fp8"] == "hybrid"
    assert transformer_config_kwargs(fp8.model_spec(), fp8)["fp8_recipe"] == "delayed"
    assert "fp8" not in transformer_config_kwargs(bf16.model_spec(), bf16)
    tensorwise = Case(model="Llama-2-7b", op="column_linear", seq_length=4096, dtype="fp8", fp8_recipe="tensorwise")
    assert transformer_config_kwargs(fp8.model_spec(), tensorwise)["fp8_recipe"] == "tensorwise"
    # the recipe field came later: delayed-scaling cases keep the ids their committed results carry
    assert fp8.case_id == "Llama-2-7b.column_linear.tp1.cp1.ep1.s4096.b1.216a64197d" != tensorwise.case_id
    with pytest.raises(ConfigError, match="^fp8_recipe: needs dtype fp8"):
        Case(model="Llama-2-7b", op="column_linear", seq_length=4096, fp8_recipe="tensorwise")
    with pytest.raises(ConfigError, match="^fp8_recipe: must be one of"):
        Case(model="Llama-2-7b", op="column_linear", seq_length=4096, dtype="fp8", fp8_recipe="mxfp8")
    if not te_available():
        with pytest.raises(ConfigError, match="^dtype: fp8 needs Transformer Engine"):
            build_operator(fp8, "cpu")


def test_calibration_keeps_each_precision_to_itself():
    """Testbench records of fp8 cases calibrate fp8 GEMMs and fp8 layers only (committed H200 bf16
    records, relabelled fp8 for the second half)."""
    import copy
    from pathlib import Path

    from megatron_autotuner.costmodel.calibration import calibration_from_dict
    from megatron_autotuner.testbench.calibration import calibration_from_records
    from megatron_autotuner.testbench.results import all_records

    pieces = Path(__file__).resolve().parents[2] / "benchmarks/results/testbench_h200_x2/pieces"
    records = [r for r in all_records(pieces) if r["case"]["op"] == "column_linear" and r["case"]["tp"] == 1]
    assert records and all(r["case"]["dtype"] == "bf16" for r in records)
    bf16 = calibration_from_records(records)
    assert bf16["ops"] and {o["precision"] for o in bf16["ops"]} == {"bf16"}
    fp8_records = copy.deepcopy(records)
    for r in fp8_records:
        r["case"]["dtype"] = "fp8"
    doc = calibration_from_records(fp8_records)
    assert {o["precision"] for o in doc["ops"]} == {"fp8"}
    # other recipes' cases calibrate nothing: the cost model adds their GEMM and cast costs to the fp8 entries
    for recipe in ("tensorwise", "blockwise"):
        other = copy.deepcopy(fp8_records)
        for r in other:
            r["case"]["fp8_recipe"] = recipe
            r["case_id"] += f".{recipe}"  # another case (the real ids hash the recipe in)
        assert calibration_from_records(fp8_records + other)["ops"] == doc["ops"]
        assert calibration_from_records(other)["ops"] == []
    cal = calibration_from_dict(doc)
    flops = doc["ops"][0]["flops"]
    assert cal.efficiency("fc1", "fwd", flops, "fp8") is not None
    assert cal.efficiency("fc1", "fwd", flops, "bf16") is None
    # the TE linear layers calibrate every GEMM of the layer: H200 column-parallel fc1 at 0.69-0.74
    assert 0.6 < calibration_from_dict(bf16).efficiency("fc1", "dgrad", flops, "bf16") < 0.85


def test_the_runner_builds_gpt_oss_with_its_windows_sinks_and_clamped_glu():
    """What `mat validate` and the testbench run is the model that was predicted: megatron-core's TransformerConfig
    for gpt-oss carries the sliding window on every other layer, the learnable softmax and the clamped quick GeGLU."""
    pytest.importorskip("megatron.core")
    from megatron.core.fusions.fused_bias_geglu import quick_gelu
    from megatron.core.transformer.utils import is_layer_window_attention

    from megatron_autotuner.specs import load_model_spec
    from megatron_autotuner.testbench.cases import Case
    from megatron_autotuner.testbench.operators import build_transformer_config

    spec = load_model_spec("gpt-oss-20b").with_num_layers(4)
    config = build_transformer_config(spec, Case("gpt-oss-20b", "decoder", 4096, ep=1), False, "cpu")
    assert config.window_size == (127, 0) and config.softmax_type == "learnable"
    assert config.activation_func is quick_gelu and config.glu_linear_offset == 1.0
    assert config.activation_func_clamp_value == 7.0 and config.add_bias_linear
    windowed = [is_layer_window_attention(config.window_size, config.window_attn_skip_freq, n) for n in range(1, 5)]
    assert windowed == [spec.is_window_layer(i) for i in range(4)] == [True, False, True, False]
