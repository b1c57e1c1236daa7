"""Gated DeltaNet (Qwen3-Next's linear attention) in the analytical model: FLOPs, activations, layout rules, and the
per-kind caches that must keep its layers apart from softmax attention's. Parameters are checked against
megatron-core's own build in test_gdn_params_mcore.py."""

from __future__ import annotations

import pytest

from megatron_autotuner.costmodel.layer import LayerContext, layer_cost
from megatron_autotuner.errors import ConfigError
from megatron_autotuner.specs.hardware import ClusterSpec, get_gpu_spec
from megatron_autotuner.specs.model import ModelSpec
from megatron_autotuner.specs.parallel import ParallelConfig, RecomputeConfig, Workload, validate_layout
from megatron_autotuner.theory import gated_delta_net as gdn
from megatron_autotuner.theory.flops import layer_forward_flops_per_token, recomputed_forward_flops_per_token
from megatron_autotuner.theory.memory import stage_signature, token_mixer_activation_bytes

# Qwen3-Next-80B-A3B's mixer shapes (HF config.json), with a small MLP
QWEN3_NEXT_MIXER = dict(
    name="qwen3-next-like",
    hidden_size=2048,
    num_layers=8,
    num_attention_heads=16,
    num_query_groups=2,
    kv_channels=256,
    ffn_hidden_size=512,
    vocab_size=151936,
    qk_layernorm=True,
    attention_output_gate=True,
    linear_attention_pattern=(1, 1, 1, 0, 1, 1, 1, 0),
    linear_num_key_heads=16,
    linear_num_value_heads=32,
    linear_key_head_dim=128,
    linear_value_head_dim=128,
    linear_conv_kernel_dim=4,
)


@pytest.fixture(scope="module")
def model() -> ModelSpec:
    return ModelSpec(**QWEN3_NEXT_MIXER)


def test_scan_flops_by_hand(model):
    """Per chunk of 64 tokens and value head (dk = dv = 128): four 64x64x128-class products (A, W, U, QK^T, (QK^T)V':
    five of 64*64*128 multiply-adds) and three 64x128x128 ones (WS, K^T V', QS), plus 64^3/3 for the inverse."""
    macs = 5 * 64 * 64 * 128 + 3 * 64 * 128 * 128
    per_chunk = 2 * macs + 2 * 64**3 / 3
    assert gdn.scan_flops_per_token(model) == pytest.approx(32 * per_chunk / 64)


def test_a_gdn_layer_projects_in_and_out_instead_of_qkv_and_proj(model):
    h = model.hidden_size
    ops = layer_forward_flops_per_token(model, 0, 4096)
    # in_proj: q, k (16 x 128 each), v, z (32 x 128 each), beta and alpha (32 each)
    assert ops["qkv"] == 2 * h * (2 * 2048 + 2 * 4096 + 2 * 32)
    assert ops["proj"] == 2 * 4096 * h
    assert ops["core_attention"] == gdn.scan_flops_per_token(model)  # no s^2 term: linear in the sequence
    attention = layer_forward_flops_per_token(model, 3, 4096)
    # the output gate widens linear_qkv by heads x head dim: q 4096 + k, v 2 x 512 + gate 4096
    assert attention["qkv"] == 2 * h * (4096 + 1024 + 4096)


def test_core_attn_recompute_leaves_the_gdn_scan_alone(model):
    rc = RecomputeConfig("selective", modules=("core_attn",))
    assert recomputed_forward_flops_per_token(model, 0, 4096, rc) == 0.0
    assert recomputed_forward_flops_per_token(model, 3, 4096, rc) > 0.0


def test_gdn_heads_split_over_tp_times_cp(model):
    workload = Workload(seq_length=4096, micro_batch_size=1, global_batch_size=32)
    spec = model.replace(linear_num_key_heads=4, linear_num_value_heads=8)
    validate_layout(spec, ParallelConfig(num_gpus=4, tp=2, cp=2, sequence_parallel=True), workload)
    with pytest.raises(ConfigError) as err:
        validate_layout(spec, ParallelConfig(num_gpus=8, tp=2, cp=4, sequence_parallel=True), workload)
    assert err.value.field == "tp" and "linear_num_key_heads=4" in err.value.rule


def test_gdn_activations_split_over_tp_and_differ_from_attention(model):
    workload = Workload(seq_length=4096, micro_batch_size=1, global_batch_size=8)
    one = token_mixer_activation_bytes(model, ParallelConfig(num_gpus=1), workload, 0)
    two = token_mixer_activation_bytes(model, ParallelConfig(num_gpus=2, tp=2, sequence_parallel=True), workload, 0)
    assert set(one) == set(two) and any(k.startswith("gdn_") for k in one)
    for name in one:
        assert two[name] == pytest.approx(one[name] / 2), name
    attention = token_mixer_activation_bytes(model, ParallelConfig(num_gpus=1), workload, 3)
    assert "softmax_lse" in attention and not any(k.startswith("gdn_") for k in attention)


def test_pipeline_stages_with_different_mixers_are_not_one_stage(model):
    """Two pipeline ranks with the same MoE pattern but GDN layers in different places hold different layers: the
    memory cache must not take one for the other."""
    spec = model.replace(linear_attention_pattern=(1, 1, 1, 1, 0, 0, 0, 0))
    parallel = ParallelConfig(num_gpus=2, pp=2)
    assert stage_signature(spec, parallel, 0)[0] != stage_signature(spec, parallel, 1)[0]
    windowed = ModelSpec(**{**QWEN3_NEXT_MIXER, "linear_attention_pattern": ()}).replace(
        window_size=128, window_layer_pattern=(1, 1, 1, 1, 0, 0, 0, 0)
    )
    assert stage_signature(windowed, parallel, 0)[0] != stage_signature(windowed, parallel, 1)[0]


def test_the_pattern_is_checked_like_megatron_core(model):
    with pytest.raises(ConfigError, match="linear_num_value_heads"):
        model.replace(linear_num_value_heads=24)
    with pytest.raises(ConfigError, match="one entry per layer"):
        model.replace(linear_attention_pattern=(1, 0))
    assert model.with_num_layers(4).linear_attention_pattern == (1, 1, 1, 0)


def test_core_attn_recompute_time_leaves_the_gdn_scan_alone(model):
    """The cost model recomputes what the FLOPs count as recomputed: softmax attention's core, not a scan."""
    ctx = LayerContext(cluster=ClusterSpec(get_gpu_spec("H100-SXM"), 1), tokens=4096.0, seq_length=4096,
                       recompute_modules=("core_attn",))  # fmt: skip
    assert "attention" not in layer_cost(model, 0, ctx).recompute.parts
    assert layer_cost(model, 3, ctx).recompute.parts["attention"] > 0
