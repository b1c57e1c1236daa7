"""Memory freed by the host but not yet by the GPU: what a GPU-bound step reserves beyond what it allocates.

The caching allocator reuses a freed block at once when only its own stream used it. A block another stream used
(`record_stream`: autograd's hand-over of each unfused weight gradient to DDP's accumulation hook, NCCL's p2p
buffers) waits for an event instead: `free_requested` then `free_completed` in the allocator's history, and in
between torch.cuda.memory_allocated no longer counts it while nothing can reuse it. In a GPU-bound eager step the
host runs `defaults.LAUNCH_QUEUE_OPS` operations ahead of the GPU, so every such block freed within that lead is
still waiting: the peak reserves it beside what is allocated.

Measured in the allocator histories of Qwen3-32B (16 layers, seq 4096, micro-batch 2) on 4x H200
(benchmarks/results/reserved_memory_h200_x4): tp1 dp4 13.4 GiB of bf16 weight gradients awaiting their event at the
peak (up to 17.4 GiB, one whole backward's), tp2 pp2 vpp8 10.6 GiB (12 layers' weight gradients, both micro-batches'
embedding gradients, 47 pipeline buffers); the free of a weight gradient waited 372 / 636 ms (median) for the GPU,
the host's lead in the profiled steps (362 / 608 ms).

Where the queue never fills the term is zero: a host-bound micro-batch (the host issues no faster than the GPU
runs), the later stages of a non-interleaved pipeline, forward-only passes (no weight gradients) and CUDA graphs (not
measured; graphed layers launch one replay each).

Dropless MoE layers under megatron-core's token dispatchers synchronise the host with the device in every forward
(the tokens per expert, `_maybe_dtoh_and_synchronize` in megatron/core/transformer/moe/token_dispatcher.py @
core_r0.19.0), so nothing of an earlier backward waits at a forward's end, but their backward has no synchronisation:
where the GPU runs the backward slower than the host issues it, the host gains (GPU - host) over one backward and the
weight gradients it frees in that lead wait (`moe_synced_forward`). Mixtral-8x7B, 2 layers at ep 1 on 2x H200
(benchmarks/results/moe_ep_r4_h200_x2/diag/memory): 3.58 GiB of TE GroupedLinear's packed expert weight gradients
(grouped_linear.py's wgrad buffer without gradient-accumulation fusion) awaited their event at the reserved peak, the
reserve 5 GiB over the allocation; gpt-oss-20b's host-paced backward reserved 0.5-1.9 GiB over it
(moe_ep_overlap_h200_x2*); the tp1 dp4 MoE layout of the Qwen3-32B lease 1.5 GiB.

A non-interleaved pipeline synchronises the device after every batched exchange (`batch_p2p_sync`,
torch.cuda.synchronize() in megatron/core/pipeline_parallel/p2p_communication.py; the runner and Megatron-LM batch
the exchanges of a non-interleaved schedule). The 1F1B steady state runs forward, send-forward-receive-backward,
backward, send-backward-receive-forward: a later stage synchronises before each forward, so its peak (a forward's
end) finds nothing waiting; the first stage receives no forward, so its backward and next forward run unsynchronised
and the host gains one micro-batch's lead (`sync_every_microbatch`). On 2x H200 (Qwen3-8B 16 layers, pp2, seq 4096,
micro-batch 2, expandable segments; benchmarks/results/moe_tp_host_h200_x2/diagnose) stage 0's history held 2.86 GiB
awaiting at the peak (1.70 GiB of weight gradients, the 1.16 GiB embedding gradient), stage 1's none.
"""

from __future__ import annotations

from dataclasses import dataclass

from . import defaults as d


@dataclass(frozen=True)
class QueuedFreeInputs:
    """One pipeline rank's view of a training micro-batch (all its model chunks), derived by the cost model.

    `fwd_gpu_s` / `bwd_gpu_s`: GPU time of the micro-batch's forward and backward (no host wait, no exposed p2p);
    `host_issue_s`: the host's issue time of the micro-batch; `launches`: GPU operations the rank launches per
    micro-batch, forward and backward (`rank_launches`);
    `wgrad_bytes`: the weight gradients one backward materialises outside main_grad (bf16 parameters x 2 bytes;
    0 with gradient-accumulation fusion); `p2p_tensor_bytes`: one activation tensor a pipeline chunk sends;
    `chunks`: model chunks (virtual stages) on the rank; `num_microbatches`: micro-batches per step;
    `sync_every_microbatch`: the device is synchronised once per micro-batch (a non-interleaved pipeline's first
    stage), so the host's lead restarts from zero at each and gains one micro-batch's worth at most."""

    fwd_gpu_s: float
    bwd_gpu_s: float
    host_issue_s: float
    launches: float
    wgrad_bytes: float
    p2p_tensor_bytes: float
    chunks: int
    num_microbatches: int
    interleaved: bool
    sync_every_microbatch: bool = False
    # dropless MoE layers: the host waits for the device in every forward, never in the backward, whose host issue
    # time is `bwd_host_s`
    moe_synced_forward: bool = False
    bwd_host_s: float = 0.0


