"""Mamba hybrid models (Nemotron-H; megatron-core MambaModel with a hybrid_override_pattern) in the analytical model:
each layer one block (M a Mamba-2 mixer, * attention, - an MLP, E a MoE block). megatron-core's own CPU build checks the
per-layer parameters in test_mamba_params_mcore.py."""

from __future__ import annotations

import pytest

from megatron_autotuner.costmodel.layer import LayerContext, layer_cost
from megatron_autotuner.errors import ConfigError
from megatron_autotuner.specs.hardware import ClusterSpec, get_gpu_spec
from megatron_autotuner.specs.model import ModelSpec
from megatron_autotuner.specs.parallel import ParallelConfig, Workload, validate_layout
from megatron_autotuner.theory import mamba
from megatron_autotuner.theory.comm import stage_comm_volumes
from megatron_autotuner.theory.flops import layer_forward_flops_per_token
from megatron_autotuner.theory.memory import mlp_activation_bytes, token_mixer_activation_bytes
from megatron_autotuner.theory.params import total_parameters
from megatron_autotuner.validate.layout import Layout

# NVIDIA-Nemotron-3-Nano-30B-A3B-BF16's config.json (a verbatim copy: mehulbafnaa/jax-llm-examples@3209b93
# nemotron3/tests/test_model.py; Megatron-Bridge Nemotron3NanoProvider @928a7e5 sets the same values)
NANO_PATTERN = "MEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEMEM*EMEMEMEME"
NANO = dict(
    name="nemotron-3-nano-like",
    hidden_size=2688,
    num_layers=52,
    num_attention_heads=32,
    num_query_groups=2,
    kv_channels=128,
    ffn_hidden_size=1856,
    vocab_size=131072,
    gated_linear_unit=False,
    activation="squared_relu",
    position_embedding_type="none",
    num_moe_experts=128,
    moe_router_topk=6,
    moe_ffn_hidden_size=1856,
    moe_shared_expert_intermediate_size=3712,
    hybrid_layer_pattern=NANO_PATTERN,
    mamba_num_heads=64,
    mamba_head_dim=64,
    mamba_state_dim=128,
    mamba_num_groups=8,
)


@pytest.fixture(scope="module")
def nano() -> ModelSpec:
    return ModelSpec(**NANO)


def test_nemotron_3_nano_has_the_parameters_of_its_hf_build(nano):
    """31,577,937,344: HF transformers 5.24's NemotronHForCausalLM built on the meta device from that config.json
    (29,374,808,064 routed-expert parameters among them)."""
    counts = total_parameters(nano).counts
    assert counts.total == 31_577_937_344
    assert counts.experts == 29_374_808_064


def test_each_layer_is_one_block(nano):
    mamba_ops = layer_forward_flops_per_token(nano, 0, 8192)
    moe_ops = layer_forward_flops_per_token(nano, 1, 8192)
    attention_ops = layer_forward_flops_per_token(nano, 5, 8192)
    assert set(mamba_ops) == {"qkv", "core_attention", "proj"}
    assert "qkv" not in moe_ops and "experts_fc1" in moe_ops
    assert set(attention_ops) == {"qkv", "core_attention", "proj"}
    h = nano.hidden_size
    # in_proj: z and x (64 x 64 each), B and C (8 groups x 128 each), dt (64 heads)
    assert mamba_ops["qkv"] == 2 * h * (2 * 4096 + 2 * 8 * 128 + 64)
    assert mamba_ops["core_attention"] == mamba.scan_flops_per_token(nano)


def test_ssd_scan_flops_by_hand(nano):
    """Per 128-token chunk: C B^T per group (128 x 128 x 128), and per head (P = 64, N = 128) the chunk's output
    (128 x 64 x 128), its state (128 x 64 x 128) and the carried states' output (128 x 64 x 128)."""
    per_chunk = 8 * 2 * 128 * 128 * 128 + 64 * 3 * (2 * 128 * 64 * 128)
    assert mamba.scan_flops_per_token(nano) == pytest.approx(per_chunk / 128)


