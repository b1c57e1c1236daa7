"""Parameter counts, per layer, per pipeline stage and per rank, as megatron-core lays them out.

Layout (megatron-core `GPTModel` with the Transformer Engine layer spec, which users train with):
- word embeddings `[vocab/tp, h]` on the first stage; learned absolute position embeddings
  `[max_pos, h]` (not split) beside them;
- per decoder layer: input norm (h; LayerNorm 2h), `linear_qkv` `[(q + 2*g*d)/tp, h]` (+ bias),
  optional per-head q/k norms (d each, not split), `linear_proj` `[h, q/tp]` (+ bias h, not
  split: a row-parallel bias is replicated), pre-MLP norm, `linear_fc1` `[(2 if gated) f/tp, h]`,
  `linear_fc2` `[h, f/tp]` (+ bias h);
- MoE layers: router `[E, h]` (replicated), E/ep experts each with fc1 `[(2) F/etp, h]` and
  fc2 `[h, F/etp]`; shared experts like a dense MLP of size S split by tp, plus a `[1, h]` gate
  when `moe_shared_expert_gate`;
- MLA (TE spec): q/kv down projections are *duplicated* (not split by tp), up projections and
  `linear_proj` are column / row parallel; q and kv latent norms are replicated;
- last stage: final norm and `output_layer` `[vocab/tp, h]`; with tied embeddings and pp > 1 the
  last stage holds its own copy of the word embeddings (kept in sync by an all-reduce); with MTP the final
  norm sits with the last decoder layer instead (`TransformerBlock.has_final_layernorm_in_this_stage`);
- MTP layers (DeepSeek-V3) sit on the last stage, or where a pipeline layout string puts them: two norms,
  `eh_proj` `[h/tp, 2h]`, a decoder layer and a final norm; they share embedding and output layer with the main
  model (a model chunk with MTP layers builds its own copy of the embedding: `pre_process or mtp_process`);
- which layers sit on which stage: `specs.pipeline.PipelineLayout` (even, uneven first / last, embedding / loss
  accounting, layout strings);
- MoE router bias `[E]` when `add_bias_linear`;
- attention sinks (`softmax_type` learnable, gpt-oss): `core_attention.softmax_offset` `[a/tp]` per layer;
- gated-DeltaNet layers (Qwen3-Next) replace self-attention by `gated_delta_net_parameters`; an output gate on
  softmax attention widens `linear_qkv` by heads x head dim;
- a vision-language model's vision tower on the first stage (`theory.vision.vision_parameters`);
- hybrid models (megatron-core MambaModel): each layer is a Mamba-2 mixer, self-attention, an MLP or a MoE block
  with its own input norm (`ModelSpec.hybrid_layer_pattern`); the final norm and output layer as above.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from functools import lru_cache

from ..specs.model import ModelSpec
from ..specs.parallel import ParallelConfig, pipeline_layout_of
from ..specs.vision import VisionEncoder
from . import mamba


@dataclass(frozen=True)
class ParameterCounts:
    """Parameters of one rank (or of a whole model), split the way memory and FLOPs need them.

    `expert` are routed-expert parameters (sharded over ep x etp, data-parallel over edp);
    everything else is "dense" (sharded over tp, data-parallel over dp x cp).
    """

    embedding: int = 0
    decoder_dense: int = 0
    expert: int = 0
    final_norm: int = 0
    output_layer: int = 0
    mtp_dense: int = 0
    mtp_expert: int = 0
    vision: int = 0  # a vision-language model's vision tower (first stage)

    @property
    def dense(self) -> int:
        return self.embedding + self.decoder_dense + self.final_norm + self.output_layer + self.mtp_dense + self.vision

    @property
    def experts(self) -> int:
        return self.expert + self.mtp_expert

    @property
    def total(self) -> int:
        return self.dense + self.experts

    def __add__(self, other: ParameterCounts) -> ParameterCounts:
        return ParameterCounts(**{k: v + getattr(other, k) for k, v in asdict(self).items()})

    def to_dict(self) -> dict[str, int]:
        """Every component (`vision` only for a vision-language model's first stage), with the sums."""
        parts = {k: v for k, v in asdict(self).items() if k != "vision" or v}
        return {**parts, "dense": self.dense, "experts": self.experts, "total": self.total}


@dataclass(frozen=True)
class ModelParameterCounts:
    """Whole-model parameters (no sharding) with the active count per token for MoE models."""

    counts: ParameterCounts
    active: int

    @property
    def total(self) -> int:
        return self.counts.total


def norm_parameters(model: ModelSpec, width: int) -> int:
    """RMSNorm has a weight of `width`; LayerNorm a weight and a bias."""
    return width if model.normalization == "RMSNorm" else 2 * width


def attention_parameters(model: ModelSpec, tp: int = 1) -> int:
    """Self-attention parameters of one layer on one TP rank, including the input norm.

    GQA: qkv weight (a*d + 2*g*d) x h / tp. MLA: see module docstring.
    """
    h = model.hidden_size
    params = norm_parameters(model, h)  # input_layernorm (fused into linear_qkv with TE)
    if model.multi_latent_attention:
        a = model.num_attention_heads
        q_head = model.qk_head_dim + model.qk_pos_emb_head_dim
        if model.q_lora_rank is None:
            params += h * a * q_head // tp
        else:
            params += h * model.q_lora_rank  # linear_q_down_proj, duplicated
            params += norm_parameters(model, model.q_lora_rank)  # q_layernorm
            params += model.q_lora_rank * a * q_head // tp  # linear_q_up_proj
        params += h * (model.kv_lora_rank + model.qk_pos_emb_head_dim)  # linear_kv_down_proj, duplicated
        params += norm_parameters(model, model.kv_lora_rank)  # kv_layernorm
        params += model.kv_lora_rank * a * (model.qk_head_dim + model.v_head_dim) // tp  # linear_kv_up_proj
        params += model.attention_output_size * h // tp  # linear_proj
        if model.add_bias_linear:
            params += h
        return params
    qkv_out = model.qkv_projection_size
    params += qkv_out * h // tp
    if model.add_bias_linear or model.add_qkv_bias:
        params += qkv_out // tp
    if model.qk_layernorm:
        params += 2 * norm_parameters(model, model.kv_channels)
    params += model.attention_output_size * h // tp
    if model.add_bias_linear:
        params += h
    if model.softmax_type == "learnable":
        # attention sinks: core_attention.softmax_offset, one logit per head, split over TP (megatron-core
        # DotProductAttention / TE DotProductAttention: Parameter(num_attention_heads // tp))
        params += model.num_attention_heads // tp
    return params


def gated_delta_net_parameters(model: ModelSpec, tp: int = 1) -> int:
    """A gated-DeltaNet token mixer on one TP rank, its fused input norm included (megatron-core 0.16.1
    ssm/gated_delta_net.py, built by experimental_attention_variant_module_specs.get_gated_delta_net_module_spec):
    `in_proj` [(2 qk + 2 v + 2 nv)/tp, h] with the input norm fused (h), the depthwise `conv1d` [(2 qk + v)/tp, 1, k]
    without bias, `dt_bias` and `A_log` [nv/tp] each, `out_norm` over one value head (dv, not split) and `out_proj`
    [h, v/tp]; no linear biases (GatedDeltaNet's `bias` defaults to False and the spec leaves it)."""
    h = model.hidden_size
    params = norm_parameters(model, h)
    params += model.gdn_in_proj_size * h // tp
    params += model.gdn_conv_dim * model.linear_conv_kernel_dim // tp
    params += 2 * model.linear_num_value_heads // tp
    params += norm_parameters(model, model.linear_value_head_dim)
    params += model.linear_v_dim * h // tp
    return params


def token_mixer_parameters(model: ModelSpec, layer_index: int, tp: int = 1) -> int:
    """Layer `layer_index`'s token mixer with its input norm (fused into its first linear with TE): gated DeltaNet,
    Mamba-2 (`mamba.mixer_parameters`), self-attention, or nothing in a hybrid model's MLP / MoE layer."""
    mixer = model.token_mixer(layer_index)
    if mixer == "gdn":
        return gated_delta_net_parameters(model, tp)
    if mixer == "mamba":
        return norm_parameters(model, model.hidden_size) + mamba.mixer_parameters(model, tp)
    if mixer == "attention":
        return attention_parameters(model, tp)
    return 0


def mlp_parameters(model: ModelSpec, ffn_hidden_size: int, tp: int = 1) -> int:
    """A (dense) MLP of width `ffn_hidden_size` split over `tp`: fc1 (x2 if gated) and fc2, no norm."""
    h = model.hidden_size
    fc1_out = (2 if model.gated_linear_unit else 1) * ffn_hidden_size
    params = fc1_out * h // tp + h * ffn_hidden_size // tp
    if model.add_bias_linear:
        params += fc1_out // tp + h
    return params


def moe_parameters(model: ModelSpec, tp: int = 1, ep: int = 1, etp: int | None = None) -> tuple[int, int]:
    """(non-expert, routed-expert) parameters of one MoE MLP block on one rank, without its norm."""
    etp = tp if etp is None else etp
    h = model.hidden_size
    non_expert = model.num_moe_experts * h  # router weight, replicated
    if model.add_bias_linear:
        non_expert += model.num_moe_experts  # router bias (TopKRouter), replicated
    if model.moe_shared_expert_intermediate_size:
        non_expert += mlp_parameters(model, model.moe_shared_expert_intermediate_size, tp)
        if model.moe_shared_expert_gate:
            non_expert += h
    expert = (model.num_moe_experts // ep) * mlp_parameters(model, model.moe_ffn_hidden_size, etp)
    return non_expert, expert


def decoder_layer_parameters(
    model: ModelSpec, layer_index: int, tp: int = 1, ep: int = 1, etp: int | None = None
) -> tuple[int, int]:
    """(dense, expert) parameters of decoder layer `layer_index` on one rank: its token mixer, and its MLP or MoE
    block with that block's input norm (a hybrid model's layer has one of the two)."""
    dense = token_mixer_parameters(model, layer_index, tp)
    if not model.has_mlp(layer_index):
        return dense, 0
    dense += norm_parameters(model, model.hidden_size)  # pre-MLP norm (fused into fc1 in a hybrid MLP layer)
    if model.is_moe_layer(layer_index):
        non_expert, expert = moe_parameters(model, tp, ep, etp)
        return dense + non_expert, expert
    return dense + mlp_parameters(model, model.ffn_hidden_size, tp), 0


@lru_cache(maxsize=65536)
def _rank_layer_kinds(model: ModelSpec, layout, rank: int) -> tuple[tuple[tuple[bool, bool, bool], int], ...]:
    """(kind, how many) of the decoder layers of pipeline rank `rank` (`ModelSpec.layer_kind`)."""
    counts: dict[tuple[bool, bool, bool], int] = {}
    for layer in layout.rank_layers(rank):
        kind = model.layer_kind(layer)
        counts[kind] = counts.get(kind, 0) + 1
    return tuple(counts.items())


@lru_cache(maxsize=4096)
def _layer_parameters(model: ModelSpec, kind: tuple, tp: int, ep: int, etp: int | None) -> tuple[int, int]:
    """`decoder_layer_parameters` of a layer of `kind`: every layer of a kind has the same shape."""
    index = next(i for i in range(model.num_layers) if model.layer_kind(i) == kind)
    return decoder_layer_parameters(model, index, tp, ep, etp)


def embedding_parameters(model: ModelSpec, tp: int = 1, padded_vocab_size: int | None = None) -> int:
    """Word embeddings (vocab/tp x h) plus learned absolute position embeddings if any."""
    vocab = padded_vocab_size or model.vocab_size
    params = vocab * model.hidden_size // tp
    if model.position_embedding_type == "learned_absolute":
        params += model.max_position_embeddings * model.hidden_size
    return params


def output_layer_parameters(model: ModelSpec, tp: int = 1, padded_vocab_size: int | None = None) -> int:
    vocab = padded_vocab_size or model.vocab_size
    return vocab * model.hidden_size // tp


def mtp_layer_parameters(model: ModelSpec, tp: int = 1, ep: int = 1, etp: int | None = None) -> tuple[int, int]:
    """(dense, expert) parameters of one multi-token-prediction layer (megatron-core MTP block).

    enorm + hnorm + eh_proj [h/tp, 2h] + one decoder layer (shaped like the last layer) + final norm.
    """
    h = model.hidden_size
    dense, expert = decoder_layer_parameters(model, model.num_layers - 1, tp, ep, etp)
    dense += 3 * norm_parameters(model, h) + 2 * h * h // tp
    return dense, expert


def vision_parameters(vision: VisionEncoder, tp: int = 1) -> int:
    """A vision tower's parameters on one TP rank (verl's megatron-core build, verl/models/mcore/qwen2_5_vl @
    b178a3c): the patch embedding Conv3d (patch_features x hidden, no bias) is not split; the blocks are megatron-core
    layers split over TP like a decoder layer (of `VisionEncoder.tower_model`); the merger is a norm (replicated)
    and a column- then row-parallel MLP with biases (m = hidden x merge^2: m x m, then m x out)."""
    tower = vision.tower_model()
    blocks = sum(decoder_layer_parameters(tower, i, tp)[0] for i in range(vision.depth))
    m, out = vision.merger_width, vision.out_hidden_size
    merger = norm_parameters(tower, vision.hidden_size) + m * m // tp + m // tp + m * out // tp + out
    return vision.patch_features * vision.hidden_size + blocks + merger


def stage_layer_range(model: ModelSpec, parallel: ParallelConfig, stage: int) -> list[int]:
    """Global indices of the decoder layers on pipeline rank `stage` (all its virtual chunks).

    Chunk c of rank r holds the layers after those of every earlier virtual stage c*pp + r in Megatron's order
    (even split: [(c*pp + r)*n, (c*pp + r + 1)*n), n = L/(pp*vpp)).
    """
    return pipeline_layout_of(model, parallel).rank_layers(stage)


@lru_cache(maxsize=65536)  # pure and hashable; the search asks again for every micro-batch and recompute choice
def stage_parameters(
    model: ModelSpec,
    parallel: ParallelConfig,
    stage: int,
    padded_vocab_size: int | None = None,
) -> ParameterCounts:
    """Parameters held by one rank of pipeline stage `stage` (0-based) under `parallel`."""
    tp, ep, etp, pp = parallel.tp, parallel.ep, parallel.etp, parallel.pp
    decoder_dense = decoder_expert = 0
    layout = pipeline_layout_of(model, parallel)
    for kind, n in _rank_layer_kinds(model, layout, stage):
        dense, expert = _layer_parameters(model, kind, tp, ep, etp)
        decoder_dense += n * dense
        decoder_expert += n * expert
    last = stage == pp - 1
    # megatron-core builds the embedding on the first stage and in a chunk with MTP layers too
    # (the MTP block embeds the shifted tokens itself): `pre_process or mtp_process`.
    embedding = embedding_parameters(model, tp, padded_vocab_size) * layout.rank_embedding_copies(stage)
    output_layer = 0
    if last and (not model.tie_embeddings or pp > 1):
        output_layer = output_layer_parameters(model, tp, padded_vocab_size)
    mtp_dense = mtp_expert = 0
    mtp_layers = layout.rank_mtp_layers(stage)
    if mtp_layers:
        dense, expert = mtp_layer_parameters(model, tp, ep, etp)
        mtp_dense, mtp_expert = dense * mtp_layers, expert * mtp_layers
    return ParameterCounts(
        embedding=embedding,
        decoder_dense=decoder_dense,
        expert=decoder_expert,
        final_norm=norm_parameters(model, model.hidden_size) if stage == layout.final_norm_rank else 0,
        output_layer=output_layer,
        mtp_dense=mtp_dense,
        mtp_expert=mtp_expert,
        vision=vision_parameters(model.vision, tp) if model.vision is not None and stage == 0 else 0,
    )


def total_parameters(model: ModelSpec, padded_vocab_size: int | None = None) -> ModelParameterCounts:
    """Whole-model parameters (tp = pp = ep = 1) and the parameters active for one token.

    Active = everything except routed experts, plus top-k of E routed experts per MoE layer.
    Tied embeddings count once.
    """
    counts = stage_parameters(model, ParallelConfig(num_gpus=1), 0, padded_vocab_size)
    active = counts.dense
    if model.is_moe:
        per_expert = mlp_parameters(model, model.moe_ffn_hidden_size)
        moe_layers = model.num_moe_layers + (model.mtp_num_layers if model.is_moe_layer(model.num_layers - 1) else 0)
        active += moe_layers * model.moe_router_topk * per_expert
    return ModelParameterCounts(counts=counts, active=active)