def rank_launches(
    dense_layers: int,
    moe_layers: int,
    tp_gt1: bool,
    local_experts: int = 0,
    expert_bias: bool = False,
    gradient_accumulation_fusion: bool = True,
) -> float:
    """GPU operations a rank launches per micro-batch, forward and backward: `defaults.LAUNCHES_PER_LAYER` per dense
    layer; per MoE layer `defaults.MOE_LAUNCHES_PER_LAYER` plus, per local expert, its GEMMs
    (`MOE_LAUNCHES_PER_LOCAL_EXPERT`) and, without gradient-accumulation fusion, one add per expert parameter (a
    weight each for fc1 and fc2, and a bias each with `expert_bias`)."""
    dense = sum(d.LAUNCHES_PER_LAYER[tp_gt1])
    per_expert = sum(d.MOE_LAUNCHES_PER_LOCAL_EXPERT[expert_bias])
    if not gradient_accumulation_fusion:
        per_expert += 4 if expert_bias else 2
    moe = sum(d.MOE_LAUNCHES_PER_LAYER) + per_expert * local_experts
    return dense_layers * dense + moe_layers * moe


def host_lead_s(inputs: QueuedFreeInputs) -> float:
    """GPU seconds the host is ahead at the peak: what it gained on the GPU by then, (GPU - host) per micro-batch
    since the step's start, up to a full launch queue (`LAUNCH_QUEUE_OPS` at the micro-batch's GPU time per
    operation)."""
    gpu_s = inputs.fwd_gpu_s + inputs.bwd_gpu_s
    if gpu_s <= 0 or inputs.launches <= 0:
        return 0.0
    full_queue_s = d.LAUNCH_QUEUE_OPS / inputs.launches * gpu_s
    if inputs.moe_synced_forward:
        # the lead restarts at every forward's synchronisation and builds over one backward
        return min(full_queue_s, max(0.0, inputs.bwd_gpu_s - inputs.bwd_host_s))
    # the peak: the end of a forward after a backward (no pipeline: the last micro-batch's; interleaved: the steady
    # state, half-way through the step's micro-batches on average; synchronised every micro-batch: the one since)
    if inputs.sync_every_microbatch:
        issued_before = min(1, inputs.num_microbatches - 1)
    else:
        issued_before = inputs.num_microbatches / 2 if inputs.interleaved else inputs.num_microbatches - 1
    gained_s = max(0.0, gpu_s - inputs.host_issue_s) * issued_before
    return min(full_queue_s, gained_s)


def queued_free_bytes(inputs: QueuedFreeInputs) -> float:
    """Bytes freed on the host but still awaiting the GPU at the peak.

    No pipeline: the queue holds the current micro-batch's forward and, behind it, the previous backwards as far as
    the lead reaches: wgrad x sum over j of clamp((lead - forward - j x (forward + backward)) / backward, 0, 1). A
    short model's micro-batch is a fraction of the launch queue, so the lead can span more than one: Llama-3.1-8B at 4
    layers on 2x H200 (CP 2 at 32k tokens, 4 micro-batches; benchmarks/results/connections_h200_x2/memory) held two
    micro-batches' weight gradients awaiting at the peak (3.25 GiB of the layers', 2 x 0.98 of the output layer's and
    2 x 0.98 of the embedding's: 2 x 3.58), TP 2 at 8 micro-batches 2-3 micro-batches' (4.68 GiB).

    Interleaved 1F1B: the steady state alternates chunk forwards and backwards, so the queue holds lead / (GPU time
    per micro-batch) of a micro-batch's weight gradients and its 4 activation-sized p2p tensors per chunk
    (`P2P_TENSORS_PER_CHUNK_PASS`), however many micro-batches that spans."""
    lead_s = host_lead_s(inputs)
    if lead_s <= 0:
        return 0.0
    if inputs.moe_synced_forward:
        # the backward's weight gradients the host freed within its lead (its reserved peak, beside the allocated one)
        return inputs.wgrad_bytes * min(1.0, lead_s / inputs.bwd_gpu_s)
    if inputs.interleaved:
        per_microbatch = inputs.wgrad_bytes + d.P2P_TENSORS_PER_CHUNK_PASS * inputs.chunks * inputs.p2p_tensor_bytes
        return per_microbatch * min(inputs.num_microbatches, lead_s / (inputs.fwd_gpu_s + inputs.bwd_gpu_s))
    if inputs.bwd_gpu_s <= 0:
        return 0.0
    # behind the current forward, the backwards before it, newest first, each as far as the lead reaches into it
    # (the lead is at most the GPU time of the micro-batches issued before: it never reaches past the step's first)
    per_microbatch_s = inputs.fwd_gpu_s + inputs.bwd_gpu_s
    share = sum(
        min(1.0, max(0.0, (lead_s - inputs.fwd_gpu_s - j * per_microbatch_s) / inputs.bwd_gpu_s))
        for j in range(max(inputs.num_microbatches - 1, 0))
    )
    return inputs.wgrad_bytes * share