def test_activations_belong_to_the_block_a_layer_has(nano):
    workload = Workload(seq_length=8192, micro_batch_size=1, global_batch_size=8)
    parallel = ParallelConfig(num_gpus=1)
    assert mlp_activation_bytes(nano, parallel, workload, 0) == {}
    assert token_mixer_activation_bytes(nano, parallel, workload, 1) == {}
    assert "mamba_in_proj_output" in token_mixer_activation_bytes(nano, parallel, workload, 0)


def test_an_mlp_layer_pays_no_attention_tp_collectives(nano):
    """At TP 2 with SP a layer gathers before and scatters after each block: the Mamba layer once (in_proj /
    out_proj), the MoE layer with shared experts once (shared fc1 / fc2), never twice."""
    cluster = ClusterSpec(get_gpu_spec("H100-SXM"), 8)
    ctx = LayerContext(cluster=cluster, tokens=8192, seq_length=8192, tp=2, sequence_parallel=True, training=False)
    one_block = layer_cost(nano, 0, ctx).fwd.parts["tp"]
    assert layer_cost(nano, 1, ctx).fwd.parts["tp"] == pytest.approx(one_block)
    gpt = ModelSpec(**{**NANO, "hybrid_layer_pattern": "", "num_moe_experts": 0, "moe_router_topk": 0,
                       "moe_ffn_hidden_size": 0, "moe_shared_expert_intermediate_size": 0, "num_layers": 2,
                       "mamba_num_heads": 0})  # fmt: skip
    assert layer_cost(gpt, 0, ctx).fwd.parts["tp"] == pytest.approx(2 * one_block)


def test_mamba_heads_and_groups_split_over_tp_and_cp(nano):
    workload = Workload(seq_length=8192, micro_batch_size=1, global_batch_size=8)
    validate_layout(nano, ParallelConfig(num_gpus=8, tp=8, etp=1, ep=8, sequence_parallel=True), workload)
    with pytest.raises(ConfigError) as err:
        validate_layout(nano, ParallelConfig(num_gpus=16, tp=16, etp=1, ep=16, sequence_parallel=True), workload)
    assert err.value.field == "tp"
    with pytest.raises(ConfigError) as err:
        # 8 heads per TP rank over cp 16
        validate_layout(nano, ParallelConfig(num_gpus=128, tp=8, cp=16, etp=1, ep=8, sequence_parallel=True), workload)
    assert err.value.field == "cp"


def test_the_pattern_is_checked(nano):
    with pytest.raises(ConfigError, match="one symbol per layer"):
        nano.replace(hybrid_layer_pattern="ME")
    with pytest.raises(ConfigError, match="symbols must be"):
        nano.replace(hybrid_layer_pattern="X" * 52)
    assert nano.with_num_layers(6).hybrid_layer_pattern == "MEMEM*"


def test_mat_validate_refuses_a_hybrid_model_it_cannot_build(nano, tmp_path):
    path = tmp_path / "nano.json"
    nano.with_num_layers(6).save_json(path)
    layout = Layout(model=str(path), seq_length=4096, num_gpus=1, micro_batch_size=1, global_batch_size=1)
    with pytest.raises(ConfigError, match="Mamba hybrid model"):
        layout.check()


