"""The vision tower's time on the first pipeline stage, one micro-batch (`theory.vision` for what it computes).

Its blocks are priced by `layer.layer_cost` on the tower's `ModelSpec` (`VisionEncoder.tower_model`): the images of
the micro-batch are its tokens (P patches each), an image its sequence (full-attention blocks attend over it,
the others over windows), split over the decoder's TP without sequence parallelism or CP (verl's megatron-core
build runs the tower on every CP rank before the sequence is split: verl/models/mcore/qwen2_5_vl/model.py @
b178a3c), with the run's precision and recompute (verl builds the tower's config from a copy of the decoder's,
vision_config.get_vision_model_config). Besides the blocks: the patch embedding (one GEMM of patches x
patch_features -> hidden, not split; the pixels need no gradient, so no dgrad) and the merger (a norm, then
column- and row-parallel GEMMs with an all-reduce of the output over TP forward, of the input gradient backward).
Eager, like the decoder's layers: each block adds its host issue time."""

from __future__ import annotations

from dataclasses import dataclass, replace

from ..specs.model import ModelSpec
from ..specs.parallel import ParallelConfig, Workload
from ..theory.vision import images_per_microbatch, patches_per_image
from .collectives import collective_time_s
from .compute import gemm_time_s, memory_bound_time_s
from .layer import E_BF16, LayerContext, LayerCost, layer_cost, merge_parts


@dataclass(frozen=True)
class VisionCost:
    """One micro-batch of the tower on one rank: seconds by class forward and backward (recompute included), and
    the host's issue time of its blocks."""

    fwd: dict[str, float]
    bwd: dict[str, float]
    host_fwd_s: float
    host_bwd_s: float


def vision_cost(
    model: ModelSpec, parallel: ParallelConfig, workload: Workload, ctx: LayerContext, scale: float = 1.0
) -> VisionCost | None:
    """The tower's time for one micro-batch of the first stage (None without a tower or images); `ctx`: the
    decoder's layer context, `scale`: its calibration factor."""
    vision = model.vision
    image_tokens = workload.image_tokens_per_sequence
    if vision is None or not image_tokens:
        return None
    images = images_per_microbatch(parallel, workload)
    patches = patches_per_image(vision, image_tokens)
    tower = vision.tower_model()
    full = ctx.training and workload.recompute.is_full
    tctx = replace(
        ctx, sequence_parallel=False, cp=1, ep=1, etp=1, tokens=images * patches, seq_length=patches,
        tp_comm_overlap=False, moe_host_bound=False, full_recompute=full,
        recompute_modules=() if full else ctx.recompute_modules,
    )  # fmt: skip
    fwd: dict[str, float] = {}
    bwd: dict[str, float] = {}
    host_fwd = host_bwd = 0.0
    kinds: dict[bool, LayerCost] = {}
    for layer in range(vision.depth):
        windowed = tower.is_window_layer(layer)
        if windowed not in kinds:
            kinds[windowed] = layer_cost(tower, layer, tctx).scaled(scale)
        lc = kinds[windowed]
        f, b = lc.pass_parts()
        merge_parts(fwd, f)
        merge_parts(bwd, b)
        host_fwd += lc.host_fwd_s
        host_bwd += lc.host_bwd_s
    ends_f, ends_b = _embed_and_merger(vision, ctx, images * patches, images * image_tokens)
    merge_parts(fwd, ends_f, scale)
    merge_parts(bwd, ends_b, scale)
    return VisionCost(fwd, bwd, host_fwd, host_bwd)


def _embed_and_merger(vision, ctx: LayerContext, patches: float, tokens: float):
    """(forward, backward) seconds by class of the patch embedding and the merger for `patches` patches making
    `tokens` image tokens."""
    gpu, cal, tp = ctx.cluster.gpu, ctx.calibration, ctx.tp
    h, k, m, out = vision.hidden_size, vision.patch_features, vision.merger_width, vision.out_hidden_size
    e = E_BF16
    f = {
        "gemm": gemm_time_s(patches, h, k, gpu, "bf16", 1, "patch_embed", "fwd", cal)
        + gemm_time_s(tokens, m / tp, m, gpu, ctx.precision, 1, "fc1", "fwd", cal)
        + gemm_time_s(tokens, out, m / tp, gpu, ctx.precision, 1, "fc2", "fwd", cal),
        "memory_bound": memory_bound_time_s(2 * e * patches * h + 2 * e * tokens * m / tp, gpu, 2),
    }
    b: dict[str, float] = {}
    if ctx.training:
        mg = ctx.main_grad_bytes
        b["gemm"] = (
            gemm_time_s(h, k, patches, gpu, "bf16", 1, "patch_embed", "wgrad", cal, 1.0, mg)
            + gemm_time_s(tokens, m, m / tp, gpu, ctx.precision, 1, "fc1", "dgrad", cal)
            + gemm_time_s(m, m / tp, tokens, gpu, ctx.precision, 1, "fc1", "wgrad", cal, 1.0, mg)
            + gemm_time_s(tokens, m / tp, out, gpu, ctx.precision, 1, "fc2", "dgrad", cal)
            + gemm_time_s(m / tp, out, tokens, gpu, ctx.precision, 1, "fc2", "wgrad", cal, 1.0, mg)
        )
        b["memory_bound"] = memory_bound_time_s(3 * e * patches * h + 3 * e * tokens * m / tp, gpu, 2)
    if tp > 1:
        f["tp"] = collective_time_s("all_reduce", tp, e * tokens * out, ctx.cluster, 1)
        if ctx.training:
            b["tp"] = collective_time_s("all_reduce", tp, e * tokens * m, ctx.cluster, 1)
    return f, b
