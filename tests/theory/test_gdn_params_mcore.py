"""Ground truth for gated-DeltaNet (Qwen3-Next) parameter counts: megatron-core 0.16.1 models built on CPU.

Small Qwen3-Next-shaped models (three gated-DeltaNet layers, then one softmax-attention layer with an output gate
and per-head q/k RMSNorm; dense MLP or routed experts with a gated shared expert) are built for real on gloo ranks
(subprocesses, see `tests/mcore_helpers.py`) through megatron-core's own
`get_transformer_block_with_experimental_attention_variant_spec`, with local modules standing in for TE's (GDN's
`in_proj` keeps its fused input norm). Each rank's counts must equal `theory.params`: the whole model
(`total_parameters`), every decoder layer (`decoder_layer_parameters`) and each pipeline stage
(`stage_parameters`). The module shapes are also checked against the formulas of megatron-core's
`GatedDeltaNet` / `SelfAttention` constructors written out from the `ModelSpec` fields, independently of
`theory.params`.

For the model below (h 256, 2 key heads / 4 value heads of 32, conv 4; 4 heads / 2 groups of 64, gated) megatron
builds, per gated-DeltaNet layer at tp 1: in_proj 392 x 256 (+ 256 fused norm), conv1d 256 x 1 x 4, dt_bias 4,
A_log 4, out_norm 32, out_proj 256 x 128 (134,440 in all); and per softmax-attention layer linear_qkv 768 x 256
(256 of them the gate), q/k norms 64 each, linear_proj 256 x 256, input norm 256 (262,528).
"""

from __future__ import annotations

import pytest

from megatron_autotuner.specs.model import ModelSpec
from megatron_autotuner.theory.params import (
    decoder_layer_parameters,
    total_parameters,
)
from tests.mcore_helpers import McoreCase, check_layers_and_stages, check_total_and_active, rank_results

pytest.importorskip("torch")
pytest.importorskip("megatron.core")

pytestmark = pytest.mark.mcore

QWEN3_NEXT_DENSE = ModelSpec(  # linear_attention_freq 4: layers 0-2 gated DeltaNet, layer 3 softmax attention
    name="qwen3-next-dense",
    hidden_size=256,
    num_layers=4,
    num_attention_heads=4,
    num_query_groups=2,
    kv_channels=64,
    ffn_hidden_size=512,
    vocab_size=1024,
    qk_layernorm=True,
    attention_output_gate=True,
    linear_attention_pattern=(1, 1, 1, 0),
    linear_num_key_heads=2,
    linear_num_value_heads=4,
    linear_key_head_dim=32,
    linear_value_head_dim=32,
    linear_conv_kernel_dim=4,
)
QWEN3_NEXT_MOE = QWEN3_NEXT_DENSE.replace(  # every layer MoE: 8 experts top-2, a gated shared expert
    name="qwen3-next-moe",
    num_layers=8,
    linear_attention_pattern=(1, 1, 1, 0) * 2,
    num_moe_experts=8,
    moe_router_topk=2,
    moe_ffn_hidden_size=64,
    moe_shared_expert_intermediate_size=64,
    moe_shared_expert_gate=True,
)
GDN_UNGATED_ATTENTION = QWEN3_NEXT_DENSE.replace(  # the softmax layer without its output gate, first in the pattern
    name="gdn-ungated-attention", attention_output_gate=False, linear_attention_pattern=(0, 1, 1, 1)
)


def _case(name: str, spec: ModelSpec, **kwargs) -> McoreCase:
    return McoreCase(name=name, spec=spec.to_dict(), **kwargs)


CASES = [
    _case("gdn-qwen3-next-dense", QWEN3_NEXT_DENSE),
    _case("gdn-qwen3-next-moe", QWEN3_NEXT_MOE),
    _case("gdn-ungated-attention", GDN_UNGATED_ATTENTION),
    _case("gdn-qwen3-next-dense-tp2", QWEN3_NEXT_DENSE, world=2, tp=2),
    _case("gdn-qwen3-next-moe-tp2", QWEN3_NEXT_MOE, world=2, tp=2),
    _case("gdn-qwen3-next-moe-pp2", QWEN3_NEXT_MOE, world=2, pp=2),
]
CASE_PARAMS = [pytest.param(case, id=case.name) for case in CASES]
WORLD1_CASES = [pytest.param(case, id=case.name) for case in CASES if case.world == 1]

MCORE_CASES = CASES  # built by conftest's `mcore_ground_truth`, with the other modules' cases


@pytest.fixture(scope="module")
def mcore_counts(mcore_ground_truth) -> dict:
    return mcore_ground_truth


