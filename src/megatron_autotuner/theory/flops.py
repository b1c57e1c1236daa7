"""FLOPs per operator, per phase, per token and per iteration.

Conventions (one multiply-add = 2 FLOPs):
- A linear layer `[tokens, k] x [k, n]` costs `2*k*n` FLOPs per token forward, the same again for
  the input gradient (dgrad) and for the weight gradient (wgrad): training = 3x forward.
- Core attention per token, forward: `2*s*a*d_qk` (Q K^T) + `2*s*a*d_v` (scores x V) with full
  attention. `causal` counts half of that (the masked upper triangle is skipped), as
  Megatron-Bridge >= 25.09 reports; `full` counts the whole square, as NeMo <= 24.x and Narayanan
  et al. 2021 (arXiv 2104.04473, Eq. 3) do. Backward of attention = 2x forward, all of it dgrad.
- Elementwise work (norms, activations, softmax, rope) is not counted: model FLOPs are matmul FLOPs.
- "Model FLOPs" count the work of one forward + backward; "hardware FLOPs" add the forward work
  redone by activation recomputation.
- Variable lengths (`Workload.lengths`, packed THD micro-batches): attention is per sequence, so a micro-batch
  of sequences s_i costs attention_per_token(1) * sum_i s_i^2 (causal: half), not the square of the packed
  block; `iteration_flops` uses the effective length sum s_i^2 / sum s_i. Model FLOPs count the real tokens;
  hardware FLOPs add the alignment padding of each sequence (`padding_flops`, `specs.parallel.thd_alignment`).

Check (tests): Llama-3-8B at seq 8192: 5.79e10 FLOPs/token full, 5.15e10 causal (Megatron-Bridge
performance summary; NeMo 24.07 table).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache

from ..errors import ConfigError
from ..specs.model import ModelSpec
from ..specs.parallel import (
    ParallelConfig,
    RecomputeConfig,
    Workload,
    num_microbatches,
    packed_batch,
    pipeline_layout_of,
)
from .scan_mixers import SCAN_MIXERS
from .vision import check_images, patches_per_image

FLOPS_CONVENTIONS = ("causal", "full")
PHASES = ("fwd", "dgrad", "wgrad")


def _check_convention(convention: str) -> None:
    if convention not in FLOPS_CONVENTIONS:
        raise ConfigError("flops_convention", f"must be causal or full, got {convention!r}")


def attention_flops_per_token(
    model: ModelSpec, seq_length: float, convention: str = "causal", windowed: bool = False
) -> float:
    """Forward core-attention FLOPs per token: 2*s*a*(d_qk + d_v), halved for causal. Linear in s, so sequences of
    lengths s_i cost this at s = sum s_i^2 / sum s_i per token (`effective_seq_length`).

    A sliding-window layer (`windowed`, window w = `model.window_size` keys) longer than its window: query i sees
    min(i+1, w) keys, sum_i = s*w - w(w-1)/2, so 2*a*(d_qk + d_v) * (w - w(w-1)/(2s)) per token in either
    convention (the mask is the model's, not a counting convention).

    Bidirectional attention (`model.causal_attention` False, a vision tower) is never halved; its windows are
    disjoint blocks of w keys (Qwen2.5-VL's window attention), so a windowed query sees min(w, s) keys."""
    _check_convention(convention)
    a = model.num_attention_heads
    if model.multi_latent_attention:
        d_qk, d_v = model.qk_head_dim + model.qk_pos_emb_head_dim, model.v_head_dim
    else:
        d_qk = d_v = model.kv_channels
    w = model.window_size
    if not model.causal_attention:
        keys = min(w, seq_length) if windowed and w else seq_length
        return 2.0 * a * (d_qk + d_v) * keys
    if windowed and w and seq_length > w:
        return 2.0 * a * (d_qk + d_v) * (w - w * (w - 1) / (2.0 * seq_length))
    flops = 2.0 * seq_length * a * (d_qk + d_v)
    return flops / 2 if convention == "causal" else flops


def _mlp_ops(model: ModelSpec, ffn: int, prefix: str, tokens_factor: float = 1.0) -> dict[str, float]:
    h = model.hidden_size
    fc1_out = (2 if model.gated_linear_unit else 1) * ffn
    return {f"{prefix}fc1": 2.0 * h * fc1_out * tokens_factor, f"{prefix}fc2": 2.0 * ffn * h * tokens_factor}


def layer_forward_flops_per_token(
    model: ModelSpec, layer_index: int, seq_length: int, convention: str = "causal"
) -> dict[str, float]:
    """Forward FLOPs per token of each operator of decoder layer `layer_index`.

    Operators: qkv (or MLA's q_down/q_up/kv_down/kv_up), core_attention, proj, then fc1/fc2 for a
    dense MLP, or router, experts_fc1/experts_fc2 (top-k experts per token) and shared_fc1/shared_fc2.
    """
    h = model.hidden_size
    ops = _token_mixer_ops(model, layer_index, seq_length, convention)
    if not model.has_mlp(layer_index):
        return ops
    if model.is_moe_layer(layer_index):
        ops["router"] = 2.0 * h * model.num_moe_experts
        ops.update(_mlp_ops(model, model.moe_ffn_hidden_size, "experts_", model.moe_router_topk))
        if model.moe_shared_expert_intermediate_size:
            ops.update(_mlp_ops(model, model.moe_shared_expert_intermediate_size, "shared_"))
    else:
        ops.update(_mlp_ops(model, model.ffn_hidden_size, ""))
    return ops


def _token_mixer_ops(model: ModelSpec, layer_index: int, seq_length: int, convention: str) -> dict[str, float]:
    """Forward FLOPs per token of layer `layer_index`'s token mixer. Gated DeltaNet's and Mamba-2's in_proj and
    out_proj take the attention projections' names (and their TP pattern: column- then row-parallel) and their
    chunked scans core attention's (`theory.gated_delta_net`, `theory.mamba`); a hybrid MLP / MoE layer has none."""
    h = model.hidden_size
    mixer = model.token_mixer(layer_index)
    if mixer in SCAN_MIXERS:
        width_in, width_out = model.token_mixer_widths(layer_index)
        scan = SCAN_MIXERS[mixer].scan_flops_per_token(model)
        return {"qkv": 2.0 * h * width_in, "core_attention": scan, "proj": 2.0 * width_out * h}
    if mixer is None:
        return {}
    ops: dict[str, float] = {}
    if model.multi_latent_attention:
        a = model.num_attention_heads
        q_head = model.qk_head_dim + model.qk_pos_emb_head_dim
        if model.q_lora_rank is None:
            ops["q_proj"] = 2.0 * h * a * q_head
        else:
            ops["q_down"] = 2.0 * h * model.q_lora_rank
            ops["q_up"] = 2.0 * model.q_lora_rank * a * q_head
        ops["kv_down"] = 2.0 * h * (model.kv_lora_rank + model.qk_pos_emb_head_dim)
        ops["kv_up"] = 2.0 * model.kv_lora_rank * a * (model.qk_head_dim + model.v_head_dim)
    else:
        ops["qkv"] = 2.0 * h * model.qkv_projection_size
    windowed = model.is_window_layer(layer_index)
    ops["core_attention"] = attention_flops_per_token(model, seq_length, convention, windowed)
    ops["proj"] = 2.0 * model.attention_output_size * h
    return ops


def logits_flops_per_token(model: ModelSpec, padded_vocab_size: int | None = None) -> float:
    """Output layer forward: 2*h*V per token."""
    return 2.0 * model.hidden_size * (padded_vocab_size or model.vocab_size)


def mtp_forward_flops_per_token(model: ModelSpec, seq_length: int, convention: str = "causal") -> float:
    """One MTP layer: eh_proj (2h -> h), a decoder layer shaped like the last one, and its own logits."""
    layer = sum(layer_forward_flops_per_token(model, model.num_layers - 1, seq_length, convention).values())
    return 2.0 * 2 * model.hidden_size * model.hidden_size + layer + logits_flops_per_token(model)


def phase_flops(op: str, forward_flops: float) -> dict[str, float]:
    """Split an operator's training FLOPs into fwd / dgrad / wgrad.

    Weight GEMMs: dgrad = wgrad = fwd. Core attention has no weights: its backward (2x fwd) is dgrad.
    """
    if op == "core_attention":
        return {"fwd": forward_flops, "dgrad": 2 * forward_flops, "wgrad": 0.0}
    return {"fwd": forward_flops, "dgrad": forward_flops, "wgrad": forward_flops}


def recomputed_forward_flops_per_token(
    model: ModelSpec,
    layer_index: int,
    seq_length: int,
    recompute: RecomputeConfig,
    convention: str = "causal",
) -> float:
    """Forward FLOPs redone for layer `layer_index` by *selective* recompute (per token).

    core_attn -> core attention; mlp -> fc1+fc2 of a dense layer; moe -> router + experts + shared;
    shared_experts -> shared fc1+fc2; mla_up_proj -> q_up + kv_up; layernorm / moe_act are elementwise.
    Full recompute is handled per layer by `iteration_flops` (the whole layer forward).
    """
    if recompute.granularity != "selective":
        return 0.0
    ops = layer_forward_flops_per_token(model, layer_index, seq_length, convention)
    names: set[str] = set()
    if recompute.recomputes("core_attn") and model.token_mixer(layer_index) == "attention":
        names.add("core_attention")  # megatron-core checkpoints softmax attention's core only, not a scan
    if recompute.recomputes("mlp") and not model.is_moe_layer(layer_index):
        names |= {"fc1", "fc2"}
    if recompute.recomputes("moe") and model.is_moe_layer(layer_index):
        names |= {"router", "experts_fc1", "experts_fc2", "shared_fc1", "shared_fc2"}
    if recompute.recomputes("shared_experts"):
        names |= {"shared_fc1", "shared_fc2"}
    if recompute.recomputes("mla_up_proj"):
        names |= {"q_up", "kv_up"}
    return sum(v for k, v in ops.items() if k in names)


def full_recompute_layer_mask(model: ModelSpec, parallel: ParallelConfig, recompute: RecomputeConfig) -> list[bool]:
    """Which decoder layers (global index) full recompute checkpoints.

    uniform: every layer (groups of `num_layers` keep only their input). block: the first
    `num_layers` layers of each pipeline chunk (megatron-core `recompute_method='block'`).
    """
    if not recompute.is_full:
        return [False] * model.num_layers
    if recompute.method == "uniform":
        return [True] * model.num_layers
    mask = [False] * model.num_layers
    layout = pipeline_layout_of(model, parallel)
    for rank in range(parallel.pp):
        for chunk in range(layout.vpp):
            for position, layer in enumerate(layout.chunk_layers(rank, chunk)):
                mask[layer] = position < recompute.num_layers
    return mask


def chunk_layer_kinds(
    model: ModelSpec, parallel: ParallelConfig, stage: int, recompute: RecomputeConfig
) -> tuple[tuple[tuple[bool, bool, int, int], ...], ...]:
    """Per model chunk of rank `stage`: (MoE layer?, fully recomputed?, how many, one such layer's index) for each
    kind of layer it holds (`ModelSpec.layer_kind` of the index: a sliding-window or gated-DeltaNet layer is a kind
    of its own). Time
    and memory are per kind, so the search's inner loops count kinds, not layers."""
    return _chunk_layer_kinds(model, pipeline_layout_of(model, parallel), stage, recompute)


@lru_cache(maxsize=65536)
def _chunk_layer_kinds(model: ModelSpec, layout, stage: int, recompute: RecomputeConfig):
    parallel = ParallelConfig(num_gpus=layout.pp, pp=layout.pp, pipeline_layout=layout, vpp=layout.vpp_or_none)
    mask = full_recompute_layer_mask(model, parallel, recompute)
    out = []
    for chunk in range(layout.vpp):
        kinds: dict[tuple[bool, ...], list[int]] = {}
        for layer in layout.chunk_layers(stage, chunk):
            entry = kinds.setdefault((*model.layer_kind(layer), mask[layer]), [0, layer])
            entry[0] += 1
        out.append(tuple((kind[0], kind[-1], n, first) for kind, (n, first) in kinds.items()))
    return tuple(out)


@dataclass(frozen=True)
class FlopsBreakdown:
    """FLOPs of one iteration over the whole job (all GPUs), with per-operator and per-phase totals."""

    convention: str
    tokens_per_iteration: int
    model_flops: float  # fwd + bwd of the model (fwd only in forward mode)
    hardware_flops: float  # model_flops + recomputed forward work + padding_flops
    recompute_flops: float
    by_operator: dict[str, dict[str, float]] = field(default_factory=dict)  # op -> phase -> FLOPs
    padding_flops: float = 0.0  # packed variable lengths: the work on each sequence's alignment padding

    @property
    def model_flops_per_token(self) -> float:
        return self.model_flops / self.tokens_per_iteration

    def to_dict(self) -> dict:
        return {
            "convention": self.convention,
            "tokens_per_iteration": self.tokens_per_iteration,
            "model_flops": self.model_flops,
            "hardware_flops": self.hardware_flops,
            "recompute_flops": self.recompute_flops,
            "padding_flops": self.padding_flops,
            "model_flops_per_token": self.model_flops_per_token,
            "by_operator": self.by_operator,
        }


def model_flops_per_token(
    model: ModelSpec,
    seq_length: int,
    convention: str = "causal",
    training: bool = True,
    padded_vocab_size: int | None = None,
) -> float:
    """Model FLOPs per token: 3x forward for training (fwd + dgrad + wgrad), 1x for forward-only."""
    forward = sum(
        sum(layer_forward_flops_per_token(model, i, seq_length, convention).values()) for i in range(model.num_layers)
    )
    forward += logits_flops_per_token(model, padded_vocab_size)
    forward += model.mtp_num_layers * mtp_forward_flops_per_token(model, seq_length, convention)
    return 3 * forward if training else forward


def iteration_flops(
    model: ModelSpec,
    parallel: ParallelConfig,
    workload: Workload,
    convention: str = "causal",
    padded_vocab_size: int | None = None,
) -> FlopsBreakdown:
    """FLOPs of one iteration of `workload` (global batch x seq tokens), model and hardware.

    Independent of the parallel layout except for which layers full recompute with method 'block'
    covers (it depends on the pipeline chunking) and, with variable lengths, the packing (dp, vpp) and the
    padding (tp, cp).
    """
    _check_convention(convention)
    packed = packed_batch(parallel, workload, padded=False)
    if packed is not None:
        real = _iteration_flops(model, parallel, workload, *packing_shape(packed), convention, padded_vocab_size)
        padded = packed_batch(parallel, workload)
        work = _iteration_flops(model, parallel, workload, *packing_shape(padded), convention, padded_vocab_size)
        padding = work.model_flops - real.model_flops
        # recompute redoes the padded forward work
        return FlopsBreakdown(
            convention=convention,
            tokens_per_iteration=real.tokens_per_iteration,
            model_flops=real.model_flops,
            hardware_flops=real.model_flops + work.recompute_flops + padding,
            recompute_flops=work.recompute_flops,
            by_operator=real.by_operator,
            padding_flops=padding,
        )
    seq = workload.seq_length
    if workload.max_token_len is not None:
        tokens = num_microbatches(parallel, workload) * workload.max_token_len * parallel.dp
        tokens = min(tokens, workload.global_batch_size * seq)
    else:
        tokens = workload.global_batch_size * seq
    return _iteration_flops(model, parallel, workload, tokens, seq, convention, padded_vocab_size)


def vision_forward_flops(vision, image_tokens: float) -> dict[str, float]:
    """Forward FLOPs of one image of T = `image_tokens` tokens (P = merge^2 x T patches) of a vision tower
    (`specs.vision.VisionEncoder`), by operator: `patch_embed` 2 x patch_features x hidden x P; the tower's layer
    FLOPs per patch x P under the language model's names (qkv, core_attention over windows or the whole image,
    bidirectional; proj, fc1, fc2); `merger` 2 x (m^2 + m x out) x T, m = hidden x merge^2."""
    patches = patches_per_image(vision, image_tokens)
    tower = vision.tower_model()
    ops: dict[str, float] = {"patch_embed": 2.0 * vision.patch_features * vision.hidden_size * patches}
    for layer in range(vision.depth):
        for op, per_patch in layer_forward_flops_per_token(tower, layer, patches).items():
            ops[op] = ops.get(op, 0.0) + per_patch * patches
    m = vision.merger_width
    ops["merger"] = 2.0 * (m * m + m * vision.out_hidden_size) * image_tokens
    return ops


def vision_iteration_flops(model: ModelSpec, workload: Workload) -> dict[str, dict[str, float]]:
    """The tower's FLOPs of one iteration by operator (`vision_` + name) and phase: one image per sequence of the
    global batch. Empty for a language model or a workload without images."""
    check_images(model, workload)
    if model.vision is None or not workload.image_tokens_per_sequence:
        return {}
    images = workload.global_batch_size
    phases = PHASES if workload.is_training else ("fwd",)
    by_op: dict[str, dict[str, float]] = {}
    for op, fwd in vision_forward_flops(model.vision, workload.image_tokens_per_sequence).items():
        split = phase_flops(op, fwd * images)
        if op == "patch_embed":
            split["dgrad"] = 0.0  # the pixels need no gradient
        by_op[f"vision_{op}"] = {p: split[p] for p in phases}
    return by_op


def effective_seq_length(lengths: list[int] | tuple[int, ...]) -> float:
    """sum s_i^2 / sum s_i: the length at which per-token attention FLOPs of equal sequences match those of
    sequences s_i (attention per token is linear in s)."""
    return sum(s * s for s in lengths) / sum(lengths)


def packing_shape(batch) -> tuple[int, float]:
    """(tokens, effective sequence length) of a whole `specs.lengths.PackedBatch`."""
    return batch.total_tokens, batch.sum_squares / batch.total_tokens


def _iteration_flops(
    model: ModelSpec,
    parallel: ParallelConfig,
    workload: Workload,
    tokens: int,
    seq: float,
    convention: str,
    padded_vocab_size: int | None,
) -> FlopsBreakdown:
    """`iteration_flops` of `tokens` tokens in sequences of (effective) length `seq`."""
    training = workload.is_training
    phases = PHASES if training else ("fwd",)
    by_op: dict[str, dict[str, float]] = {}
    recompute_per_token = 0.0
    full_mask = full_recompute_layer_mask(model, parallel, workload.recompute)
    for layer in range(model.num_layers):
        ops = layer_forward_flops_per_token(model, layer, seq, convention)
        for op, fwd in ops.items():
            split = phase_flops(op, fwd)
            slot = by_op.setdefault(op, dict.fromkeys(phases, 0.0))
            for phase in phases:
                slot[phase] += split[phase] * tokens
        if training:
            if full_mask[layer]:
                recompute_per_token += sum(ops.values())
            else:
                recompute_per_token += recomputed_forward_flops_per_token(
                    model, layer, seq, workload.recompute, convention
                )
    logits = logits_flops_per_token(model, padded_vocab_size)
    by_op["logits"] = {p: logits * tokens for p in phases}
    by_op.update(vision_iteration_flops(model, workload))
    if model.mtp_num_layers:
        mtp = model.mtp_num_layers * mtp_forward_flops_per_token(model, seq, convention)
        by_op["mtp"] = {p: mtp * tokens for p in phases}
    model_flops = sum(sum(v.values()) for v in by_op.values())
    recompute_flops = recompute_per_token * tokens
    return FlopsBreakdown(
        convention=convention,
        tokens_per_iteration=tokens,
        model_flops=model_flops,
        hardware_flops=model_flops + recompute_flops,
        recompute_flops=recompute_flops,
        by_operator=by_op,
    )


def narayanan_hardware_flops(
    batch_size: int, seq_length: int, num_layers: int, hidden_size: int, vocab_size: int
) -> float:
    """Narayanan et al. 2021 Eq. 3 (full recompute, full attention, GPT with 4h MLP):
    96*B*s*l*h^2 * (1 + s/(6h) + V/(16*l*h))."""
    b, s, l, h, v = batch_size, seq_length, num_layers, hidden_size, vocab_size
    return 96.0 * b * s * l * h * h * (1 + s / (6 * h) + v / (16 * l * h))
