"""Ground truth for `theory.params`: real megatron-core `GPTModel`s built on CPU, counted per rank.

Every case is built for real on `world` gloo ranks (subprocesses, see `tests/mcore_helpers.py`):
tensor, pipeline (with each stage's pre/post-process and layer offset), virtual pipeline
(`vp_stage` chunks), expert and expert-tensor parallelism. Each rank's counts, split into the
`ParameterCounts` fields, must equal `stage_parameters(spec, ParallelConfig(...), stage=pp_rank)`.

Megatron-core is built with its local (non-TE) layer spec since Transformer Engine is not
installed. Parameter shapes are the same as with the TE spec, with one exception handled below:
the local MLA spec makes the q / kv *down* projections `ColumnParallelLinear` (split over tp),
where the TE spec (which `theory.params` models) duplicates them on every TP rank.
"""

from __future__ import annotations

import dataclasses

import pytest

from megatron_autotuner.specs.model import ModelSpec
from megatron_autotuner.specs.parallel import ParallelConfig
from megatron_autotuner.theory.params import stage_layer_range, stage_parameters, total_parameters
from tests.mcore_helpers import McoreCase

pytest.importorskip("torch")
pytest.importorskip("megatron.core")

pytestmark = pytest.mark.mcore

# ---- models (small: hidden 64-128, vocab 1024) ------------------------------------------------
GPT = ModelSpec(  # (a) GPT-2 style
    name="gpt",
    hidden_size=64,
    num_layers=2,
    num_attention_heads=4,
    ffn_hidden_size=256,
    vocab_size=1024,
    gated_linear_unit=False,
    activation="gelu",
    normalization="LayerNorm",
    add_bias_linear=True,
    tie_embeddings=True,
    position_embedding_type="learned_absolute",
    max_position_embeddings=128,
    hidden_dropout=0.1,
    attention_dropout=0.1,
)
LLAMA = ModelSpec(  # (b) GQA + SwiGLU + RMSNorm, untied
    name="llama",
    hidden_size=128,
    num_layers=4,
    num_attention_heads=8,
    num_query_groups=2,
    ffn_hidden_size=352,
    vocab_size=1024,
)
LLAMA_TIED = LLAMA.replace(name="llama-tied", tie_embeddings=True)  # (c)
LLAMA_PADDED_VOCAB = LLAMA.replace(name="llama-vocab1000", vocab_size=1000)
QWEN3 = ModelSpec(  # per-head q/k RMSNorm; head dim 32 != hidden / heads
    name="qwen3",
    hidden_size=64,
    num_layers=2,
    num_attention_heads=4,
    num_query_groups=2,
    kv_channels=32,
    ffn_hidden_size=192,
    vocab_size=1024,
    qk_layernorm=True,
    tie_embeddings=True,
)
QWEN2 = QWEN3.replace(name="qwen2", kv_channels=16, qk_layernorm=False, add_qkv_bias=True, tie_embeddings=False)
MOE_SHARED = ModelSpec(  # (d) top-k routed experts + shared expert
    name="moe-shared",
    hidden_size=64,
    num_layers=2,
    num_attention_heads=4,
    ffn_hidden_size=256,
    vocab_size=1024,
    num_moe_experts=8,
    moe_router_topk=2,
    moe_ffn_hidden_size=64,
    moe_shared_expert_intermediate_size=128,
)
MOE_SHARED_GATE = MOE_SHARED.replace(name="moe-shared-gate", moe_shared_expert_gate=True)
MOE_FIRST_DENSE = MOE_SHARED_GATE.replace(  # DeepSeek's first_k_dense_replace = 1
    name="moe-first-dense", num_layers=4, moe_layer_pattern=(0, 1, 1, 1)
)
MOE_INTERLEAVED = MOE_SHARED.replace(  # with pp=2, vpp=2: rank 0 holds layers 0, 2; rank 1 holds 1, 3
    name="moe-interleaved", num_layers=4, moe_layer_pattern=(0, 0, 1, 1), moe_shared_expert_intermediate_size=0
)
MOE_BIAS_LN = ModelSpec(  # biases in experts, LayerNorm, GELU, top-1
    name="moe-bias-layernorm",
    hidden_size=64,
    num_layers=2,
    num_attention_heads=4,
    ffn_hidden_size=256,
    vocab_size=1024,
    gated_linear_unit=False,
    activation="gelu",
    normalization="LayerNorm",
    add_bias_linear=True,
    num_moe_experts=4,
    moe_router_topk=1,
    moe_ffn_hidden_size=64,
)
MLA = ModelSpec(
    name="mla",
    hidden_size=64,
    num_layers=2,
    num_attention_heads=4,
    ffn_hidden_size=256,
    vocab_size=1024,
    multi_latent_attention=True,
    q_lora_rank=32,
    kv_lora_rank=32,
    qk_head_dim=16,
    qk_pos_emb_head_dim=8,
    v_head_dim=16,
)
MLA_NO_Q_LORA = MLA.replace(name="mla-no-q-lora", q_lora_rank=None)
MTP_MOE = MOE_SHARED.replace(name="mtp-moe", moe_layer_pattern=(0, 1), mtp_num_layers=1)
MTP_MOE_TIED = MTP_MOE.replace(name="mtp-moe-tied", tie_embeddings=True)
DEEPSEEK_LIKE = dataclasses.replace(  # MLA + first-dense MoE + shared experts + MTP
    MLA,
    name="deepseek-like",
    num_layers=4,
    num_moe_experts=8,
    moe_router_topk=2,
    moe_ffn_hidden_size=32,
    moe_shared_expert_intermediate_size=32,
    moe_layer_pattern=(0, 1, 1, 1),
    mtp_num_layers=1,
)


