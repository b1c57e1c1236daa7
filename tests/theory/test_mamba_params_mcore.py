"""Ground truth for hybrid Mamba (Nemotron-H) parameter counts: megatron-core 0.16.1 `MambaModel`s built on CPU.

A small Nemotron-H-shaped model (hybrid_override_pattern "MEM*EM-E": Mamba-2 mixer layers, one attention-only
layer, one MLP-only layer with a non-gated squared-ReLU MLP, and MoE-only layers with 8 routed experts top-2 and a
shared expert) is built for real on gloo ranks (subprocesses, see `tests/mcore_helpers.py`) as megatron-core's own
`MambaModel` / `MambaStack` / `MambaMixer`, through a local copy of `mamba_layer_specs.mamba_stack_spec` (TE's modules
replaced by local ones with the same parameters; mamba_ssm's gated RMSNorm by a module holding its `weight`; see
`_local_mamba_stack_spec` and `_patch_mamba_for_cpu` there). Each rank's counts must equal `theory.params`: the whole
model (`total_parameters`), every decoder layer (`decoder_layer_parameters`) and each pipeline stage
(`stage_parameters`), at tp 1, tp 2, pp 2 (MambaStack's own even split) and ep 2. The parameter shapes are also
checked against the formulas of megatron-core's constructors written out from the `ModelSpec` fields, independently
of `theory.params`.

For the model below (h 256; Mamba 8 heads of 32, state 16, 2 groups; attention 4 heads / 2 groups of 64; ffn 512;
MoE 8 x 64 + shared 128) megatron builds at tp 1, per Mamba layer: in_proj 584 x 256 (+ 256 fused input norm),
conv1d 320 x 1 x 4 + bias 320, dt_bias / A_log / D 8 each, the gated norm 256, out_proj 256 x 256 (217,176 in all);
per attention layer linear_qkv 512 x 256 (+ 256 fused norm), linear_proj 256 x 256 (196,864); per MLP layer fc1
512 x 256 (+ 256 fused norm), fc2 256 x 512 (262,400); per MoE layer pre_mlp_layernorm 256, router 8 x 256, shared
expert 128 x 256 + 256 x 128 (67,840) and 8 routed experts of 64 x 256 + 256 x 64 (262,144).
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

NEMOTRON_H_MOE = ModelSpec(  # every symbol: M Mamba-2, * attention, - MLP, E MoE
    name="nemotron-h-moe",
    hidden_size=256,
    num_layers=8,
    num_attention_heads=4,
    num_query_groups=2,
    kv_channels=64,
    ffn_hidden_size=512,
    vocab_size=1024,
    gated_linear_unit=False,
    activation="squared_relu",
    position_embedding_type="none",
    hybrid_layer_pattern="MEM*EM-E",
    mamba_num_heads=8,
    mamba_head_dim=32,
    mamba_state_dim=16,
    mamba_num_groups=2,
    num_moe_experts=8,
    moe_router_topk=2,
    moe_ffn_hidden_size=64,
    moe_shared_expert_intermediate_size=128,
)
NEMOTRON_H_DENSE = NEMOTRON_H_MOE.replace(  # no MoE layers, tied embeddings
    name="nemotron-h-dense",
    hybrid_layer_pattern="M-M*M-M-",
    num_moe_experts=0,
    moe_router_topk=0,
    moe_ffn_hidden_size=0,
    moe_shared_expert_intermediate_size=0,
    tie_embeddings=True,
)


def _case(name: str, spec: ModelSpec, **kwargs) -> McoreCase:
    return McoreCase(name=name, spec=spec.to_dict(), **kwargs)


CASES = [
    _case("mamba-nemotron-h-moe", NEMOTRON_H_MOE),
    _case("mamba-nemotron-h-dense", NEMOTRON_H_DENSE),
    _case("mamba-nemotron-h-moe-tp2", NEMOTRON_H_MOE, world=2, tp=2),
    _case("mamba-nemotron-h-moe-pp2", NEMOTRON_H_MOE, world=2, pp=2),
    _case("mamba-nemotron-h-moe-ep2", NEMOTRON_H_MOE, world=2, ep=2),
    _case("mamba-nemotron-h-dense-pp2", NEMOTRON_H_DENSE, world=2, pp=2),
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
    """Per rank: its layers, its counts and each layer's (dense, expert) count, of all four layer kinds."""
    check_layers_and_stages(rank_results(mcore_counts, case), case)