def test_a_g_layer_is_gated_deltanet_and_one_qwen3_next_layer_is_two_hybrid_layers():
    """Megatron-LM's hybrid G symbol is a gated-DeltaNet mixer: Qwen3-Next written as a hybrid pattern (Pai-Megatron-
    Patch's form, "G-G-G-*-" for every four GPT layers) has the GPT form's parameters and FLOPs."""
    gdn = dict(
        linear_num_key_heads=16, linear_num_value_heads=32, linear_key_head_dim=128, linear_value_head_dim=128,
        linear_conv_kernel_dim=4, attention_output_gate=True, qk_layernorm=True,
    )  # fmt: skip
    base = dict(name="q3n", hidden_size=2048, num_attention_heads=16, num_query_groups=2, kv_channels=256,
                ffn_hidden_size=5120, vocab_size=151936, num_moe_experts=64, moe_router_topk=4,
                moe_ffn_hidden_size=512, moe_shared_expert_intermediate_size=512, moe_shared_expert_gate=True,
                **gdn)  # fmt: skip
    gpt = ModelSpec(num_layers=8, linear_attention_pattern=(1, 1, 1, 0) * 2, **base)
    hybrid = ModelSpec(num_layers=16, hybrid_layer_pattern="GEGEGE*E" * 2, **base)
    assert total_parameters(hybrid).total == total_parameters(gpt).total
    gpt_flops = sum(sum(layer_forward_flops_per_token(gpt, i, 4096).values()) for i in range(8))
    hybrid_flops = sum(sum(layer_forward_flops_per_token(hybrid, i, 4096).values()) for i in range(16))
    assert hybrid_flops == pytest.approx(gpt_flops)


def test_only_attention_layers_gather_their_qkv_when_tp_exceeds_the_kv_heads(nano):
    """Nemotron-3-Nano's 2 K/V groups at TP 8: its 6 attention layers all-gather their qkv output; its Mamba and MoE
    layers have none to gather."""
    assert [i for i in range(nano.num_layers) if nano.gathers_qkv_over_tp(i, 8)] == [
        i for i, symbol in enumerate(NANO_PATTERN) if symbol == "*"
    ]
    workload = Workload(seq_length=4096, micro_batch_size=1, global_batch_size=8)
    parallel = ParallelConfig(num_gpus=8, tp=8, etp=1, ep=8, sequence_parallel=True)
    qkv_all = 2 * 4096 * nano.qkv_projection_size
    (gather,) = [v for v in stage_comm_volumes(nano, parallel, workload, 0)
                 if v.collective == "all_gather" and v.message_bytes == qkv_all]  # fmt: skip
    assert gather.calls == 6 * 8  # 6 attention layers x 8 micro-batches


def test_comm_volumes_count_one_block_per_hybrid_layer(nano):
    """Each of Nemotron-3-Nano's 52 layers is one residual block: at TP 2 with SP a training micro-batch gathers
    its hidden states once forward and twice backward per block, and scatters them once each way; the Mamba layers'
    all-to-alls under CP move their in_proj and out_proj widths, the attention layers their K/V, the MoE layers
    nothing of CP's."""
    workload = Workload(seq_length=4096, micro_batch_size=1, global_batch_size=2)  # one micro-batch per dp rank
    parallel = ParallelConfig(num_gpus=8, tp=2, cp=2, etp=1, ep=2, sequence_parallel=True)
    hidden = 2 * 4096 // 2 * nano.hidden_size  # bf16 [s/cp, b, h]
    volumes = stage_comm_volumes(nano, parallel, workload, 0)
    by: dict[tuple, int] = {}
    for v in volumes:
        key = (v.dimension, v.collective, v.message_bytes)
        by[key] = by.get(key, 0) + v.calls
    assert by[("tp", "all_gather", hidden)] == 3 * 52 + 1  # + the output layer's gather
    assert by[("tp", "reduce_scatter", hidden)] == 2 * 52 + 1 + 1  # + the output layer's and the embedding's
    mamba_layers = NANO_PATTERN.count("M")
    row = 2 * 4096 // 2 / 2  # bf16, tokens / cp, over tp
    in_width, out_width = nano.token_mixer_widths(0)
    assert (
        by[("cp", "all_to_all", row * in_width * 2)]
        == by[("cp", "all_to_all", row * out_width * 2)]
        == 2 * mamba_layers
    )
    assert by[("cp", "send_recv", 2 * 2048 * 2 * 1 * nano.kv_channels)] == (1 + 2) * NANO_PATTERN.count("*")
