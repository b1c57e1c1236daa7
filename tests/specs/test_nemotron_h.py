"""Nemotron-H / Nemotron-3 (megatron-core's hybrid MambaModel) read from a HF config.json and from the shipped
NVIDIA-Nemotron-3-Nano-30B-A3B preset: the model tests/theory/test_mamba_hybrid.py builds by hand, with HF
transformers' own parameter count."""

from __future__ import annotations

import json

import pytest

from megatron_autotuner.errors import ConfigError
from megatron_autotuner.specs import ModelSpec, load_model_spec, model_spec_from_hf_config
from megatron_autotuner.specs.loader import _preset_path
from megatron_autotuner.specs.tokenizers import preset_named_by
from megatron_autotuner.theory.params import total_parameters
from tests.theory.test_mamba_hybrid import NANO

PRESET = "NVIDIA-Nemotron-3-Nano-30B-A3B"
# the keys of nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16's config.json that shape the model (a verbatim copy:
# mehulbafnaa/jax-llm-examples @ 3209b93 nemotron3/tests/test_model.py NEMOTRON3_30B_JSON)
NANO_CONFIG = {
    "model_type": "nemotron_h", "hidden_size": 2688, "num_hidden_layers": 52,
    "hybrid_override_pattern": NANO["hybrid_layer_pattern"], "num_attention_heads": 32, "num_key_value_heads": 2,
    "head_dim": 128, "mamba_num_heads": 64, "mamba_head_dim": 64, "ssm_state_size": 128, "n_groups": 8,
    "conv_kernel": 4, "intermediate_size": 1856, "moe_intermediate_size": 1856,
    "moe_shared_expert_intermediate_size": 3712, "n_routed_experts": 128, "n_shared_experts": 1,
    "num_experts_per_tok": 6, "mlp_hidden_act": "relu2", "vocab_size": 131072, "tie_word_embeddings": False,
    "use_bias": False, "attention_bias": False, "max_position_embeddings": 262144, "sliding_window": None,
}  # fmt: skip
# transformers >= 5 saves the pattern as NemotronHConfig.layers_block_type
BLOCKS = {"M": "mamba", "*": "attention", "E": "moe"}


def test_the_preset_and_the_hf_converter_give_the_hand_built_model_and_hf_s_parameter_count():
    """31,577,937,344: HF transformers' NemotronHForCausalLM built on the meta device from the config.json (the
    count tests/theory/test_mamba_hybrid.py checks for the same model built by hand)."""
    preset = load_model_spec(PRESET)
    assert preset == ModelSpec(**{**NANO, "name": PRESET, "max_position_embeddings": 262144})
    assert model_spec_from_hf_config(NANO_CONFIG, name=PRESET) == preset
    assert total_parameters(preset).total == 31_577_937_344
    raw = json.loads(_preset_path(PRESET).read_text())
    assert {k: raw[k] for k in NANO_CONFIG} == NANO_CONFIG
    assert f"{PRESET}.json |" in (_preset_path(PRESET).parent / "SOURCES.md").read_text()


def test_transformers_5_s_layers_block_type_is_the_same_model():
    blocks = [BLOCKS[s] for s in NANO_CONFIG["hybrid_override_pattern"]]
    newer = {k: v for k, v in NANO_CONFIG.items() if k not in ("hybrid_override_pattern", "num_hidden_layers")}
    assert model_spec_from_hf_config({**newer, "layers_block_type": blocks}, PRESET) == load_model_spec(PRESET)
    with pytest.raises(ConfigError, match="'mlp' is not a Nemotron-H block type"):
        model_spec_from_hf_config({**newer, "layers_block_type": ["mamba", "mlp"]})


def test_bridge_s_mapping_of_a_dense_nemotron_h():
    """Nemotron-H-8B's shape (Megatron-Bridge NemotronHModelProvider8B @ 928a7e5: M / - / * layers, hidden 4096,
    128 Mamba heads, ffn 21504, 8 K/V groups): no experts, squared-ReLU MLP layers, no position embedding;
    NemotronHConfig's defaults fill what the config leaves out."""
    pattern = "M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-"
    cfg = {"model_type": "nemotron_h", "hidden_size": 4096, "hybrid_override_pattern": pattern,
           "num_attention_heads": 32, "vocab_size": 131072}  # fmt: skip
    spec = model_spec_from_hf_config(cfg)
    assert (spec.num_layers, spec.num_query_groups, spec.kv_channels, spec.ffn_hidden_size) == (52, 8, 128, 21504)
    assert (spec.mamba_num_heads, spec.mamba_head_dim, spec.mamba_state_dim, spec.mamba_num_groups) == (128, 64, 128, 8)
    assert not spec.is_moe and spec.activation == "squared_relu" and not spec.gated_linear_unit
    assert spec.position_embedding_type == "none" and spec.normalization == "RMSNorm"
    assert [spec.token_mixer(i) for i in range(4)] == ["mamba", None, "mamba", None]
    # the shared expert is n_shared_experts of moe_shared_expert_intermediate_size (transformers' NemotronHMoE)
    two = model_spec_from_hf_config({**NANO_CONFIG, "n_shared_experts": 2})
    assert two.moe_shared_expert_intermediate_size == 2 * 3712


@pytest.mark.parametrize(
    "change, match",
    [
        ({"num_nextn_predict_layers": 1}, "num_nextn_predict_layers: 1: a hybrid model's MTP layers"),
        ({"moe_latent_size": 1024}, "moe_latent_size: latent MoE projections"),
        ({"conv_kernel": 3}, "conv_kernel: 3: megatron-core's MambaMixer has a conv1d of width 4"),
        ({"num_hidden_layers": 50}, "num_hidden_layers: 50 but hybrid_override_pattern has 52 layers"),
        ({"hybrid_override_pattern": None}, "hybrid_override_pattern: missing"),
        ({"n_groups": 7}, "mamba_num_heads: must be a multiple of mamba_num_groups=7"),
    ],
)
def test_what_the_converter_does_not_model_is_refused_in_one_line(change, match):
    with pytest.raises(ConfigError, match=match) as info:
        model_spec_from_hf_config({**NANO_CONFIG, **change})
    assert "\n" not in str(info.value)


def test_verl_s_model_folder_names_the_preset():
    """verl's Nemotron-3-Nano GRPO example loads `.../models/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16`: the checkpoint's
    dtype suffix is a word after the preset's name."""
    assert preset_named_by("/data/models/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16") == PRESET
    assert preset_named_by("nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16/") == PRESET


def test_a_reduced_hybrid_moe_model_keeps_an_moe_layer():
    """--num-layers takes the hybrid pattern's prefix; Nemotron-3-Nano's first layer is Mamba, so one layer would
    keep its 128 experts with no E layer to hold them (megatron-core builds none). Said as the layer count it needs
    (a CLI audit found the pattern rule's message instead)."""
    nano = load_model_spec("NVIDIA-Nemotron-3-Nano-30B-A3B")
    with pytest.raises(ConfigError) as exc:
        nano.with_num_layers(1)
    assert exc.value.field == "num_layers" and "give at least 2" in exc.value.rule
    assert "E" in nano.with_num_layers(2).hybrid_layer_pattern