def _layer_shapes(spec: ModelSpec, layer: int, tp: int, ep: int) -> dict[str, list[int]]:
    """Layer `layer`'s parameter shapes on one TP / EP rank, as megatron-core 0.16.1's constructors make them with
    mamba_stack_spec's modules (each layer's input norm fused into its first linear: `layer_norm_weight`)."""
    h = spec.hidden_size
    symbol = spec.hybrid_layer_pattern[layer]
    if symbol == "M":  # ssm/mamba_mixer.py MambaMixer.__init__ (mamba_num_heads given: d_inner = heads x head dim)
        heads, groups, state = spec.mamba_num_heads, spec.mamba_num_groups, spec.mamba_state_dim
        d_inner = heads * spec.mamba_head_dim
        conv_channels = (d_inner + 2 * groups * state) // tp  # x B C
        return {
            "mixer.in_proj.weight": [(2 * d_inner + 2 * groups * state + heads) // tp, h],  # z x B C dt
            "mixer.in_proj.layer_norm_weight": [h],
            "mixer.conv1d.weight": [conv_channels, 1, 4],  # depthwise, d_conv 4
            "mixer.conv1d.bias": [conv_channels],  # conv_bias=True
            "mixer.dt_bias": [heads // tp],
            "mixer.A_log": [heads // tp],
            "mixer.D": [heads // tp],  # D_has_hdim=False
            "mixer.norm.weight": [d_inner // tp],  # the gated RMSNorm over this rank's d_inner
            "mixer.out_proj.weight": [h, d_inner // tp],
        }
    if symbol == "*":  # transformer/attention.py SelfAttention
        d, heads, groups = spec.kv_channels, spec.num_attention_heads, spec.num_query_groups
        return {
            "self_attention.linear_qkv.weight": [(heads + 2 * groups) * d // tp, h],
            "self_attention.linear_qkv.layer_norm_weight": [h],
            "self_attention.linear_proj.weight": [h, heads * d // tp],
        }
    fc1 = 2 if spec.gated_linear_unit else 1
    if symbol == "-":  # transformer/mlp.py MLP
        ffn = spec.ffn_hidden_size
        return {
            "mlp.linear_fc1.weight": [fc1 * ffn // tp, h],
            "mlp.linear_fc1.layer_norm_weight": [h],
            "mlp.linear_fc2.weight": [h, ffn // tp],
        }
    # E: transformer/moe MoELayer (router, SequentialMLP of this EP rank's experts, SharedExpertMLP)
    shapes = {"pre_mlp_layernorm.weight": [h], "mlp.router.weight": [spec.num_moe_experts, h]}
    ffn, shared = spec.moe_ffn_hidden_size, spec.moe_shared_expert_intermediate_size
    for expert in range(spec.num_moe_experts // ep):
        shapes[f"mlp.experts.local_experts.{expert}.linear_fc1.weight"] = [fc1 * ffn // tp, h]
        shapes[f"mlp.experts.local_experts.{expert}.linear_fc2.weight"] = [h, ffn // tp]
    if shared:
        shapes["mlp.shared_experts.linear_fc1.weight"] = [fc1 * shared // tp, h]
        shapes["mlp.shared_experts.linear_fc2.weight"] = [h, shared // tp]
    return shapes


@pytest.mark.parametrize("case", CASE_PARAMS)
def test_layer_shapes_match_megatron_core(mcore_counts, case: McoreCase):
    """Each layer's parameters, by name and shape: megatron-core builds the layer kind `hybrid_layer_pattern` names
    with the shapes its constructors give (a check independent of `theory.params`)."""
    spec = ModelSpec.from_dict(case.spec)
    for rank in rank_results(mcore_counts, case):
        shapes = rank["shapes"]
        for local, layer in enumerate(rank["layers"]):
            prefix = f"decoder.layers.{local}."  # megatron names a stage's layers by their local index
            measured = {name.removeprefix(prefix): shape for name, shape in shapes.items() if name.startswith(prefix)}
            assert measured == _layer_shapes(spec, layer, case.tp, case.ep), f"{case.name}: layer {layer}"


def test_mamba_layer_count_by_hand():
    """The per-module counts megatron-core gave for NEMOTRON_H_MOE at tp 1 (layer 0 Mamba, 3 attention, 6 MLP,
    1 MoE) and for a Mamba layer at tp 2 (everything but the fused input norm halves)."""
    mamba = 584 * 256 + 256 + 320 * 4 + 320 + 3 * 8 + 256 + 256 * 256
    attention = 256 + 512 * 256 + 256 * 256
    mlp = 256 + 512 * 256 + 256 * 512
    moe_dense, moe_experts = 256 + 8 * 256 + 2 * 128 * 256, 8 * 2 * 64 * 256
    assert (mamba, attention, mlp, moe_dense, moe_experts) == (217_176, 196_864, 262_400, 67_840, 262_144)
    assert decoder_layer_parameters(NEMOTRON_H_MOE, 0) == (mamba, 0)
    assert decoder_layer_parameters(NEMOTRON_H_MOE, 3) == (attention, 0)
    assert decoder_layer_parameters(NEMOTRON_H_MOE, 6) == (mlp, 0)
    assert decoder_layer_parameters(NEMOTRON_H_MOE, 1) == (moe_dense, moe_experts)
    mamba_tp2 = 292 * 256 + 256 + 160 * 4 + 160 + 3 * 4 + 128 + 256 * 128
    assert decoder_layer_parameters(NEMOTRON_H_MOE, 0, tp=2) == (mamba_tp2, 0) == (108_716, 0)
    embedding = output = 1024 * 256
    decoder = 3 * mamba + attention + mlp + 3 * (moe_dense + moe_experts)
    assert total_parameters(NEMOTRON_H_MOE).total == embedding + decoder + 256 + output == 2_625_288