@pytest.mark.parametrize("case", WORLD1_CASES)
def test_total_parameters_match_megatron_core(mcore_counts, case: McoreCase):
    (rank,) = rank_results(mcore_counts, case)
    check_total_and_active(rank, case.spec)


@pytest.mark.parametrize("case", CASE_PARAMS)
def test_layer_and_stage_parameters_match_megatron_core(mcore_counts, case: McoreCase):
    """Per rank: its layers, its counts and each layer's (dense, expert) count, GDN and softmax layers alike."""
    check_layers_and_stages(rank_results(mcore_counts, case), case)


def _token_mixer_shapes(spec: ModelSpec, layer: int, tp: int) -> dict[str, list[int]]:
    """The token mixer's parameter shapes on one TP rank, as megatron-core 0.16.1's constructors make them."""
    h = spec.hidden_size
    prefix = f"decoder.layers.{layer}."
    if spec.linear_attention_pattern[layer]:  # ssm/gated_delta_net.py GatedDeltaNet.__init__
        qk = spec.linear_num_key_heads * spec.linear_key_head_dim
        v = spec.linear_num_value_heads * spec.linear_value_head_dim
        nv = spec.linear_num_value_heads
        return {
            prefix + "self_attention.in_proj.weight": [(2 * qk + 2 * v + 2 * nv) // tp, h],  # q k v gate beta alpha
            prefix + "self_attention.in_proj.layer_norm_weight": [h],  # the layer's input norm, fused
            prefix + "self_attention.conv1d.weight": [(2 * qk + v) // tp, 1, spec.linear_conv_kernel_dim],
            prefix + "self_attention.dt_bias": [nv // tp],
            prefix + "self_attention.A_log": [nv // tp],
            prefix + "self_attention.out_norm.weight": [spec.linear_value_head_dim],
            prefix + "self_attention.out_proj.weight": [h, v // tp],
        }
    d, heads, groups = spec.kv_channels, spec.num_attention_heads, spec.num_query_groups
    gate = heads * d if spec.attention_output_gate else 0  # transformer/attention.py SelfAttention.linear_qkv_out_dim
    return {
        prefix + "input_layernorm.weight": [h],
        prefix + "self_attention.linear_qkv.weight": [(heads * d + 2 * groups * d + gate) // tp, h],
        prefix + "self_attention.q_layernorm.weight": [d],
        prefix + "self_attention.k_layernorm.weight": [d],
        prefix + "self_attention.linear_proj.weight": [h, heads * d // tp],
    }


@pytest.mark.parametrize("case", CASE_PARAMS)
def test_token_mixer_shapes_match_megatron_core(mcore_counts, case: McoreCase):
    """Each layer's gated-DeltaNet or attention parameters, by name and shape: megatron-core builds the layer
    kind `linear_attention_pattern` names, with the shapes its constructors give (a check independent of
    `theory.params`)."""
    spec = ModelSpec.from_dict(case.spec)
    for rank in rank_results(mcore_counts, case):
        shapes = rank["shapes"]
        for local, layer in enumerate(rank["layers"]):
            # megatron names a stage's layers by their local index
            local_prefix, prefix = f"decoder.layers.{local}.", f"decoder.layers.{layer}."
            mixer = {
                prefix + name.removeprefix(local_prefix): shape
                for name, shape in shapes.items()
                if name.startswith(local_prefix) and not name.startswith((local_prefix + "mlp.", local_prefix + "pre_"))
            }
            assert mixer == _token_mixer_shapes(spec, layer, case.tp), f"{case.name}: layer {layer}"


def test_gated_delta_net_layer_count_by_hand():
    """The per-module counts megatron-core gave for QWEN3_NEXT_DENSE at tp 1 (layer 0: gated DeltaNet, layer 3:
    softmax attention with the output gate; the MLP is 256 pre-MLP norm + 1024 x 256 + 256 x 512)."""
    gdn = 392 * 256 + 256 + 256 * 4 + 4 + 4 + 32 + 256 * 128
    attention = 256 + 768 * 256 + 64 + 64 + 256 * 256
    mlp = 256 + 1024 * 256 + 256 * 512
    assert (gdn, attention) == (134_440, 262_528)
    assert decoder_layer_parameters(QWEN3_NEXT_DENSE, 0) == (gdn + mlp, 0) == (527_912, 0)
    assert decoder_layer_parameters(QWEN3_NEXT_DENSE, 3) == (attention + mlp, 0) == (656_000, 0)
    embedding = output = 1024 * 256
    assert total_parameters(QWEN3_NEXT_DENSE).total == embedding + 3 * 527_912 + 656_000 + 256 + output
