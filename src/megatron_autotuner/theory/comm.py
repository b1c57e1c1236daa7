"""Bytes each collective moves per iteration, per rank.

For every collective we report the message size (the full tensor the collective is about, in
bytes), how many times one rank calls it per iteration, and the bytes one rank sends over the
wire with a ring algorithm (NCCL's bus-bandwidth factors, nccl-tests PERFORMANCE.md):
all-gather / reduce-scatter (n-1)/n x size, all-reduce 2(n-1)/n x size, all-to-all (n-1)/n x size,
send/recv 1 x size.

Where the collectives come from (megatron-core):
- TP with sequence parallelism: per layer, all-gather before qkv and fc1, reduce-scatter after proj
  and fc2 (forward); backward mirrors them and re-gathers the two norm outputs for wgrad. Without
  SP: one all-reduce after proj and fc2 forward, after qkv and fc1 dgrad backward.
- MoE layers (alltoall dispatcher): dispatch + combine all-to-all over ep forward and backward
  (the rank's own top-k rows x h, before the expert-TP gather); with etp > 1 an all-gather of the routed rows
  over etp after it and a reduce-scatter before the combine, both passes. The allgather dispatcher (Megatron-LM's
  default) gathers every token over etp x ep and reduce-scatters the combine in fp32.
- CP p2p ring: each layer passes K,V around the ring cp-1 times forward; backward passes K,V and
  dK,dV. a2a (Ulysses): all-to-all of Q,K,V in and of the output back, both passes.
- PP: one activation send and one gradient send per micro-batch per stage boundary (x vpp).
- DP: distributed optimizer reduce-scatters the main grads (fp32, or bf16 with --grad-reduce-in-bf16)
  and all-gathers bf16 params over dp*cp (experts over edp; TE linear weights in fp8 with fp8 parameters,
  `memory.param_gather_bytes`); without it, an all-reduce of the main
  grads. Tied embeddings with pp > 1: an all-reduce of the embedding gradient between first and last
  stage.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from ..specs.model import ModelSpec
from ..specs.parallel import ParallelConfig, Workload, num_microbatches
from .flops import full_recompute_layer_mask
from .memory import local_tokens, param_gather_bytes
from .params import ParameterCounts, stage_layer_range, stage_parameters
from .scan_mixers import SCAN_MIXERS

COLLECTIVES = ("all_gather", "reduce_scatter", "all_reduce", "all_to_all", "send_recv")


def wire_factor(collective: str, group_size: int) -> float:
    """Bytes sent per rank per byte of message with a ring algorithm."""
    n = group_size
    if n <= 1:
        return 0.0
    if collective in ("all_gather", "reduce_scatter", "all_to_all"):
        return (n - 1) / n
    if collective == "all_reduce":
        return 2 * (n - 1) / n
    if collective == "send_recv":
        return 1.0
    raise ValueError(f"unknown collective {collective!r}")


@dataclass(frozen=True)
class CommVolume:
    """One kind of collective of one parallel dimension, over one iteration, for one rank."""

    dimension: str  # tp, cp, ep, etp, pp, dp, edp, embedding
    collective: str
    group_size: int
    message_bytes: float  # size of one call's full tensor
    calls: int  # per iteration, per rank
    phase: str = "fwd+bwd"  # fwd, bwd, fwd+bwd, step (after the last micro-batch)

    @property
    def wire_bytes(self) -> float:
        return self.message_bytes * self.calls * wire_factor(self.collective, self.group_size)

    def to_dict(self) -> dict:
        return {**asdict(self), "wire_bytes": self.wire_bytes}


def allgather_dispatch_bytes(model: ModelSpec, rows: float, group: int) -> tuple[float, float, float, float]:
    """(hidden bf16, hidden fp32, router probabilities, routing map) bytes of the gathered tensors of megatron-core's
    allgather dispatcher in one MoE layer, each rank holding `rows` = T / tp tokens of the etp x ep `group`: the
    forward all-gathers the hidden states (bf16), the probabilities (fp32) and the routing map (bool) of all E experts
    and reduce-scatters the combine cast to fp32; backward the gathers' gradients (hidden bf16, probabilities fp32)
    are reduce-scattered and the combine's all-gathered in fp32 (MoEAllGatherTokenDispatcher.token_dispatch /
    token_combine, megatron/core/transformer/moe/token_dispatcher.py @ Megatron-LM d98e8a6)."""
    gathered, h, experts = group * rows, model.hidden_size, model.num_moe_experts
    return 2.0 * gathered * h, 4.0 * gathered * h, 4.0 * gathered * experts, gathered * experts


def stage_comm_volumes(
    model: ModelSpec,
    parallel: ParallelConfig,
    workload: Workload,
    stage: int,
    padded_vocab_size: int | None = None,
) -> list[CommVolume]:
    """Every collective one rank of pipeline stage `stage` issues in one iteration."""
    e = 2  # bf16 activations
    tp, cp, ep, etp, pp = parallel.tp, parallel.cp, parallel.ep, parallel.etp, parallel.pp
    m = num_microbatches(parallel, workload)
    tokens = local_tokens(workload, parallel)
    h = model.hidden_size
    training = workload.is_training
    layers = stage_layer_range(model, parallel, stage)
    full_mask = full_recompute_layer_mask(model, parallel, workload.recompute)
    recomputed = sum(1 for i in layers if full_mask[i]) if training else 0
    moe_layers = [i for i in layers if model.is_moe_layer(i)]
    out: list[CommVolume] = []
    hidden_msg = e * tokens * h  # the full (gathered) [s/cp, b, h] tensor

    if tp > 1:
        # Per residual block with TP linears (a layer's token mixer and dense MLP or shared experts: routed experts
        # move their tokens in the dispatcher, `ModelSpec.tp_collective_blocks`) forward: gather before its first
        # linear (qkv / in_proj, fc1), scatter/reduce after its last; full recompute repeats the forward ones.
        # Backward mirrors each forward collective and, with SP, re-gathers the norm output for the weight gradients.
        n = sum(model.tp_collective_blocks(i) for i in layers)
        n_rec = sum(model.tp_collective_blocks(i) for i in layers if full_mask[i]) if training else 0
        if parallel.sequence_parallel:
            ag = n + n_rec + (2 * n if training else 0)
            rs = n + n_rec + (n if training else 0)
            out.append(CommVolume("tp", "all_gather", tp, hidden_msg, m * ag))
            out.append(CommVolume("tp", "reduce_scatter", tp, hidden_msg, m * rs))
        else:
            ar = n + n_rec + (n if training else 0)
            out.append(CommVolume("tp", "all_reduce", tp, hidden_msg, m * ar))
        gathered = [i for i in layers if model.gathers_qkv_over_tp(i, tp)]
        if gathered:
            # fewer K / V heads than TP ranks: each attention layer all-gathers its qkv output (backward: a
            # reduce-scatter; megatron-core SelfAttention.get_query_key_value_tensors)
            qkv_all = e * tokens * model.qkv_projection_size
            calls = len(gathered) + sum(1 for i in gathered if full_mask[i]) * training
            out.append(CommVolume("tp", "all_gather", tp, qkv_all, m * calls, "fwd"))
            if training:
                out.append(CommVolume("tp", "reduce_scatter", tp, qkv_all, m * len(gathered), "bwd"))
        if stage == pp - 1:
            # output layer: gather final hidden (SP) forward, scatter its grad backward;
            # cross-entropy: 3 small fp32 all-reduces (max, sum-exp, target logit) per token.
            if parallel.sequence_parallel:
                out.append(CommVolume("tp", "all_gather", tp, hidden_msg, m, "fwd"))
                if training:
                    out.append(CommVolume("tp", "reduce_scatter", tp, hidden_msg, m, "bwd"))
            out.append(CommVolume("tp", "all_reduce", tp, 4.0 * tokens, 3 * m, "fwd"))
        if stage == 0:
            # vocab-parallel embedding: reduce-scatter (SP) or all-reduce of its output
            coll = "reduce_scatter" if parallel.sequence_parallel else "all_reduce"
            out.append(CommVolume("tp", coll, tp, hidden_msg, m, "fwd"))

    group = ep * etp
    if moe_layers and parallel.moe_dispatcher == "allgather" and group > 1:
        hidden, hidden_fp32, probs, routing_map = allgather_dispatch_bytes(model, tokens / tp, group)
        n_fwd = len(moe_layers) + (sum(1 for i in moe_layers if full_mask[i]) if training else 0)
        out.append(CommVolume("ep", "all_gather", group, hidden + probs + routing_map, m * n_fwd, "fwd"))
        out.append(CommVolume("ep", "reduce_scatter", group, hidden_fp32, m * n_fwd, "fwd"))
        if training:
            out.append(CommVolume("ep", "reduce_scatter", group, hidden + probs, m * len(moe_layers), "bwd"))
            out.append(CommVolume("ep", "all_gather", group, hidden_fp32, m * len(moe_layers), "bwd"))
    elif moe_layers and ep > 1:
        # the rank's own top-k rows: the expert-TP gather follows the all-to-all (`ModelSpec.dispatched_tokens`)
        dispatched = model.dispatched_tokens(tokens, tp, workload.expert_load(ep))
        per_layer = 2 * (2 if training else 1)  # dispatch + combine, forward (+ backward)
        calls = per_layer * len(moe_layers) + (2 * sum(1 for i in moe_layers if full_mask[i]) if training else 0)
        out.append(CommVolume("ep", "all_to_all", ep, e * dispatched * h, m * calls))
    if moe_layers and parallel.moe_dispatcher != "allgather" and etp > 1:
        # expert-TP: the dispatcher all-gathers the routed rows of the etp ranks after the all-to-all and
        # reduce-scatters the experts' output before the combine; backward, each turns into the other
        # (`costmodel.layer.expert_tp_comm_s`)
        gathered = e * model.routed_tokens(tokens, tp, etp, workload.expert_load(ep)) * h
        n_fwd = len(moe_layers) + (sum(1 for i in moe_layers if full_mask[i]) if training else 0)
        n_bwd = len(moe_layers) if training else 0
        out.append(CommVolume("etp", "all_gather", etp, gathered, m * (n_fwd + n_bwd)))
        out.append(CommVolume("etp", "reduce_scatter", etp, gathered, m * (n_fwd + n_bwd)))

    if cp > 1:
        out.extend(_scan_mixer_cp_volumes(model, layers, full_mask, training, e * tokens / tp, cp, m))
        layers = [i for i in layers if model.token_mixer(i) == "attention"]
        recomputed = sum(1 for i in layers if full_mask[i]) if training else 0
    if cp > 1 and layers:
        kv_local = e * tokens * 2 * model.query_groups_per_rank(tp) * model.kv_channels
        n_layers = len(layers) + recomputed
        if parallel.cp_comm_type == "a2a":
            qkv_local = e * tokens * model.qkv_projection_size / tp
            o_local = e * tokens * model.attention_output_size / tp
            per_pass = 2 if training else 1
            out.append(CommVolume("cp", "all_to_all", cp, qkv_local * cp, m * n_layers * per_pass))
            out.append(CommVolume("cp", "all_to_all", cp, o_local * cp, m * n_layers * per_pass))
        elif parallel.cp_comm_type == "allgather":
            out.append(CommVolume("cp", "all_gather", cp, kv_local * cp, m * n_layers))
            if training:
                out.append(CommVolume("cp", "reduce_scatter", cp, kv_local * cp, m * len(layers), "bwd"))
        else:
            # ring: cp-1 sends of the local K,V per layer forward; backward sends K,V and dK,dV.
            fwd = (cp - 1) * n_layers
            bwd = 2 * (cp - 1) * len(layers) if training else 0
            out.append(CommVolume("cp", "send_recv", cp, kv_local, m * (fwd + bwd)))

    if pp > 1:
        boundary_msg = e * tokens * h / (tp if parallel.sequence_parallel else 1)
        v = parallel.virtual_stages
        # each chunk sends its output forward (but the model's last chunk) and its input
        # gradient backward (but the model's first chunk)
        activation_sends = v - (1 if stage == pp - 1 else 0)
        gradient_sends = (v - (1 if stage == 0 else 0)) if training else 0
        out.append(CommVolume("pp", "send_recv", 2, boundary_msg, m * (activation_sends + gradient_sends)))

    if training:
        counts = stage_parameters(model, parallel, stage, padded_vocab_size)
        out.extend(dp_step_volumes(counts, parallel, workload))
        if model.tie_embeddings and pp > 1 and stage in (0, pp - 1):
            word_embedding = (padded_vocab_size or model.vocab_size) * h // tp
            out.append(CommVolume("embedding", "all_reduce", 2, parallel.main_grad_bytes * word_embedding, 1, "step"))
    return [c for c in out if c.calls > 0 and c.group_size > 1]


def _scan_mixer_cp_volumes(
    model: ModelSpec, layers: list[int], full_mask: list[bool], training: bool, row_bytes: float, cp: int, m: int
) -> list[CommVolume]:
    """The all-to-alls of gated-DeltaNet and Mamba-2 layers under CP, per pass: the in_proj output from sequence to
    head shards and the output projection's input back (Megatron-LM d98e8a6 ssm/gated_delta_net/common.py
    a2a_cp_to_hp / a2a_hp_to_cp; megatron-core ssm/mamba_context_parallel.py). `row_bytes`: bytes of one element
    per local token on one TP rank."""
    passes: dict[tuple[int, int], int] = {}
    for i in layers:
        if model.token_mixer(i) in SCAN_MIXERS:
            widths = model.token_mixer_widths(i)
            passes[widths] = passes.get(widths, 0) + (2 if training else 1) + (training and full_mask[i])
    return [CommVolume("cp", "all_to_all", cp, row_bytes * width * cp, m * n)
            for widths, n in passes.items() for width in widths]  # fmt: skip


def dp_step_volumes(counts: ParameterCounts, parallel: ParallelConfig, workload: Workload) -> list[CommVolume]:
    """The data-parallel collectives after the last micro-batch, one call each: with the distributed optimizer
    a reduce-scatter of the main grads and an all-gather of the parameters (`memory.param_gather_bytes`) over
    dp*cp for dense and edp for expert parameters; without it an all-reduce of the main grads."""
    g = float(parallel.main_grad_bytes)
    dense_gather, expert_gather = param_gather_bytes(counts, workload)
    groups = [("dp", parallel.dp * parallel.cp, counts.dense, dense_gather)]
    if counts.experts:
        groups.append(("edp", parallel.edp, counts.experts, expert_gather))
    out = []
    for dimension, size, params, gather in groups:
        if parallel.use_distributed_optimizer:
            out.append(CommVolume(dimension, "reduce_scatter", size, g * params, 1, "step"))
            out.append(CommVolume(dimension, "all_gather", size, gather, 1, "step"))
        else:
            out.append(CommVolume(dimension, "all_reduce", size, g * params, 1, "step"))
    return out


def chained_expert_param_gathers(
    model: ModelSpec, parallel: ParallelConfig, counts: ParameterCounts, bucket_params: int
) -> float:
    """Expert-parameter buckets per step whose all-gather a rank starts and at once waits for (expected count).

    megatron-core's DDP with overlap_param_gather (distributed_data_parallel.py `_make_forward_pre_hook` and
    param_and_grad_buffer.py `finish_param_sync` @ NVIDIA/Megatron-LM d98e8a6) gathers one bucket ahead: a module's
    forward pre-hook waits, for each of its parameters in turn, on that parameter's bucket and only then
    dispatches the next bucket's all-gather. Buckets never split a parameter, so a module of one weight meets a
    boundary only at its edge and its gather ran during the compute before it. TE's grouped experts
    (TEGroupedMLP: linear_fc1 and linear_fc2 each hold one weight per local expert) are one module of many
    weights: each bucket boundary inside it is a gather dispatched and waited with no compute between, so the
    whole bucket's all-gather is exposed. Per grouped module of n local weights of w parameters in buckets of B:
    min(n - 1, n*w / B) boundaries. None with interleaving, where Megatron-LM aligns the gathers
    (`align_param_gather`: every bucket of a chunk is dispatched at its start, no chain), with edp 1 (nothing to
    gather) or without the distributed optimizer (no parameter all-gather).
    """
    if not (counts.experts and parallel.use_distributed_optimizer and parallel.edp > 1 and parallel.vpp is None):
        return 0.0
    local = model.num_moe_experts // parallel.ep
    f, h = model.moe_ffn_hidden_size, model.hidden_size
    weights = ((2 if model.gated_linear_unit else 1) * f * h // parallel.etp, f * h // parallel.etp)
    grouped_layers = counts.experts / (local * sum(weights))  # MoE (and MTP MoE) layers on this rank
    per_layer = sum(min(local - 1.0, local * w / bucket_params) for w in weights)
    return grouped_layers * per_layer


def comm_bytes_by_dimension(volumes: list[CommVolume]) -> dict[str, float]:
    """Wire bytes per parallel dimension (tp, cp, ep, pp, dp, ...)."""
    totals: dict[str, float] = {}
    for v in volumes:
        totals[v.dimension] = totals.get(v.dimension, 0.0) + v.wire_bytes
    return totals
