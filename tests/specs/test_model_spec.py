import json

import pytest

from megatron_autotuner.errors import ConfigError, SpecNotFoundError
from megatron_autotuner.specs import load_model_spec, model_spec_from_hf_config, preset_names
from megatron_autotuner.specs.loader import _preset_path
from megatron_autotuner.theory.params import total_parameters

REQUIRED_PRESETS = [
    "Qwen3-0.6B",
    "Qwen3-8B",
    "Qwen3-32B",
    "Qwen3-30B-A3B",
    "Qwen3-235B-A22B",
    "Qwen2.5-7B",
    "Llama-2-7b",
    "Llama-3.1-8B",
    "Llama-3.1-70B",
    "Llama-3.1-405B",
    "Mixtral-8x7B",
    "DeepSeek-V3",
]

# Published parameter totals (model cards / papers), in billions, with the tolerance of their rounding.
PUBLISHED_TOTAL_B = {
    "Llama-2-7b": (6.738415616, 1e-9),  # exact count from the HF checkpoint index
    "Llama-3.1-8B": (8.030261248, 1e-9),  # exact count from the HF checkpoint index
    "Llama-3.1-70B": (70.6, 0.005),
    "Llama-3.1-405B": (405.9, 0.005),
    "Mixtral-8x7B": (46.7, 0.005),
    "Qwen3-8B": (8.2, 0.01),
    "Qwen3-1.7B": (1.7, 0.02),  # huggingface.co/Qwen/Qwen3-1.7B model card: 1.7B
    "Qwen3-4B": (4.0, 0.01),  # huggingface.co/Qwen/Qwen3-4B model card: 4.0B
    "Qwen3-30B-A3B": (30.5, 0.005),
    "Qwen3-235B-A22B": (235.0, 0.005),
    "Qwen2.5-7B": (7.61, 0.005),
    # 15,666,819,072 bytes of bf16 weights (model.safetensors.index.json total_size, MTP layer included) in a
    # checked-in MiMo-7B snapshot (github.com/jj8127/mimo_kor @ 60c075c)
    "MiMo-7B": (7.833409536, 1e-9),
    "Qwen1.5-MoE-A2.7B": (14.3, 0.005),  # qwenlm.github.io/blog/qwen-moe: 14.3B total, 2.7B activated
    "Moonlight-16B-A3B": (16.0, 0.005),  # Moonlight README / arXiv 2502.16982: 16B total, 3B activated
    # gpt-oss model card (OpenAI, arXiv 2508.10925) Table 1: 20.91B and 116.83B total
    "gpt-oss-20b": (20.91, 0.0005),
    "gpt-oss-120b": (116.83, 0.0001),
    "Kimi-K2-Instruct": (1000.0, 0.05),  # github.com/MoonshotAI/Kimi-K2 README @ 11062d1: 1T total, 32B activated
}


def test_all_required_presets_ship():
    assert set(REQUIRED_PRESETS) <= set(preset_names())


@pytest.mark.parametrize("name", REQUIRED_PRESETS)
def test_presets_load(name):
    spec = load_model_spec(name)
    assert spec.name == name
    assert spec.num_attention_heads % spec.num_query_groups == 0


@pytest.mark.parametrize("name", sorted(PUBLISHED_TOTAL_B))
def test_preset_totals_match_published(name):
    expected_b, rel = PUBLISHED_TOTAL_B[name]
    total = total_parameters(load_model_spec(name)).total
    assert abs(total / 1e9 - expected_b) <= rel * expected_b


def test_moe_active_parameters():
    # Qwen3-30B-A3B: 3.3B active; Qwen3-235B-A22B: 22B active; DeepSeek-V3: 37B active (main model).
    assert abs(total_parameters(load_model_spec("Qwen3-30B-A3B")).active / 1e9 - 3.3) < 0.06
    assert abs(total_parameters(load_model_spec("Qwen3-235B-A22B")).active / 1e9 - 22.2) < 0.2
    ds = load_model_spec("DeepSeek-V3")
    counts = total_parameters(ds)
    main = counts.counts.total - counts.counts.mtp_dense - counts.counts.mtp_expert
    assert abs(main / 1e9 - 671) < 1.0


