"""Qwen3-Next (gated DeltaNet + gated softmax attention + MoE) read from a HF config.json, from the shipped preset, and
from Megatron-LM's flags, and written back as those flags: one `ModelSpec` whichever way it comes in."""

from __future__ import annotations

import json

import pytest

from megatron_autotuner.errors import ConfigError
from megatron_autotuner.specs import ModelSpec, load_model_spec, model_spec_from_hf_config
from megatron_autotuner.specs.loader import _preset_path
from megatron_autotuner.specs.megatron_args import (
    launch_to_specs,
    linear_attention_pattern,
    read_launch,
    render_flags,
    specs_to_megatron_args,
)
from megatron_autotuner.specs.parallel import ParallelConfig, Workload

PRESET = "Qwen3-Next-80B-A3B"
# huggingface.co/Qwen/Qwen3-Next-80B-A3B-Instruct config.json as Megatron-Bridge's Qwen3NextBridge test holds it
# (tests/unit_tests/models/qwen/test_qwen3_next_bridge.py @ 067f987), the keys that shape the model
QWEN3_NEXT = {
    "model_type": "qwen3_next", "hidden_size": 2048, "num_hidden_layers": 48, "num_attention_heads": 16,
    "num_key_value_heads": 2, "head_dim": 256, "intermediate_size": 5120, "moe_intermediate_size": 512,
    "shared_expert_intermediate_size": 512, "num_experts": 512, "num_experts_per_tok": 10, "decoder_sparse_step": 1,
    "mlp_only_layers": [], "norm_topk_prob": True, "full_attention_interval": 4, "linear_num_key_heads": 16,
    "linear_num_value_heads": 32, "linear_key_head_dim": 128, "linear_value_head_dim": 128,
    "linear_conv_kernel_dim": 4, "partial_rotary_factor": 0.25, "rope_theta": 10000000, "vocab_size": 151936,
    "tie_word_embeddings": False, "max_position_embeddings": 262144, "hidden_act": "silu",
    "use_sliding_window": False,
}  # fmt: skip
# Qwen3NextConfig.__post_init__'s layer_types for full_attention_interval 4 (transformers >= 5.5 writes only these)
LAYER_TYPES = (["linear_attention"] * 3 + ["full_attention"]) * 12
H100_LAYOUT = ParallelConfig(num_gpus=16, tp=2, pp=2, cp=1, ep=4, sequence_parallel=True)
WORKLOAD = Workload(seq_length=4096, micro_batch_size=1, global_batch_size=64)


def expected_spec(name: str = PRESET) -> ModelSpec:
    """What Megatron-Bridge's Qwen3NextBridge.provider_bridge makes of the config (qk_layernorm,
    moe_shared_expert_gate, attention_output_gate, gated_delta_net with linear_attention_freq 4)."""
    return ModelSpec(
        name=name, hidden_size=2048, num_layers=48, num_attention_heads=16, num_query_groups=2, kv_channels=256,
        ffn_hidden_size=5120, vocab_size=151936, qk_layernorm=True, max_position_embeddings=262144,
        num_moe_experts=512, moe_router_topk=10, moe_ffn_hidden_size=512, moe_shared_expert_intermediate_size=512,
        moe_shared_expert_gate=True, attention_output_gate=True, linear_attention_pattern=(1, 1, 1, 0) * 12,
        linear_num_key_heads=16, linear_num_value_heads=32, linear_key_head_dim=128, linear_value_head_dim=128,
        linear_conv_kernel_dim=4,
    )  # fmt: skip


def test_the_preset_the_hf_converter_and_bridge_s_mapping_give_one_model():
    preset = load_model_spec(PRESET)
    assert preset == expected_spec()
    assert model_spec_from_hf_config(QWEN3_NEXT, name=PRESET) == preset
    # transformers >= 5.5 replaces full_attention_interval with layer_types: the same model
    newer = {k: v for k, v in QWEN3_NEXT.items() if k != "full_attention_interval"} | {"layer_types": LAYER_TYPES}
    assert model_spec_from_hf_config(newer, name=PRESET) == preset
    # the preset file is the config.json itself, read by the same converter, and its source is listed
    raw = json.loads(_preset_path(PRESET).read_text())
    assert {k: raw[k] for k in QWEN3_NEXT} == QWEN3_NEXT
    assert f"{PRESET}.json |" in (_preset_path(PRESET).parent / "SOURCES.md").read_text()