GPT_OSS_LIKE = MOE_BIAS_LN.replace(  # gpt-oss: biases everywhere, learnable attention sinks, alternating windows
    name="gpt-oss-like",
    normalization="RMSNorm",
    gated_linear_unit=True,
    activation="quick_gelu",
    num_query_groups=2,
    moe_router_topk=2,
    softmax_type="learnable",
    window_size=16,
    window_layer_pattern=(1, 0),
)


def _case(name: str, spec: ModelSpec, **kwargs) -> McoreCase:
    return McoreCase(name=name, spec=spec.to_dict(), **kwargs)


CASES = [
    # world size 1: the whole model on one rank
    _case("gpt-gelu-bias-learned-tied", GPT),
    _case("llama-gqa-swiglu-untied", LLAMA),
    _case("llama-gqa-swiglu-tied", LLAMA_TIED),
    _case("llama-padded-vocab", LLAMA_PADDED_VOCAB, padded_vocab_size=LLAMA_PADDED_VOCAB.padded_vocab_size()),
    _case("qwen3-qk-layernorm", QWEN3),
    _case("qwen2-qkv-bias", QWEN2),
    _case("moe-topk-shared", MOE_SHARED),
    _case("moe-topk-shared-gate", MOE_SHARED_GATE),
    _case("moe-first-layer-dense", MOE_FIRST_DENSE),
    _case("moe-bias-layernorm", MOE_BIAS_LN),
    _case("mla", MLA),
    _case("mla-no-q-lora", MLA_NO_Q_LORA),
    _case("mtp-moe", MTP_MOE),
    _case("mtp-moe-tied", MTP_MOE_TIED),
    _case("deepseek-like", DEEPSEEK_LIKE),
    _case("gpt-oss-like-sinks-windows", GPT_OSS_LIKE),
    # world size 2
    _case("gpt-tp2", GPT, world=2, tp=2),
    _case("llama-tp2", LLAMA, world=2, tp=2),
    _case("llama-padded-vocab-tp2", LLAMA_PADDED_VOCAB, world=2, tp=2, padded_vocab_size=1024),
    _case("qwen3-tp2", QWEN3, world=2, tp=2),
    _case("qwen2-tp2", QWEN2, world=2, tp=2),
    _case("moe-first-layer-dense-tp2", MOE_FIRST_DENSE, world=2, tp=2),
    # megatron-core supports expert biases only with etp = 1
    _case("moe-bias-layernorm-tp2-etp1", MOE_BIAS_LN, world=2, tp=2, etp=1),
    _case("gpt-oss-like-tp2-etp1", GPT_OSS_LIKE, world=2, tp=2, etp=1),
    _case("mla-tp2", MLA, world=2, tp=2),
    _case("mtp-moe-tp2", MTP_MOE, world=2, tp=2),
    _case("gpt-tied-pp2", GPT, world=2, pp=2),
    _case("llama-untied-pp2", LLAMA, world=2, pp=2),
    _case("llama-tied-pp2", LLAMA_TIED, world=2, pp=2),
    _case("moe-first-layer-dense-pp2", MOE_FIRST_DENSE, world=2, pp=2),
    _case("mtp-moe-pp2", MTP_MOE, world=2, pp=2),
    _case("mtp-moe-tied-pp2", MTP_MOE_TIED, world=2, pp=2),
    _case("llama-tied-pp2-vpp2", LLAMA_TIED, world=2, pp=2, vpp=2),
    _case("moe-interleaved-pp2-vpp2", MOE_INTERLEAVED, world=2, pp=2, vpp=2),
    _case("moe-shared-gate-ep2", MOE_SHARED_GATE, world=2, ep=2),
    _case("moe-first-layer-dense-ep2", MOE_FIRST_DENSE, world=2, ep=2),
    # world size 4
    _case("moe-first-layer-dense-tp2-ep2", MOE_FIRST_DENSE, world=4, tp=2, ep=2),
    _case("moe-shared-gate-tp2-ep2-etp1", MOE_SHARED_GATE, world=4, tp=2, ep=2, etp=1),
    _case("moe-shared-ep4", MOE_SHARED, world=4, ep=4),
    _case("moe-first-layer-dense-pp2-ep2", MOE_FIRST_DENSE, world=4, pp=2, ep=2),
    _case("gpt-tied-tp2-pp2", GPT, world=4, tp=2, pp=2),
    _case("llama-tied-pp4", LLAMA_TIED, world=4, pp=4),
    _case("llama-untied-tp2-pp2-vpp2", LLAMA, world=4, tp=2, pp=2, vpp=2),
]
CASE_PARAMS = [pytest.param(case, id=case.name, marks=case.marks) for case in CASES]