def test_kimi_k2_reads_as_the_deepseek_v3_architecture_it_ships():
    """Kimi K2's config.json names model_type kimi_k2 on DeepseekV3ForCausalLM: read as DeepSeek-V3 (MLA, a dense
    first layer, 384 experts top-8 and one shared, no group limit), 32B activated as its README says."""
    kimi = load_model_spec("Kimi-K2-Instruct")
    assert kimi.multi_latent_attention and (kimi.q_lora_rank, kimi.kv_lora_rank) == (1536, 512)
    assert (kimi.num_moe_experts, kimi.moe_router_topk, kimi.moe_shared_expert_intermediate_size) == (384, 8, 2048)
    assert not kimi.is_moe_layer(0) and all(kimi.is_moe_layer(i) for i in range(1, 61))
    assert kimi.moe_router_num_groups is None or kimi.moe_router_num_groups <= 1
    assert abs(total_parameters(kimi).active / 1e9 - 32.0) < 1.0


def test_moe_presets_of_the_rl_launches_activate_what_their_authors_publish():
    assert abs(total_parameters(load_model_spec("Qwen1.5-MoE-A2.7B")).active / 1e9 - 2.7) < 0.05
    assert abs(total_parameters(load_model_spec("Moonlight-16B-A3B")).active / 1e9 - 3.0) < 0.1
    # GLM-4.5 report (arXiv 2508.06471): GLM-4.5-Air has 106B total and 12B activated parameters, the main model
    # (its MTP layer aside) and, activated, without the embedding and output layers
    glm = total_parameters(load_model_spec("GLM-4.5-Air"))
    mtp = glm.counts.mtp_dense + glm.counts.mtp_expert
    assert int((glm.counts.total - mtp) / 1e9) == 106
    per_expert = glm.counts.mtp_expert / 128
    main_active = glm.active - glm.counts.mtp_dense - 8 * per_expert
    assert round((main_active - glm.counts.embedding - glm.counts.output_layer) / 1e9) == 12


def test_gpt_oss_active_parameters_and_layers_as_its_model_card_and_bridge_give_them():
    """Model card Table 1: 3.61B / 5.13B active, counted without the input embedding (the unembedding is in);
    Megatron-Bridge's GPTOSSBridge: window (127, 0) on every other layer from the first, learnable sinks."""
    for name, active_b in (("gpt-oss-20b", 3.61), ("gpt-oss-120b", 5.13)):
        counts = total_parameters(load_model_spec(name))
        assert round((counts.active - counts.counts.embedding) / 1e9, 2) == active_b
    oss = load_model_spec("gpt-oss-20b")
    assert oss.window_size == 128 and [oss.is_window_layer(i) for i in range(4)] == [True, False, True, False]
    assert oss.softmax_type == "learnable" and oss.add_bias_linear and oss.activation == "quick_gelu"
    # a copy with the window switched off (sliding_window null) is the same model with full attention everywhere
    cfg = json.loads(_preset_path("gpt-oss-20b").read_text())
    full = model_spec_from_hf_config({**cfg, "sliding_window": None})
    assert full.window_size == 0 and not any(full.is_window_layer(i) for i in range(24))


def test_glm4_moe_and_mimo_map_as_megatron_bridge_maps_them():
    glm = load_model_spec("GLM-4.5-Air")
    assert glm.moe_layer_pattern == (0,) + (1,) * 45  # first_k_dense_replace = 1
    assert glm.add_qkv_bias and not glm.add_bias_linear and not glm.qk_layernorm  # use_qk_norm false (Air)
    assert glm.moe_shared_expert_intermediate_size == 1408 and not glm.moe_shared_expert_gate
    assert glm.kv_channels == 128 and glm.num_query_groups == 8 and glm.mtp_num_layers == 1
    mimo = load_model_spec("MiMo-7B")
    assert mimo.add_qkv_bias and mimo.mtp_num_layers == 1 and not mimo.is_moe