def test_layer_types_win_over_the_interval_and_legacy_names_are_read():
    """Megatron-Bridge's full_attention_interval_from_hf prefers layer_types; transformers maps the legacy names
    (mamba -> linear_attention, attention -> full_attention)."""
    cfg = {**QWEN3_NEXT, "num_hidden_layers": 4, "layer_types": ["mamba", "attention", "linear_attention", "mamba"]}
    assert model_spec_from_hf_config(cfg).linear_attention_pattern == (1, 0, 1, 1)
    every = {**QWEN3_NEXT, "num_hidden_layers": 4, "full_attention_interval": 1}
    full = model_spec_from_hf_config(every)  # interval 1: every layer softmax attention
    assert full.linear_attention_pattern == () and not full.has_linear_attention and full.attention_output_gate


def test_missing_sizes_take_qwen3_next_config_s_defaults():
    sizes = ("head_dim", "full_attention_interval", "linear_num_key_heads", "linear_num_value_heads",
             "linear_key_head_dim", "linear_value_head_dim", "linear_conv_kernel_dim")  # fmt: skip
    bare = {k: v for k, v in QWEN3_NEXT.items() if k not in sizes}
    assert model_spec_from_hf_config(bare, name=PRESET) == expected_spec()


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"layer_types": ["linear_attention"] * 47}, "layer_types: needs one entry per layer \\(48\\), got 47"),
        ({"layer_types": ["sliding_attention"] * 48}, "layer_types: 'sliding_attention' is not a layer type"),
        ({"full_attention_interval": 0}, "full_attention_interval: must be a positive integer, got 0"),
        ({"linear_num_value_heads": 24, "linear_num_key_heads": 16}, "linear_num_value_heads: must be a multiple"),
        ({"linear_conv_kernel_dim": 0}, "linear_conv_kernel_dim: must be > 0 for gated-DeltaNet layers"),
    ],
)
def test_bad_qwen3_next_configs_are_one_line_errors(changes, message):
    with pytest.raises(ConfigError, match=message):
        model_spec_from_hf_config({**QWEN3_NEXT, **changes})


def test_linear_attention_layers_of_another_model_type_are_refused():
    cfg = {**QWEN3_NEXT, "model_type": "qwen3_moe", "num_hidden_layers": 4, "layer_types": ["linear_attention"] * 4}
    with pytest.raises(ConfigError, match="layer_types: marks 4 linear-attention layers .* not modelled"):
        model_spec_from_hf_config(cfg)


def _round_trip(model: ModelSpec) -> tuple[list[str], ModelSpec]:
    flags = render_flags(specs_to_megatron_args(model, H100_LAYOUT, WORKLOAD))
    imported = launch_to_specs(read_launch(" ".join(flags)), num_gpus=H100_LAYOUT.num_gpus)
    return flags, imported.model.replace(name=model.name)


def test_flags_round_trip_with_the_compact_interval():
    model = load_model_spec(PRESET)
    flags, back = _round_trip(model)
    assert back == model
    for flag in ("--experimental-attention-variant gated_delta_net", "--linear-attention-freq 4",
                 "--linear-num-key-heads 16", "--linear-num-value-heads 32", "--linear-key-head-dim 128",
                 "--linear-value-head-dim 128", "--linear-conv-kernel-dim 4", "--attention-output-gate",
                 "--moe-shared-expert-gate", "--qk-layernorm"):  # fmt: skip
        assert flag in flags


@pytest.mark.parametrize(
    ("pattern", "freq"),
    [
        ((1, 1, 1, 0, 1, 1, 1, 0), "4"),
        ((1,) * 7 + (0,), "8"),
        ((0, 1, 1, 1, 1, 1, 1, 1), "[0]*1+[1]*7"),  # the softmax layer first: not every N-th
        ((1, 1, 0, 1, 1, 1, 0, 1), "[1]*2+[0]*1+[1]*3+[0]*1+[1]*1"),
        ((1,) * 8, "[1]*8"),  # no softmax attention at all
    ],
)
def test_any_pattern_round_trips_int_when_periodic_else_a_list_expression(pattern, freq):
    model = expected_spec().replace(num_layers=8, linear_attention_pattern=pattern, linear_num_value_heads=48)
    flags, back = _round_trip(model)
    assert back == model
    assert f"--linear-attention-freq {freq}" in flags or f"--linear-attention-freq '{freq}'" in flags


