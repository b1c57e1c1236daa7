"""Every real public launch of tests/fixtures/launches/real/ (SOURCES.md there says where each comes from), given
as-is (no --var) to the tool: predicted, or refused in one line for a reason listed here; never a traceback, and
each within 5 s."""

from __future__ import annotations

import time

import pytest

from megatron_autotuner.costmodel.estimate import CostOptions, estimate
from megatron_autotuner.errors import AutotunerError
from megatron_autotuner.specs import get_gpu_spec
from megatron_autotuner.specs.megatron_args import launch_to_specs, read_launch_file

from .real_launches import fixtures, helpers, materialize

H100 = get_gpu_spec("H100-SXM")
# what the launch is, for each one not predicted as-is
MEGATRON_NOT_PREDICTED = {
    "NVIDIA__Megatron-LM__examples__bert__train_bert_340m_distributed.sh": "24 layers on 16 pipeline stages",
    "NVIDIA__Megatron-LM__examples__gptoss__02_train.sh": "12 layers on 8 pipeline stages (PP = its GPU count)",
    "NVIDIA__Megatron-LM__examples__rl__model_configs__nemotron6_3b_moe.sh": "its shape comes from the checkpoint",
    "NVIDIA__Megatron-LM__examples__post_training__modelopt__finetune.sh": "the model config file is named by $1",
    "epfLLM__Megatron-LLM__examples__finetune.sh": "the fork reads the shape from its checkpoint (--model_name)",
    "THUDM__slime__scripts__low_precision__run-qwen3-30b-a3b-fp8.sh": "sources a file its repository does not have",
}


# launches whose own layout Megatron-LM refuses, that `mat plan --megatron-args` plans as-is (with the reason and
# the flags to change): planned, not predicted
MEGATRON_PLANNED_NOT_PREDICTED = (
    "NVIDIA__Megatron-LM__examples__bert__train_bert_340m_distributed.sh",
    "NVIDIA__Megatron-LM__examples__gptoss__02_train.sh",
)


@pytest.fixture(scope="module")
def megatron_tree(tmp_path_factory):
    return materialize("megatron", tmp_path_factory.mktemp("real"))


def _predict(path) -> str | None:
    """None when predicted; the one-line reason otherwise (an AutotunerError or a launch without a model)."""
    try:
        imported = launch_to_specs(read_launch_file(str(path)))
        if imported.model is None or imported.parallel is None:
            return "the launch does not describe the model"
        estimate(imported.model, imported.parallel, imported.workload, H100, CostOptions(**imported.options))
    except AutotunerError as exc:
        assert "\n" not in str(exc)
        return str(exc)
    return None


def test_the_corpus_is_forty_launches_and_more():
    launches = [p for p in fixtures("megatron") if p.name not in helpers("megatron")]
    assert len(launches) >= 40
    assert set(MEGATRON_NOT_PREDICTED) <= {p.name for p in launches}


@pytest.mark.parametrize("name", [p.name for p in fixtures("megatron") if p.name not in helpers("megatron")])
def test_each_megatron_launch_is_predicted_as_is(name, megatron_tree):
    start = time.process_time()  # CPU time: the tests run two at a time
    reason = _predict(megatron_tree[name])
    assert time.process_time() - start < 5.0
    if name in MEGATRON_NOT_PREDICTED:
        assert reason is not None, f"{name} is predicted now: drop it from MEGATRON_NOT_PREDICTED"
    else:
        assert reason is None, reason


def test_the_launches_read_say_what_they_assumed(megatron_tree):
    """Pai-Megatron-Patch's scripts take their model size, parallel sizes and batch from 27 positional
    arguments: read as-is, the first model size listed, with each assumption in a note."""
    launch = read_launch_file(str(megatron_tree["alibaba__Pai-Megatron-Patch__examples__qwen3__run_mcore_qwen3.sh"]))
    imported = launch_to_specs(launch)
    assert imported.model.num_layers == 28 and imported.model.hidden_size == 1024  # Qwen3-0.6B, its first size
    assert any("read the first" in n for n in imported.notes)
    assert any(n.startswith("num_gpus:") for n in imported.notes)


def test_megatron_lm_s_gpt_oss_flags_read_as_the_model_its_config_json_describes(megatron_tree):
    """Megatron-LM's modelopt gpt-oss-20b flags (sliding windows every other layer, sinks, a clamped quick GeGLU,
    --padded-vocab-size) build the model of openai/gpt-oss-20b's config.json: the same layers and parameters."""
    from megatron_autotuner.specs import load_model_spec
    from megatron_autotuner.theory.params import total_parameters

    name = "NVIDIA__Megatron-LM__examples__post_training__modelopt__conf__openai__gpt-oss-20b.sh"
    read = launch_to_specs(read_launch_file(str(megatron_tree[name]))).model
    preset = load_model_spec("gpt-oss-20b")
    for field in ("window_size", "window_layer_pattern", "softmax_type", "activation", "glu_linear_offset",
                  "activation_clamp_value", "vocab_size", "add_bias_linear", "num_moe_experts"):  # fmt: skip
        assert getattr(read, field) == getattr(preset, field), field
    assert total_parameters(read).total == total_parameters(preset).total