def test_deepseek_first_k_dense_and_mla():
    ds = load_model_spec("DeepSeek-V3")
    assert ds.moe_layer_pattern[:3] == (0, 0, 0) and all(ds.moe_layer_pattern[3:])
    assert ds.multi_latent_attention and ds.q_lora_rank == 1536 and ds.kv_lora_rank == 512
    assert ds.moe_shared_expert_intermediate_size == 2048 and ds.mtp_num_layers == 1


def test_hf_config_file_and_native_json_roundtrip(tmp_path):
    cfg = {
        "model_type": "gpt2",
        "n_embd": 768,
        "n_layer": 12,
        "n_head": 12,
        "vocab_size": 50257,
        "n_positions": 1024,
        "activation_function": "gelu_new",
    }
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    spec = load_model_spec(str(tmp_path))
    assert spec.ffn_hidden_size == 3072 and not spec.gated_linear_unit and spec.add_bias_linear
    assert spec.position_embedding_type == "learned_absolute" and spec.tie_embeddings
    # GPT-2 small: 124,439,808 parameters (HF checkpoint)
    assert total_parameters(spec).total == 124_439_808
    native = tmp_path / "spec.json"
    spec.save_json(native)
    assert load_model_spec(str(native)) == spec


def test_hf_id_resolved_from_local_cache(tmp_path, monkeypatch):
    snap = tmp_path / "models--acme--tiny" / "snapshots" / "abc123"
    snap.mkdir(parents=True)
    (tmp_path / "models--acme--tiny" / "refs").mkdir()
    (tmp_path / "models--acme--tiny" / "refs" / "main").write_text("abc123")
    cfg = json.loads(_preset_path("Qwen3-0.6B").read_text())
    (snap / "config.json").write_text(json.dumps(cfg))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    spec = load_model_spec("acme/tiny")
    assert spec.name == "acme/tiny" and spec.hidden_size == 1024 and spec.qk_layernorm


def test_unknown_model_and_bad_config(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    with pytest.raises(SpecNotFoundError, match="not in the local Hugging Face cache"):
        load_model_spec("nobody/nothing")
    with pytest.raises(SpecNotFoundError, match="Presets"):
        load_model_spec("Llama-9")
    bad = tmp_path / "config.json"
    bad.write_text("{not json")
    with pytest.raises(ConfigError, match="not valid JSON"):
        load_model_spec(str(bad))
    with pytest.raises(ConfigError, match="model_type"):
        model_spec_from_hf_config({"model_type": "bert"})
    with pytest.raises(ConfigError, match="num_hidden_layers"):
        model_spec_from_hf_config({"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4})


def test_validation_names_field():
    spec = load_model_spec("Llama-3.1-8B")
    with pytest.raises(ConfigError, match="^num_query_groups"):
        spec.replace(num_query_groups=5)
    with pytest.raises(ConfigError, match="^activation"):
        spec.replace(activation="tanh")


@pytest.mark.parametrize("model_type", ["mixtral", "qwen3_moe", "qwen2", "nemotron", "deepseek_v3", "llama"])
def test_each_supported_model_type_has_a_converter(model_type):
    from megatron_autotuner.specs.hf import HF_CONVERTERS

    assert model_type in HF_CONVERTERS


def test_nemotron_config():
    cfg = {
        "model_type": "nemotron",
        "hidden_size": 3072,
        "intermediate_size": 9216,
        "num_hidden_layers": 32,
        "num_attention_heads": 24,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "vocab_size": 256000,
        "hidden_act": "relu2",
        "tie_word_embeddings": False,
    }
    spec = model_spec_from_hf_config(cfg, "Minitron-4B")
    assert spec.activation == "squared_relu" and not spec.gated_linear_unit and spec.normalization == "LayerNorm"