MCORE_CASES = CASES  # built by conftest's `mcore_ground_truth`, with the other modules' cases


@pytest.fixture(scope="module")
def mcore_counts(mcore_ground_truth) -> dict:
    """Every case built once (all world sizes concurrently); {case name: [per-rank result]}."""
    return mcore_ground_truth


def _parallel(case: McoreCase) -> ParallelConfig:
    return ParallelConfig(num_gpus=case.world, tp=case.tp, pp=case.pp, ep=case.ep, etp=case.etp, vpp=case.vpp)


def _local_mla_down_proj_correction(spec: ModelSpec, parallel: ParallelConfig) -> int:
    """Per-layer difference local spec - TE spec: the local spec splits the MLA down projections over tp."""
    if not spec.multi_latent_attention or parallel.tp == 1:
        return 0
    down = spec.hidden_size * (spec.kv_lora_rank + spec.qk_pos_emb_head_dim)
    if spec.q_lora_rank is not None:
        down += spec.hidden_size * spec.q_lora_rank
    return down // parallel.tp - down


def _expected(case: McoreCase, stage: int) -> dict[str, int]:
    spec, parallel = ModelSpec.from_dict(case.spec), _parallel(case)
    counts = stage_parameters(spec, parallel, stage, padded_vocab_size=case.padded_vocab_size)
    correction = _local_mla_down_proj_correction(spec, parallel)
    if correction:
        last = stage == parallel.pp - 1
        counts = dataclasses.replace(
            counts,
            decoder_dense=counts.decoder_dense + correction * len(stage_layer_range(spec, parallel, stage)),
            mtp_dense=counts.mtp_dense + (correction * spec.mtp_num_layers if last else 0),
        )
    return counts.to_dict()


def _rank_results(mcore_counts: dict, case: McoreCase) -> list[dict]:
    ranks = mcore_counts.get(case.name)
    assert ranks, f"no result for {case.name}"
    errors = [r["error"] for r in ranks if "error" in r]
    assert not errors, f"megatron-core failed to build {case.name}:\n{errors[0]}"
    assert len(ranks) == case.world
    return ranks


@pytest.mark.parametrize("case", CASE_PARAMS)
def test_stage_parameters_match_megatron_core(mcore_counts, case: McoreCase):
    ranks = _rank_results(mcore_counts, case)
    assert sorted({r["pp_rank"] for r in ranks}) == list(range(case.pp))
    for rank in ranks:
        assert rank["other"] == {}, f"parameters outside the counted components: {rank['other']}"
        assert rank["num_chunks"] == (case.vpp or 1)
        where = f"{case.name}: rank {rank['rank']} (tp_rank {rank['tp_rank']}, pp_rank {rank['pp_rank']})"
        layers = stage_layer_range(ModelSpec.from_dict(case.spec), _parallel(case), rank["pp_rank"])
        assert rank["layers"] == layers, where
        assert rank["counts"] == _expected(case, rank["pp_rank"]), where
        if case.ep > 1:  # megatron's own marker of expert-parallel parameters (allreduce=False)
            assert rank["marked_expert"] == rank["counts"]["experts"], where


WORLD1_CASES = [pytest.param(case, id=case.name, marks=case.marks) for case in CASES if case.world == 1]


@pytest.mark.parametrize("case", WORLD1_CASES)
def test_total_and_active_parameters_match_megatron_core(mcore_counts, case: McoreCase):
    """Whole model: total, and active = dense + top-k / E of the (equal-sized) routed experts."""
    (rank,) = _rank_results(mcore_counts, case)
    spec = ModelSpec.from_dict(case.spec)
    theory = total_parameters(spec, padded_vocab_size=case.padded_vocab_size)
    measured = rank["counts"]
    assert theory.total == measured["total"]
    active = measured["dense"]
    if spec.is_moe:
        assert measured["experts"] % spec.num_moe_experts == 0
        active += measured["experts"] // spec.num_moe_experts * spec.moe_router_topk
    assert theory.active == active