def test_pai_s_qwen3_next_launch_reads_as_qwen3_next(megatron_tree):
    """Pai-Megatron-Patch's pretrain_qwen3_next.py builds megatron-core's MambaModel from Pai's spec: its M layers
    are gated DeltaNet, its - layers MoE with a gated shared expert, its attention output-gated. Read so, the
    launch's 96 hybrid layers are Qwen3-Next-80B-A3B's 48 (gated DeltaNet or attention, each with its MoE): the
    preset's parameters exactly."""
    from megatron_autotuner.specs import load_model_spec
    from megatron_autotuner.theory.params import total_parameters

    imported = launch_to_specs(read_launch_file(str(megatron_tree["alibaba__Pai-Megatron-Patch__examples__qwen3_next__"
                                                                  "run_mcore_qwen3_lite.sh"])))  # fmt: skip
    model, preset = imported.model, load_model_spec("Qwen3-Next-80B-A3B")
    assert model.hybrid_layer_pattern == "GEGEGE*E" * 12 and model.num_layers == 2 * preset.num_layers
    assert [model.token_mixer(i) for i in range(8)] == ["gdn", None, "gdn", None, "gdn", None, "attention", None]
    same = ("hidden_size", "num_attention_heads", "num_query_groups", "kv_channels", "ffn_hidden_size",
            "vocab_size", "qk_layernorm", "attention_output_gate", "num_moe_experts", "moe_router_topk",
            "moe_ffn_hidden_size", "moe_shared_expert_intermediate_size", "moe_shared_expert_gate",
            "linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim", "linear_value_head_dim",
            "linear_conv_kernel_dim")  # fmt: skip
    assert {f: getattr(model, f) for f in same} == {f: getattr(preset, f) for f in same}
    assert total_parameters(model).total == total_parameters(preset).total
    assert any("Pai-Megatron-Patch's Qwen3-Next" in n for n in imported.notes)


def test_a_layer_spec_from_outside_megatron_core_says_what_it_is_predicted_as(megatron_tree):
    """slime's Qwen3-Next launch builds its gated-DeltaNet layers from a plugin spec the flags do not describe: the
    launch is predicted as the GPT layers its flags give, and says so, with the way to the real model."""
    imported = launch_to_specs(read_launch_file(str(megatron_tree["THUDM__slime__scripts__models__qwen3-next-80B-"
                                                                  "A3B.sh"])))  # fmt: skip
    (spec_note,) = [n for n in imported.not_modelled if n.startswith("--spec")]
    assert "predicted as the flags describe them" in spec_note and "--model" in spec_note


def test_megatron_lm_s_hybrid_launches_read_their_pattern(megatron_tree):
    """examples/mamba/train.sh (800M: no --num-layers, the pattern's 48 layers) and the hybrid functional test, whose
    four `|`-separated stages over pp 2 are an interleaved pipeline of 2 virtual stages (Megatron-LM d98e8a6)."""
    example = launch_to_specs(read_launch_file(str(megatron_tree["NVIDIA__Megatron-LM__examples__mamba__train.sh"])))
    assert example.model.hybrid_layer_pattern == "M-M-M--M-*M-M-M-M--*M-M-M-M-*M--M-M-M-*M-M--M-M-"
    assert (example.model.num_layers, example.model.mamba_num_heads, example.model.position_embedding_type) == (
        48, 32, "none",
    )  # fmt: skip
    assert example.not_modelled == ()  # --spec names megatron-core's hybrid stack spec
    name = next(n for n in megatron_tree if "hybrid_mr_mcore_te_tp1_pp2_vpp2" in n)
    functional = launch_to_specs(read_launch_file(str(megatron_tree[name])))
    assert functional.model.num_layers == 44 and "|" not in functional.model.hybrid_layer_pattern
    assert (functional.parallel.pp, functional.parallel.vpp) == (2, 2)


@pytest.mark.parametrize("name", MEGATRON_PLANNED_NOT_PREDICTED)
def test_a_launch_megatron_lm_would_refuse_is_planned_with_the_flags_to_change(name, megatron_tree, tmp_path, capsys):
    import json

    from megatron_autotuner.cli import main

    assert MEGATRON_NOT_PREDICTED[name].startswith(("24 layers", "12 layers"))
    rc = main(["plan", "--megatron-args", str(megatron_tree[name]), "--gpu", "H100-SXM", "--json",
               "--output-dir", str(tmp_path / "out")])  # fmt: skip
    assert rc == 0
    current = json.loads(capsys.readouterr().out)["current_run"]
    assert "must be divisible by pp" in current["refused"]
    assert any(c["dest"] == "pipeline_model_parallel_size" for c in current["flag_changes"])


def test_nine_in_ten_megatron_launches_are_predicted_or_planned():
    launches = [p.name for p in fixtures("megatron") if p.name not in helpers("megatron")]
    handled = [n for n in launches if n not in MEGATRON_NOT_PREDICTED or n in MEGATRON_PLANNED_NOT_PREDICTED]
    assert len(handled) / len(launches) >= 0.9, (len(handled), len(launches))