def test_the_int_and_list_forms_are_megatron_core_s():
    """megatron-core 0.16.1's own reading of linear_attention_freq (get_linear_attention_pattern)."""
    pytest.importorskip("megatron.core", exc_type=ImportError)
    from types import SimpleNamespace

    from megatron.core.models.gpt.experimental_attention_variant_module_specs import get_linear_attention_pattern

    for freq, layers in ((4, 48), (3, 10), (1, 5), (49, 48)):
        config = SimpleNamespace(linear_attention_freq=freq, num_layers=layers)
        assert tuple(get_linear_attention_pattern(config)) == linear_attention_pattern(freq, layers)
        assert linear_attention_pattern(str(freq), layers) == linear_attention_pattern(freq, layers)
    assert linear_attention_pattern("([1]*3+[0]*1)*3", 12) == (1, 1, 1, 0) * 3  # Megatron-LM's --help example


def test_a_launch_reads_megatron_lm_s_defaults_for_the_sizes_it_leaves_out():
    base = "--num-layers 8 --hidden-size 1024 --num-attention-heads 8 --seq-length 1024 --vocab-size 32000 "
    model = launch_to_specs(read_launch(base + "--experimental-attention-variant gdn --linear-attention-freq 4")).model
    assert model.linear_attention_pattern == (1, 1, 1, 0) * 2 and not model.attention_output_gate
    # Megatron-LM @ d98e8a6 TransformerConfig defaults: conv 4, heads 16 / 32 of 128
    sizes = (model.linear_conv_kernel_dim, model.linear_num_key_heads, model.linear_num_value_heads)
    assert sizes + (model.linear_key_head_dim, model.linear_value_head_dim) == (4, 16, 32, 128, 128)


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        ("--experimental-attention-variant gated_delta_net", "linear_attention_freq: must be given with"),
        ("--experimental-attention-variant gdn2 --linear-attention-freq 4", "gdn2: Gated DeltaNet-2 .* not modelled"),
        ("--experimental-attention-variant dsa", "dsa: DeepSeek sparse attention .* not modelled"),
        ("--experimental-attention-variant gdn --linear-attention-freq '[1]*7'", "has 7 entries, the model has"),
        ("--experimental-attention-variant gdn --linear-attention-freq 4 --linear-num-key-heads 3",
         "linear_num_value_heads: must be a multiple of linear_num_key_heads=3"),
    ],
)  # fmt: skip
def test_bad_gated_delta_net_flags_are_one_line_errors(flags, message):
    base = "--num-layers 8 --hidden-size 1024 --num-attention-heads 8 --seq-length 1024 --vocab-size 32000 "
    with pytest.raises(ConfigError, match=message):
        launch_to_specs(read_launch(base + flags))


def test_sizes_without_the_variant_are_ignored_as_megatron_lm_ignores_them():
    base = "--num-layers 8 --hidden-size 1024 --num-attention-heads 8 --seq-length 1024 --vocab-size 32000 "
    imported = launch_to_specs(read_launch(base + "--linear-attention-freq 4 --linear-num-key-heads 8"))
    assert not imported.model.has_linear_attention
    assert any("--linear-attention-freq: ignored without --experimental-attention-variant" in n for n in imported.notes)


def test_a_base_model_keeps_its_gated_delta_net_and_the_launch_s_flags_win():
    base = load_model_spec(PRESET)
    flags = "--num-layers 12 --linear-num-value-heads 64 --tensor-model-parallel-size 2 --seq-length 4096"
    model = launch_to_specs(read_launch(flags), base_model=base).model
    assert model.linear_attention_pattern == (1, 1, 1, 0) * 3 and model.linear_num_value_heads == 64
    assert model.attention_output_gate and model.linear_num_key_heads == 16
    # and --experimental-attention-variant in the launch reads its own pattern, the sizes it leaves out the base's
    own = launch_to_specs(
        read_launch("--experimental-attention-variant gdn --linear-attention-freq 2 --seq-length 4096"), base_model=base
    ).model
    assert own.linear_attention_pattern == (1, 0) * 24 and own.linear_num_value_heads == 32
