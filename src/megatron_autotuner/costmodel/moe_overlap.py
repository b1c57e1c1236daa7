"""Megatron's batch-level EP all-to-all overlap (`--overlap-moe-expert-parallel-comm`, `--delay-wgrad-compute`).

With it, megatron-core runs the forward of one micro-batch and the backward of another layer by layer as one
combined step on two streams (Megatron-LM d98e8a6, megatron/core/models/common/model_chunk_schedule_plan.py,
`TransformerLayerSchedulePlan.run`):

    comm stream: combine_bwd(b)    | dispatch_fwd(f) -> dispatch_bwd(b)          | combine_fwd(f)
    comp stream: pre_dispatch_fwd(f) | mlp_bwd(b) -> mlp_bwd_dw(b) -> mlp_fwd(f) | pre_dispatch_bwd(b)

`pre_dispatch` is everything of the layer before the dispatch (attention, router, permutation), `mlp` the experts
(and shared experts); each all-to-all waits for the computation that makes its input, each computation for the
all-to-all that brings it. With `--delay-wgrad-compute` the experts' weight gradients (mlp_bwd_dw) run after the
backward dispatch has been issued, so that all-to-all waits for the data gradient only; without it the experts'
backward is one piece. The steady state of the 1F1B schedule pairs every forward with a backward this way; the
warm-up forwards and cool-down backwards run alone (combined_1f1b.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..specs.model import ModelSpec
from ..specs.parallel import ParallelConfig
from .collectives import hidden_collective_cost_s
from .layer import LayerContext, gemm_phase_time, gemm_shapes


@dataclass(frozen=True)
class MoeLayerPieces:
    """One MoE layer, one micro-batch, in seconds: computation before the dispatch and of the experts, forward and
    backward (`experts_bwd_dgrad` / `experts_bwd_wgrad` the experts' data and weight gradients), and one
    all-to-all's time (dispatch and combine move the same tokens, forward and backward)."""

    pre_dispatch_fwd: float
    experts_fwd: float
    pre_dispatch_bwd: float
    experts_bwd_dgrad: float
    experts_bwd_wgrad: float
    all_to_all: float

    @property
    def serial_s(self) -> float:
        """Forward then backward without the overlap: every piece and the four all-to-alls one after another."""
        compute = self.pre_dispatch_fwd + self.experts_fwd + self.pre_dispatch_bwd
        return compute + self.experts_bwd_dgrad + self.experts_bwd_wgrad + 4 * self.all_to_all


def overlapped_pair_s(p: MoeLayerPieces, delay_wgrad: bool) -> float:
    """Seconds of the combined step of one layer (forward of one micro-batch, backward of another) on the comp and
    comm streams, each piece starting when its stream is free and its input is ready (`TransformerLayerSchedulePlan
    .run`'s order)."""
    a2a = p.all_to_all
    combine_bwd = a2a  # comm, from 0
    pre_fwd = p.pre_dispatch_fwd  # comp, from 0
    dispatch_fwd = max(combine_bwd, pre_fwd) + a2a
    experts_dgrad = max(pre_fwd, combine_bwd) + p.experts_bwd_dgrad
    experts_wgrad = experts_dgrad + p.experts_bwd_wgrad
    # the backward dispatch needs the experts' input gradient; without delayed wgrad their whole backward
    dispatch_bwd = max(dispatch_fwd, experts_dgrad if delay_wgrad else experts_wgrad) + a2a
    experts_fwd = max(experts_wgrad, dispatch_fwd) + p.experts_fwd
    combine_fwd = max(dispatch_bwd, experts_fwd) + a2a
    pre_bwd = max(experts_fwd, dispatch_bwd) + p.pre_dispatch_bwd
    return max(combine_fwd, pre_bwd)


def steady_pairs(microbatch_chunks: int, warmup: int) -> int:
    """Forward-backward pairs one rank runs combined: its micro-batch chunks less the warm-up forwards (the same
    number of cool-down backwards then run alone)."""
    return max(0, microbatch_chunks - warmup)


def warmup_chunks(pp: int, vpp: int, stage: int) -> int:
    """Warm-up forwards of pipeline rank `stage` before its first combined step: 1 without a pipeline
    (combined_1f1b_schedule_for_no_pipelining pairs the second forward with the first backward); with the
    interleaved schedule the overlap needs, megatron-core's count (pp - stage - 1) x 2 + (vpp - 1) x pp plus the one
    extra forward it schedules for the overlap (schedules.get_pp_rank_microbatches)."""
    if pp == 1:
        return 1
    return (pp - stage - 1) * 2 + (vpp - 1) * pp + 1


def combined_share(parallel: ParallelConfig, stage: int, num_microbatches: int, chunks: int) -> float:
    """The share of rank `stage`'s micro-batch chunks that run in a combined forward-backward step."""
    total = num_microbatches * chunks
    return steady_pairs(total, warmup_chunks(parallel.pp, chunks, stage)) / total


def head_drain_s(head_gpu_s: float, host_between_s: float) -> float:
    """Seconds a host-paced last pipeline rank waits, per combined micro-batch, for the output layer's GPU work.

    The combined step issues the finished forward's output layer and loss (`forward_postprocess`) and the next
    backward's (`post_process.backward`) back to back, with no wait between, then the forward of the first MoE layer,
    whose dispatcher waits on the host for its token counts (`_maybe_dtoh_and_synchronize`): that wait drains the
    computation stream, output layer included (`TransformerModelChunkSchedulePlan.run`, megatron-core 0.16 and 0.19).
    Without the overlap the backward never waits, so the host issues the layers' backward while the GPU runs the
    output layer. The wait is the output layer's forward + backward GPU time less the host's own work between
    (`host_between_s`: the work outside the layers, the paired backward's MoE block and any dense layers before the
    first MoE layer).

    Seen on two H200s (benchmarks/results/moe_overlap_host_h200_x2/profile_r2): gpt-oss-20b at ep 2, each combined
    micro-batch's first dispatcher wait took 5.2-20.0 ms (9.7-13.9 on rank 0) while the GPU ran the 201k-vocabulary
    logits GEMMs (5.8 ms each); without the overlap no wait of the step but the optimizer's took over 5.1 ms."""
    return max(0.0, head_gpu_s - host_between_s)


def layer_pieces(
    model: ModelSpec, layer_index: int, ctx: LayerContext, fwd: dict[str, float], bwd: dict[str, float], scale: float
) -> MoeLayerPieces:
    """A MoE layer's pieces from its priced forward and backward (`fwd` / `bwd`: seconds by class, recompute in
    `bwd`; `scale`: the calibration factor they carry): the experts' and shared experts' GEMMs are the `mlp` node,
    the rest of the computation the pre-dispatch node, half of the `ep` time one all-to-all."""
    shapes = gemm_shapes(model, layer_index, ctx)
    experts = [op for op in shapes if op.startswith(("experts_", "shared_"))]

    def gemm(phase: str) -> float:
        return scale * sum(gemm_phase_time(op, shapes[op], phase, ctx) for op in experts)

    def compute(parts: dict[str, float]) -> float:
        return sum(v for k, v in parts.items() if k not in ("ep", "host"))

    e_f, e_d, e_w = gemm("fwd"), gemm("dgrad"), gemm("wgrad")
    return MoeLayerPieces(
        pre_dispatch_fwd=max(0.0, compute(fwd) - e_f),
        experts_fwd=e_f,
        pre_dispatch_bwd=max(0.0, compute(bwd) - e_d - e_w),
        experts_bwd_dgrad=e_d,
        experts_bwd_wgrad=e_w,
        all_to_all=fwd.get("ep", 0.0) / 2,
    )


def a2a_overlap_saving_s(
    model: ModelSpec,
    parallel: ParallelConfig,
    stage: int,
    num_microbatches: int,
    ctx: LayerContext,
    scale: float,
    kind_cost: dict,
    per_chunk_kinds: list,
    host_slack: dict | None = None,
) -> tuple[list[float], list[float]]:
    """(Seconds the overlap takes off one micro-batch of each model chunk of rank `stage`, on average over the step;
    of the all-to-all time it would hide, the seconds the host holds instead): the saving is
    per MoE layer the serial forward + backward less the combined step, on the share of micro-batch chunks that run
    combined, less the computation the hidden all-to-alls slow down
    (`collectives.hidden_collective_cost_s`). `kind_cost`: (forward, backward) parts per layer kind, as
    `estimate.stage_time` prices them.

    A layer whose eager MoE block paces either pass (its "host" part) gains nothing: the combined step issues the
    same work from the same thread, and on two H200s it ran slower than the serial schedule there
    (benchmarks/results/moe_ep_overlap_h200_x2_r3: gpt-oss-20b at ep 2, 16 local experts, 624 ms against 537 ms,
    the same 7294 kernels issued; `docs/accuracy.md`, "The EP all-to-all overlap on two GPUs"); what it loses there
    is priced apart (`head_drain_s`). For the same reason
    a layer whose block the GPU paces gains at most its block's GPU time over its host floor, forward and backward
    (`host_slack` by layer kind, for eager blocks that wait on the host): the host issues both passes of the
    combined step, so hiding more than that leaves it host-paced: the rest is the host's time."""
    v = len(per_chunk_kinds)
    share = combined_share(parallel, stage, num_microbatches, v)
    saved = [0.0] * v
    held_by_host = [0.0] * v
    for c, kinds in enumerate(per_chunk_kinds):
        for moe, full, count, layer in kinds:
            kind = (*model.layer_kind(layer), full)
            f, b = kind_cost[kind]
            if not moe or "host" in f or "host" in b or not f.get("ep"):
                continue
            pieces = layer_pieces(model, layer, ctx, f, b, scale)
            hidden = pieces.serial_s - overlapped_pair_s(pieces, parallel.delay_wgrad_compute)
            lost = hidden_collective_cost_s("all_to_all", parallel.ep, ctx.cluster, parallel.etp, hidden)
            gain = max(0.0, hidden - lost)
            if host_slack is not None and kind in host_slack:
                held_by_host[c] += count * share * max(0.0, gain - host_slack[kind])
                gain = min(gain, host_slack[kind])
            saved[c] += count * share * gain
    return saved, held_by_host
