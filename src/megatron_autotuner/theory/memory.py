"""Memory per rank for each pipeline stage: weights, gradients, optimizer state, activations.

Model state (Megatron-LM with bf16, per parameter; Megatron-LM docs, "Distributed Optimizer"):
- weights: bf16, 2 bytes; fp8 training keeps bf16 weights plus a cached fp8 copy and its
  transpose of every TE linear weight (Transformer Engine caches them across micro-batches; Hopper's
  fp8 GEMMs take both operands K-major, so dgrad needs the transpose): +2 bytes (+1 in forward-only
  passes, which run under no_grad: no transpose is made). With fp8 parameters
  (`Workload.fp8_param`, Megatron-LM's --fp8-param-gather) those weights are stored in fp8 (1 byte,
  in the DDP parameter buffer) plus the transpose (1 byte) and no bf16 copy exists: 2 bytes, as bf16.
  The word embedding and megatron-core's output layer (a plain `ColumnParallelLinear`) stay bf16;
- gradients: fp32 main-grad buffer, 4 bytes (Megatron-LM's `accumulate_allreduce_grads_in_fp32`,
  its default with bf16), full size on every rank; 2 bytes with `--grad-reduce-in-bf16`
  (`ParallelConfig.grad_reduce_in_fp32=False`);
- optimizer: Adam fp32 master weight + two moments = 12 bytes, divided over the data-parallel
  group with the distributed optimizer: dense params over dp*cp, expert params over edp.
  So 18 bytes/param without and 6 + 12/d with the distributed optimizer, as in the Megatron docs.
  With bf16 gradients the optimizer step also casts the local gradient shard to fp32
  (megatron-core `DistributedOptimizer._copy_model_grads_to_main_grads`: `grad.float()`), 4 bytes
  per parameter of the shard that live from the step until the next iteration's `zero_grad` frees
  them, so not during the forward / backward: 4 + 12/d held then, 4 + 16/d at the step (the docs'
  "4 + 16/d" for 16-bit gradients). The peak is whichever of the two is larger
  (`StageMemory.optimizer_step_bytes`).

Activations: Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large Transformer
Models", arXiv 2205.05198), Sec. 4, generalised term by term to GQA, SwiGLU, MoE, MLA, CP, and
flash attention. Per layer and micro-batch of T local tokens (T = b*s/cp) with bf16 (2 bytes):

    attention: norm input 2Th/x + qkv input 2Th/x + Q 2T(a*d_q)/t + K,V 2T(kv)/t
               + proj input 2T(a*d_v)/t + dropout mask Th/x (if hidden dropout)
               + unfused attention: softmax 2*b*a*s^2/t (+ mask b*a*s^2/t + dropout out 2*b*a*s^2/t
                 with attention dropout);  flash attention: fp32 log-sum-exp 4*b*a*s/t
               + qk-layernorm inputs 2T(a+g)d/t
    MLP:       norm input 2Th/x + fc1 input 2Th/x + fc1 out 2T(2f|f)/t + fc2 input 2Tf/t + mask Th/x

where t = tp and x = tp with sequence parallelism, else 1. For GPT (4h MLP, dropout, unfused
attention) this is exactly Table 2: sbh(34 + 5as/h) with no parallelism, sbh(10 + 24/t + 5as/(ht))
with TP, and so on. MoE layers: router input and fp32 router probabilities, and per rank
`T*k*etp/tp` routed token copies (balanced routing, dropless) through the experts
(input 2h, fc1 out, fc2 input, and the fp32 probability the weighted activation saves).

Variable lengths (`Workload.lengths`): T is the largest packed micro-batch of any data-parallel rank, its
sequences padded to `specs.parallel.thd_alignment` (what verl feeds megatron-core), divided by cp; every
in-flight micro-batch is counted at that size (the peak holds the largest). Unfused attention cannot run packed
sequences (megatron-core `DotProductAttention.forward` asserts `packed_seq_params is None`).

In-flight micro-batches (1F1B, Narayanan et al. 2021): pipeline rank r keeps min(pp - r, m)
micro-batches of its layers; interleaved with v chunks: min(m*v, 2(pp - r - 1) + (v - 1)pp + 1)
chunk-micro-batches of L/(pp*v) layers each (megatron-core's warm-up count + 1).

CUDA graphs (`Workload.cuda_graph`, `cuda_graph_bytes`), derived from the sources megatron-core 0.19 runs
(NVIDIA/Megatron-LM core_r0.19.0: megatron/core/transformer/cuda_graphs.py, megatron/core/full_cuda_graph.py,
megatron/training/training.py; Transformer Engine @ d0067d0: transformer_engine/pytorch/graph.py):
- every capture allocates from a private graph memory pool that it keeps for good: TE's make_graphed_callables
  captures all graphs of a rank into one pool (`mempool = graph_pool_handle()`), in the schedule's own order
  (`_order`), so the pool holds what the eager schedule would hold of the graphed parts (their saved activations
  for the micro-batches in flight) and the parts' tensors are not counted again. What changes is when the memory
  is free: replays reuse the pool, but eager allocations (the optimizer step) cannot, so the graphed activations
  stay held beside the optimizer step (`StageMemory.graph_pool_bytes`). The full-iteration graph
  (`FullCudaGraphWrapper`, `torch.cuda.graph(pool=...)` around the whole forward-backward) holds all of them;
- transformer_engine per-layer graphs add static inputs outside the pool: `TECudaGraphHelper._get_sample_arguments`
  makes, per graphed layer and micro-batch, `get_layer_static_inputs`' hidden state (2*T*h/x, bf16) and, where the
  attention is captured, a causal boolean mask of b*(s/cp)*s bytes (TransformerLayer.get_layer_static_inputs),
  reusing a set only after its micro-batch's backward: one set per graphed layer per in-flight micro-batch.
  The replayed layer copies its input into that buffer while the previous layer's output stays in the pool:
  the hidden state is an extra copy. Once per rank: the static grad-output buffer (shared by output signature,
  `_reuse_graph_input_output_buffers`, which megatron-core sets from TE 2.7). Only one micro-batch is captured
  without pipelining (`_get_cuda_graph_input_data`). The capture runs with autograd in training mode, and
  megatron-core replays the graphs only in training mode (`GraphableMegatronModule._should_call_te_cudagraph`):
  a forward-only pass of a model left in training mode (as the validate runner and verl's log-prob passes run
  it) replays the captured forward, whose saved activations stay in the pool;
- local per-layer graphs (`CudaGraphManager`) put their input buffers in the pool and alias each graph's input to
  the previous graph's output (`_CudaGraphRunner.create_fwd_graph`, `cg_buffer_metadata`): no static copies.
  The full-iteration graph's static batches (`StaticBufferLoader`, ~28 bytes per token per micro-batch) are
  under 0.1% here and not counted.
Activation offloading (`Workload.activation_offload`, `offload_groups`): the tensors a layer saves that leave the
GPU, by megatron-core's rules (sources cited at `offload_groups` and `_offloaded_per_chunk`); what stays is counted
in the activations, what left in `StageMemory.offloaded_bytes` (pinned host memory). The copies are taken to keep
up with the forward (the cost model reports where they do not).

Outside the closed form, kept as a separate, named allowance that a calibration file can replace
(`MemoryAllowance`): memory outside the caching allocator (CUDA context, kernel code, library
workspaces, NCCL buffers: measured, by the communicators a layout uses) and allocator fragmentation
(a measured fraction of the activations).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from functools import lru_cache

from ..errors import ConfigError
from ..specs.model import ModelSpec
from ..specs.parallel import (
    OFFLOAD_MODULES,
    CudaGraphConfig,
    ParallelConfig,
    Workload,
    num_microbatches,
    packed_batch,
    pipeline_layout_of,
)
from .allocator import packed_logits_fragment_bytes
from .flops import chunk_layer_kinds
from .params import ParameterCounts, stage_layer_range, stage_parameters
from .scan_mixers import SCAN_MIXERS
from .vision import images_per_microbatch, patches_per_image

GIB = 2**30
BF16_BYTES = 2
FP32_BYTES = 4
FP8_BYTES = 1


# Memory outside PyTorch's caching allocator (device used - reserved), torch 2.11, CUDA 13.0, NCCL 2.28:
# - a base: CUDA context, the code of the kernels used, library workspaces and the default NCCL
#   communicator; one-GPU megatron-core training runs: 2.44 GiB on H100 and 2.43 on H200
#   (benchmarks/results/validation_h100_x1, validation_h200_x2/edge_fit), forward-only 1.61 on one H100
#   and 1.88 with two H200s (validation_h200_x2/x2, DP2: a forward pass talks over no other group);
# - plus each NCCL communicator a rank uses, measured one at a time on 2x H200 with NVLS off
#   (benchmarks/validation/nccl_memory.py -> validation_h200_x2/nccl_memory_h200_x2.json): a ring
#   collective (all-reduce, reduce-scatter / all-gather) 0.475 GiB, send / recv 0.627, all-to-all 0.568.
#   On 4x H200 (benchmarks/results/nccl_h200_x4/nccl_memory_x4.json) the ring collectives and send / recv took the
#   same (0.473, 0.629) but an all-to-all of 4 ranks 1.316: its buffers are per peer (NCCL runs it as send / recv
#   to every other rank), 0.194 GiB + 0.374 per peer from the 1-peer and 3-peer points (`all_to_all_gib`).
NON_TORCH_BASE_GIB = {"train": 2.44, "forward": 1.61, "forward_multi_gpu": 1.88}
NCCL_COMMUNICATOR_GIB = {"collective": 0.475, "p2p": 0.627}
NCCL_ALL_TO_ALL_GIB = (0.194, 0.374)  # (fixed, per peer)
# Measured up to 3 peers: how it grows past one NVLink host's 4 ranks (8-GPU nodes, NVL72, peers over the network)
# is not, so larger groups are charged 3 peers' worth, as before they were charged 1 (published runs at EP 8-64 fit).
NCCL_ALL_TO_ALL_MEASURED_PEERS = 3


def all_to_all_gib(group_size: int) -> float:
    """Memory outside the allocator of one all-to-all communicator of `group_size` ranks (`NCCL_ALL_TO_ALL_GIB`, its
    peers counted up to `NCCL_ALL_TO_ALL_MEASURED_PEERS`)."""
    fixed, per_peer = NCCL_ALL_TO_ALL_GIB
    return fixed + per_peer * min(group_size - 1, NCCL_ALL_TO_ALL_MEASURED_PEERS)


def nccl_communicators(parallel: ParallelConfig, training: bool) -> dict[str, int]:
    """Communicators of one rank by kind, beyond the default one: TP (collective), DP x CP gradients
    (training), PP and ring CP (send / recv), EP (all-to-all, plus the dispatcher's TP x EP all-gather
    and, in training, the router's token-count all-reduce: 2x H200 EP2 runs used 4.38 GiB training,
    2.98 forward-only, which these account for within 0.1)."""
    n = {"collective": 0, "p2p": 0, "all_to_all": 0}
    n["collective"] += parallel.tp > 1
    n["collective"] += training and parallel.dp * parallel.cp > 1
    n["p2p"] += parallel.pp > 1
    n["p2p"] += parallel.cp > 1
    if parallel.ep > 1:
        n["all_to_all"] += 1
        n["collective"] += 2 if training else 1
    return n


@lru_cache(maxsize=4096)
def default_non_torch_gib(parallel: ParallelConfig, training: bool) -> float:
    """Base + NCCL_COMMUNICATOR_GIB over `nccl_communicators`, the all-to-all by its peers (the constants above)."""
    if training:
        base = NON_TORCH_BASE_GIB["train"]
    else:
        base = NON_TORCH_BASE_GIB["forward_multi_gpu" if parallel.num_gpus > 1 else "forward"]
    comms = nccl_communicators(parallel, training)
    a2a = comms.pop("all_to_all") * all_to_all_gib(parallel.ep)
    return base + a2a + sum(NCCL_COMMUNICATOR_GIB[k] * v for k, v in comms.items())


# Reserved-but-unallocated memory with expandable segments, as a fraction of the activations: the median over
# the 23 layouts (46 ranks) of benchmarks/results/validation_h200_x2/expandable (2x H200, torch 2.11; Qwen3-8B and
# Qwen3-30B-A3B shapes over DP / TP+SP / PP / VPP / CP / EP, recompute, forward-only): 0.034 (0.002-0.45; the
# same layouts with the default allocator: 0.21, 0.01-0.54, up to 18 GiB).
EXPANDABLE_SEGMENTS_FRAGMENTATION_FRACTION = 0.034
# The allocator setting the tool plans with, writes into launch_env.sh and runs (`mat validate`) unless told otherwise
# (a Megatron-LM launch read with --megatron-args says its own): expandable segments. Under the default allocator a MoE
# step's reserve depends on the order and sizes of thousands of requests (docs/accuracy.md, "MoE reserved memory"):
# peaks came out 2-23% over the prediction on 2 and 4 H200, where with expandable segments 18 of 18 held-out layouts
# of the ranking benchmark's round 4 and the 128-expert control came within 5% (benchmarks/results/
# plan_regret_h200_x4_r4, expandable_segments_h200_x4). Megatron-Bridge's performance guide recommends it against
# "segmentation penalties" (docs/performance-guide.md, memory section).
EXPANDABLE_SEGMENTS_BY_DEFAULT = True


@dataclass(frozen=True)
class MemoryAllowance:
    """What the closed-form model does not compute, kept apart so it can be calibrated.

    `non_torch_gib`: CUDA context, NCCL communicator buffers and library workspaces, outside the
    PyTorch caching allocator (invisible to torch.cuda.max_memory_allocated); None: by layout,
    `default_non_torch_gib` (2.4-4.4 GiB in the H100 / H200 runs).
    `fragmentation_fraction`: reserved-but-unallocated memory of the caching allocator, as a
    fraction of the activation (transient) memory: weights, gradients and optimizer state are
    allocated once and leave no holes; the per-micro-batch tensors do. The default is the median of 16
    fresh megatron-core training runs on H200 (torch 2.11, CUDA 13.0, NCCL 2.28;
    benchmarks/results/validation_h200_x2): 0.18 x activations reserved unallocated (0.01-0.47;
    as a fraction of everything allocated it spread 0.3-12%). With expandable segments
    (PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True) a segment grows in place and far less is left
    unused: `EXPANDABLE_SEGMENTS_FRAGMENTATION_FRACTION` (`for_allocator`). Measured runs (testbench /
    validate) replace both through a calibration file.
    `device_bytes`: what a rank may reserve in all (the plan's usable memory); with it, the cached logits segments
    of packed forward-only micro-batches stop where PyTorch would release them (`stage_memory`). None: unbounded.
    """

    non_torch_gib: float | None = None
    fragmentation_fraction: float = 0.18
    # PyTorch's expandable segments: adds `forward_moe_fragment_bytes` (the default allocator's larger
    # fraction already covers that hole)
    expandable_segments: bool = False
    device_bytes: float | None = None

    def __post_init__(self) -> None:
        bad_non_torch = self.non_torch_gib is not None and self.non_torch_gib < 0
        if bad_non_torch or not 0 <= self.fragmentation_fraction < 1:
            raise ConfigError("memory_allowance", "non_torch_gib must be >= 0 and fragmentation_fraction in [0, 1)")

    @classmethod
    def for_allocator(cls, expandable_segments: bool) -> MemoryAllowance:
        """The default allowance for PyTorch's caching allocator, with or without expandable segments."""
        if expandable_segments:
            return cls(fragmentation_fraction=EXPANDABLE_SEGMENTS_FRAGMENTATION_FRACTION, expandable_segments=True)
        return cls()

    def non_torch_for(self, parallel: ParallelConfig, training: bool) -> float:
        if self.non_torch_gib is not None:
            return self.non_torch_gib
        return default_non_torch_gib(parallel, training)

    def bytes_for(
        self,
        activation_bytes: float,
        parallel: ParallelConfig,
        training: bool,
        activation_detail: dict[str, float] | None = None,
    ) -> float:
        """Memory outside the allocator + reserved-but-unallocated memory: a fraction of the activations, and
        with expandable segments the pieces a forward-only MoE pass leaves (`forward_moe_fragment_bytes`) and the
        logits hole of an interleaved last stage (`interleaved_logits_fragment_bytes`), without them the logits
        segments of variable-size packed forward-only micro-batches (`packed_logits_fragment`), from the stage's
        `activation_detail` when given."""
        fragments = 0.0
        detail = activation_detail or {}
        fragmentation = self.fragmentation_fraction * activation_bytes
        layer_ws, logits_ws = detail.get("layer_working_set", 0.0), detail.get("logits_working_set", 0.0)
        dense = "moe_layer_working_set" not in detail
        if not training and not self.expandable_segments and dense and logits_ws >= layer_ws > 0:
            # a dense forward-only pass peaks at its logits, in segments of their own: what stays reserved beside
            # them is the layers' working set, freed to the cache and too small for the logits, not a fraction of
            # the logits (a CUDA-graph pool is counted whole in the activations already). 1x H100, Qwen3-0.6B /
            # 1.7B / 4B at micro-batch 1-4 (benchmarks/results/validation_h100_x1/host_probe*, small_forward):
            # eager 0.17-1.50 GiB reserved unallocated, where 0.18x the logits said 0.63-2.50 GiB (peaks +1.5..+10%
            # over, now -4.0..-2.3%); TE-graphed peaks +9..+15% over, now -3.2..+1.3%.
            fragmentation = layer_ws
        if self.expandable_segments:
            fragments = forward_moe_fragment_bytes(detail) + interleaved_logits_fragment_bytes(detail, parallel)
        else:
            # variable-size packed micro-batches: logits segments the next, larger micro-batch cannot reuse
            # (`packed_logits_fragment`); an expandable segment grows in place instead
            fragments = detail.get("packed_logits_fragment", 0.0)
        return self.non_torch_for(parallel, training) * GIB + fragmentation + fragments


@dataclass(frozen=True)
class ActivationOptions:
    """Implementation choices that change activation memory."""

    flash_attention: bool = True  # TE / cuDNN fused attention (no s^2 term); False = unfused softmax
    bytes_per_element: int = BF16_BYTES
    # Megatron-LM's default (--bias-swiglu-fusion / --bias-gelu-fusion -> bias_activation_fusion): the fused
    # GLU keeps only its input. Unfused, megatron-core's MLP computes act(x_glu) * (x_linear + glu_linear_offset)
    # and autograd keeps two more f-sized tensors (measured on H200, megatron-core 0.19.2: exactly 2f*2 bytes
    # per token per layer; benchmarks/results/testbench_h200_x2). Applies to dense MLPs and shared experts;
    # TE grouped experts (TEGroupedMLP) kept no extra tensors in the same unfused run.
    fused_bias_activation: bool = True
    # the loss kernel (`CostOptions.loss_kernel`): "unfused" (vocab_parallel_cross_entropy), "native" (megatron-core's
    # torch-compiled fused kernels) or "te" (Transformer Engine's)
    loss_kernel: str = "unfused"


def _sp_divisor(parallel: ParallelConfig) -> int:
    return parallel.tp if parallel.sequence_parallel else 1


def local_tokens(workload: Workload, parallel: ParallelConfig) -> int:
    """Tokens of one micro-batch on one CP rank: b*s/cp (or max_token_len/cp; with variable lengths the largest
    padded packed micro-batch / cp)."""
    packed = packed_batch(parallel, workload)
    if packed is not None:
        return packed.largest_micro_batch_tokens // parallel.cp
    return workload.tokens_per_micro_batch // parallel.cp


def attention_activation_bytes(
    model: ModelSpec,
    parallel: ParallelConfig,
    workload: Workload,
    options: ActivationOptions = ActivationOptions(),
) -> dict[str, float]:
    """Bytes the self-attention block of one layer keeps for backward, per micro-batch, per rank."""
    e = options.bytes_per_element
    t, x = parallel.tp, _sp_divisor(parallel)
    tokens = local_tokens(workload, parallel)
    h, a = model.hidden_size, model.num_attention_heads
    rc = workload.recompute
    parts: dict[str, float] = {"attn_norm_input": e * tokens * h / x}
    if not rc.recomputes("layernorm"):
        parts["qkv_input"] = e * tokens * h / x
    if model.multi_latent_attention:
        q_head = model.qk_head_dim + model.qk_pos_emb_head_dim
        if model.q_lora_rank is not None:
            parts["q_latent"] = 2 * e * tokens * model.q_lora_rank / x  # q norm input + q_up input
        parts["kv_latent"] = 2 * e * tokens * model.kv_lora_rank / x  # kv norm input + kv_up input
        if not rc.recomputes("mla_up_proj"):
            parts["q"] = e * tokens * a * q_head / t
            parts["k_v"] = e * tokens * a * (q_head + model.v_head_dim) / t
    else:
        parts["q"] = e * tokens * a * model.kv_channels / t
        g_rank = model.query_groups_per_rank(t)
        parts["k_v"] = e * tokens * 2 * g_rank * model.kv_channels
        if model.qk_layernorm:
            parts["qk_norm_inputs"] = e * tokens * (a / t + g_rank) * model.kv_channels
    heads_local = a / t
    if options.flash_attention:
        if not rc.recomputes("core_attn"):
            parts["softmax_lse"] = FP32_BYTES * heads_local * tokens
    else:
        if parallel.cp > 1:
            raise ConfigError("flash_attention", "context parallelism needs fused (flash) attention in megatron-core")
        if workload.lengths is not None:
            raise ConfigError("flash_attention", "packed variable-length sequences need fused (flash) attention")
        if not rc.recomputes("core_attn"):
            scores = heads_local * tokens * workload.seq_length  # b*a/t*s*s
            parts["softmax_output"] = e * scores
            if model.attention_dropout > 0:
                parts["attention_dropout_mask"] = 1 * scores
                parts["attention_dropout_output"] = e * scores
    parts["proj_input"] = e * tokens * model.attention_output_size / t
    if model.hidden_dropout > 0:
        parts["attn_dropout_mask"] = 1 * tokens * h / x
    return parts


def scan_mixer_activation_bytes(
    model: ModelSpec,
    parallel: ParallelConfig,
    workload: Workload,
    elements_per_token: dict[str, float],
    options: ActivationOptions = ActivationOptions(),
) -> dict[str, float]:
    """Bytes a scan mixer (gated DeltaNet, Mamba-2) keeps for backward, per micro-batch, per rank: its fused input
    norm's input and output as attention's (`attention_activation_bytes`), then its own tensors (elements per token,
    split over TP by heads)."""
    e = options.bytes_per_element
    t, x = parallel.tp, _sp_divisor(parallel)
    tokens = local_tokens(workload, parallel)
    h = model.hidden_size
    parts: dict[str, float] = {"attn_norm_input": e * tokens * h / x}
    if not workload.recompute.recomputes("layernorm"):
        parts["qkv_input"] = e * tokens * h / x
    for name, elements in elements_per_token.items():
        parts[name] = e * tokens * elements / t
    if model.hidden_dropout > 0:
        parts["attn_dropout_mask"] = 1 * tokens * h / x
    return parts


def token_mixer_activation_bytes(
    model: ModelSpec,
    parallel: ParallelConfig,
    workload: Workload,
    layer_index: int,
    options: ActivationOptions = ActivationOptions(),
) -> dict[str, float]:
    """The token mixer of layer `layer_index`: gated DeltaNet's, Mamba-2's or self-attention's saved bytes (none in a
    hybrid model's MLP / MoE layer)."""
    mixer = model.token_mixer(layer_index)
    if mixer in SCAN_MIXERS:
        elements = SCAN_MIXERS[mixer].activation_elements_per_token(model)
        return scan_mixer_activation_bytes(model, parallel, workload, elements, options)
    if mixer == "attention":
        return attention_activation_bytes(model, parallel, workload, options)
    return {}


def mlp_activation_bytes(
    model: ModelSpec,
    parallel: ParallelConfig,
    workload: Workload,
    layer_index: int,
    options: ActivationOptions = ActivationOptions(),
) -> dict[str, float]:
    """Bytes the MLP (dense or MoE) block of one layer keeps for backward, per micro-batch, per rank (none in a
    hybrid model's Mamba / attention layer)."""
    if not model.has_mlp(layer_index):
        return {}
    e = options.bytes_per_element
    t, x = parallel.tp, _sp_divisor(parallel)
    tokens = local_tokens(workload, parallel)
    h = model.hidden_size
    rc = workload.recompute
    gate = 2 if model.gated_linear_unit else 1
    parts: dict[str, float] = {"mlp_norm_input": e * tokens * h / x}
    if not model.is_moe_layer(layer_index):
        parts["fc1_input"] = e * tokens * h / x
        if not rc.recomputes("mlp"):
            f = model.ffn_hidden_size
            parts["fc1_output"] = e * tokens * gate * f / t
            parts["fc2_input"] = e * tokens * f / t
            if gate == 2 and not options.fused_bias_activation:
                parts["glu_unfused_temporaries"] = e * tokens * 2 * f / t
    else:
        parts["moe_input"] = e * tokens * h / x
        if not rc.recomputes("moe"):
            router_tokens = tokens / x
            parts["router_probs"] = FP32_BYTES * router_tokens * model.num_moe_experts
            routed = model.routed_tokens(tokens, t, parallel.etp, workload.expert_load(parallel.ep))
            f = model.moe_ffn_hidden_size
            parts["experts_input"] = e * routed * h
            parts["experts_fc1_output"] = e * routed * gate * f / parallel.etp
            if not rc.recomputes("moe_act"):
                # with moe_act recomputed the activation runs under CheckpointWithoutOutput, which keeps only its
                # input (fc1's output) and recomputes the rest in the backward (megatron-core experts.py,
                # TEGroupedMLP.forward)
                parts["experts_fc2_input"] = e * routed * f / parallel.etp
                if model.activation_clamp_value is not None and gate == 2:
                    # a clamped GLU (gpt-oss) feeds its fused kernel a clamped copy of the fc1 output (torch.cat of
                    # the clamped halves), which that kernel saves, while the clamps keep the fc1 output for their own
                    # backward (megatron-core fused_bias_geglu.py weighted_bias_quick_geglu_impl): one more 2f a row
                    parts["experts_fc1_clamped"] = e * routed * gate * f / parallel.etp
            # The probabilities scale the activation output inside the experts (megatron-core's
            # `activation_func_with_probs`; the alltoall dispatcher unpermutes without probs), so what is
            # saved for their gradient is one fp32 prob per routed copy, not the expert output (2h).
            # Measured: 4-layer Qwen3-30B-A3B at 32k tokens per micro-batch allocated 3.6 GiB (~29 KB per
            # token and MoE layer, ~8 x 2h) less than counting the expert output predicted
            # (benchmarks/results/validation_h200_x2/expandable/moe).
            parts["experts_probs"] = FP32_BYTES * routed
            fs = model.moe_shared_expert_intermediate_size
            if fs and not rc.recomputes("shared_experts"):
                parts["shared_fc1_output"] = e * tokens * gate * fs / t
                parts["shared_fc2_input"] = e * tokens * fs / t
                if gate == 2 and not options.fused_bias_activation:
                    parts["shared_glu_unfused_temporaries"] = e * tokens * 2 * fs / t
    if model.hidden_dropout > 0:
        parts["mlp_dropout_mask"] = 1 * tokens * h / x
    if rc.recomputes("layernorm"):
        parts.pop("fc1_input", None)
        parts.pop("moe_input", None)
    return parts


def layer_activation_bytes(
    model: ModelSpec,
    parallel: ParallelConfig,
    workload: Workload,
    layer_index: int = 0,
    options: ActivationOptions = ActivationOptions(),
) -> float:
    """Bytes one decoder layer keeps for backward, per micro-batch, per rank, without full recompute."""
    return sum(token_mixer_activation_bytes(model, parallel, workload, layer_index, options).values()) + sum(
        mlp_activation_bytes(model, parallel, workload, layer_index, options).values()
    )


def layer_is_graphed(graphs: CudaGraphConfig, model: ModelSpec, layer_index: int) -> bool:
    """Whether a per-layer CUDA graph wraps decoder layer `layer_index` (megatron-core `_layer_is_graphable`,
    megatron/core/transformer/cuda_graphs.py @ core_r0.19.0): every layer with an empty scope; with modules, a
    layer whose attention, dense MLP or MoE block (moe / moe_router / moe_preprocess) is named."""
    if not graphs.per_layer:
        return False
    moe = model.is_moe_layer(layer_index)
    return any(graphs.captures(part, moe) for part in ("attn", "mlp", "moe", "moe_router"))


def graphed_activation_bytes(
    model: ModelSpec,
    parallel: ParallelConfig,
    workload: Workload,
    layer_index: int,
    options: ActivationOptions = ActivationOptions(),
) -> float:
    """Bytes of one layer's saved activations (per micro-batch) that a CUDA graph captures, so that they live in
    its pool: the attention block's when attn is captured, the MLP / MoE block's when the block is, and with
    moe_router alone the router's (pre-MLP norm input, fp32 probabilities) and the shared experts'
    (`TransformerLayer._get_submodules_under_cudagraphs`). As training keeps them (no recompute in forward mode)."""
    graphs = workload.cuda_graph
    if not graphs.enabled:
        return 0.0
    moe = model.is_moe_layer(layer_index)
    train = workload if workload.is_training else workload.replace(mode="train")
    total = 0.0
    if graphs.captures("attn", moe):
        total += sum(token_mixer_activation_bytes(model, parallel, train, layer_index, options).values())
    mlp = mlp_activation_bytes(model, parallel, train, layer_index, options)
    if graphs.captures("moe" if moe else "mlp", moe):
        total += sum(mlp.values())
    elif moe and graphs.captures("moe_router", moe):
        total += sum(v for k, v in mlp.items() if k in ("mlp_norm_input", "router_probs") or k.startswith("shared_"))
    return total


def te_static_input_bytes(model: ModelSpec, parallel: ParallelConfig, workload: Workload, layer_index: int) -> float:
    """Static inputs of one transformer_engine-graphed layer for one in-flight micro-batch, outside the graph
    pool (module docstring): the hidden state 2*T*h/x (bf16) and, where attention is captured, the boolean
    causal mask b*(s/cp)*s = T*s bytes. 0 for other implementations and for layers without a graph."""
    graphs = workload.cuda_graph
    if graphs.impl != "transformer_engine" or not layer_is_graphed(graphs, model, layer_index):
        return 0.0
    tokens = local_tokens(workload, parallel)
    hidden = BF16_BYTES * tokens * model.hidden_size / _sp_divisor(parallel)
    mask = tokens * workload.seq_length if graphs.captures("attn", model.is_moe_layer(layer_index)) else 0.0
    return hidden + mask


def cuda_graph_chunk_bytes(
    model: ModelSpec,
    parallel: ParallelConfig,
    workload: Workload,
    stage: int,
    options: ActivationOptions = ActivationOptions(),
) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Per model chunk of rank `stage`, for one micro-batch: (graphed saved activations, transformer_engine static
    inputs) summed over the chunk's layers (`graphed_activation_bytes`, `te_static_input_bytes`)."""
    layout = pipeline_layout_of(model, parallel)
    if not workload.cuda_graph.enabled:  # nothing is captured: both are zero for every layer
        return (0.0,) * layout.vpp, (0.0,) * layout.vpp
    pools, statics = [], []
    for c in range(layout.vpp):
        layers = list(layout.chunk_layers(stage, c))
        pools.append(sum(graphed_activation_bytes(model, parallel, workload, i, options) for i in layers))
        statics.append(sum(te_static_input_bytes(model, parallel, workload, i) for i in layers))
    return tuple(pools), tuple(statics)


def layer_input_bytes(model: ModelSpec, parallel: ParallelConfig, workload: Workload, bytes_per_element: int = 2):
    """The hidden state entering a layer: what full recompute keeps (2*T*h/x)."""
    return bytes_per_element * local_tokens(workload, parallel) * model.hidden_size / _sp_divisor(parallel)


# ---------------------------------------------------------------------------------------------------------------
# Activation offloading
# ---------------------------------------------------------------------------------------------------------------
# Transformer Engine's layer-level offload keeps tensors below 256Ki elements on the GPU
# (transformer_engine/pytorch/cpu_offload.py `OffloadableLayerState._check_if_offload`: numel < 256 * 1024).
TE_LAYER_OFFLOAD_MIN_ELEMENTS = 256 * 1024

# The fine-grained group (megatron-core `offload_modules`) whose forward saves each activation part of
# `attention_activation_bytes` / `mlp_activation_bytes`, with the Transformer Engine layer spec
# (megatron/core/models/gpt/gpt_layer_specs.py `get_gpt_layer_with_transformer_engine_submodules`): the input norm is
# fused into the qkv (or MLA down-projection) `TELayerNormColumnParallelLinear`, so `input_layernorm` is an
# IdentityOp and its input is saved inside the qkv_linear group ("attn_norm" moves nothing); `pre_mlp_layernorm` is a
# TENorm only in MoE layers (dense layers fuse it into fc1, whose saved tensors no group covers). Offload points:
# attention.py (qkv_linear around `get_query_key_value_tensors`, core_attn around `core_attention`, attn_proj around
# `linear_proj`), transformer_layer.py (attn_norm, mlp_norm around the norms), moe/experts.py (expert_fc1 around
# `linear_fc1`, moe_act around the activation). Parts not listed (dropout masks, router, expert fc2 input and probs,
# shared experts, dense MLP) are saved outside every group and stay.
_OFFLOAD_GROUP_OF_PART = {
    "attn_norm_input": "qkv_linear",
    "qkv_input": "qkv_linear",
    "qk_norm_inputs": "qkv_linear",
    "q_latent": "qkv_linear",
    "kv_latent": "qkv_linear",
    "q": "core_attn",
    "k_v": "core_attn",
    "softmax_lse": "core_attn",
    "softmax_output": "core_attn",
    "attention_dropout_mask": "core_attn",
    "attention_dropout_output": "core_attn",
    "proj_input": "attn_proj",
    "mlp_norm_input": "mlp_norm",
    "experts_input": "expert_fc1",
    "experts_fc1_output": "moe_act",
}
# Parts that are several tensors of equal size (k and v; norm input and down-projection input of each MLA latent;
# the two unfused GLU temporaries).
_TENSORS_IN_PART = {
    "k_v": 2,
    "q_latent": 2,
    "kv_latent": 2,
    "glu_unfused_temporaries": 2,
    "shared_glu_unfused_temporaries": 2,
}
_FP32_PARTS = ("softmax_lse", "router_probs", "experts_probs")
_BYTE_PARTS = ("attn_dropout_mask", "mlp_dropout_mask", "attention_dropout_mask")


@dataclass(frozen=True)
class SavedTensor:
    """One tensor a decoder layer saves for backward, per micro-batch, per rank."""

    part: str  # the activation part (`attention_activation_bytes` / `mlp_activation_bytes` key)
    numel: float
    element_bytes: int

    @property
    def nbytes(self) -> float:
        return self.numel * self.element_bytes


def saved_tensors(
    model: ModelSpec,
    parallel: ParallelConfig,
    workload: Workload,
    layer_index: int,
    options: ActivationOptions = ActivationOptions(),
) -> tuple[SavedTensor, ...]:
    """The activation parts of one layer as tensors (elements and bytes per element): what the offload size
    thresholds are applied to. The q / k layernorm inputs are T*a*d/t and T*g*d/t elements."""
    parts = {
        **token_mixer_activation_bytes(model, parallel, workload, layer_index, options),
        **mlp_activation_bytes(model, parallel, workload, layer_index, options),
    }
    out: list[SavedTensor] = []
    for part, nbytes in parts.items():
        size = FP32_BYTES if part in _FP32_PARTS else 1 if part in _BYTE_PARTS else options.bytes_per_element
        if part == "qk_norm_inputs":
            a, g = model.num_attention_heads / parallel.tp, model.query_groups_per_rank(parallel.tp)
            out += [
                SavedTensor(part, nbytes / size * a / (a + g), size),
                SavedTensor(part, nbytes / size * g / (a + g), size),
            ]
            continue
        count = _TENSORS_IN_PART.get(part, 1)
        out += [SavedTensor(part, nbytes / size / count, size)] * count
    return tuple(out)


@dataclass(frozen=True)
class OffloadGroup:
    """The tensors one offload group moves for one layer and micro-batch: `copied_bytes` go to host memory in the
    forward and come back in the backward; `freed_bytes` of them leave the GPU (a tensor still used by a later module
    is copied but stays)."""

    module: str  # an offload module, or "layer" for the layer-level offload
    copied_bytes: float
    freed_bytes: float


def offload_groups(
    model: ModelSpec,
    parallel: ParallelConfig,
    workload: Workload,
    layer_index: int,
    options: ActivationOptions = ActivationOptions(),
) -> tuple[OffloadGroup, ...]:
    """What activation offloading moves of layer `layer_index`, one micro-batch (empty when off or in forward mode).

    Layer-level (`num_layers` > 0): one group of every saved tensor of >= `TE_LAYER_OFFLOAD_MIN_ELEMENTS`
    elements (Transformer Engine hooks every save of the layer's forward; parameters are never moved), all freed.
    Fine-grained: one group per listed module that saves anything, in forward order, of its tensors of >=
    `min_tensor_elements` elements (fine_grained_activation_offload.py `tensor_need_offloading_checker`). core_attn
    also copies the attention output, which TE's attention saves and which is linear_proj's input: it is released
    only by the attn_proj group (`forced_released_tensors=[core_attn_out]`, attention.py), so without attn_proj the
    copy frees nothing. q, k, v are released by core_attn (`forced_released_tensors=[query, key, value]`).
    """
    config = workload.activation_offload
    if not config.enabled or not workload.is_training:
        return ()
    tensors = saved_tensors(model, parallel, workload, layer_index, options)
    if config.layer_level:
        moved = sum(t.nbytes for t in tensors if t.numel >= TE_LAYER_OFFLOAD_MIN_ELEMENTS)
        return (OffloadGroup("layer", moved, moved),)
    eligible = [t for t in tensors if t.numel >= config.min_tensor_elements]
    moe = model.is_moe_layer(layer_index)
    groups = []
    for module in OFFLOAD_MODULES:
        if module not in config.modules or (module == "mlp_norm" and not moe):
            continue
        freed = sum(t.nbytes for t in eligible if _OFFLOAD_GROUP_OF_PART.get(t.part) == module)
        copied = freed
        if module == "core_attn" and freed:
            copied += sum(t.nbytes for t in eligible if t.part == "proj_input")
        if copied:
            groups.append(OffloadGroup(module, copied, freed))
    return tuple(groups)


def offloaded_per_chunk(
    model: ModelSpec,
    parallel: ParallelConfig,
    workload: Workload,
    stage: int,
    options: ActivationOptions = ActivationOptions(),
    copied: bool = False,
) -> tuple[tuple[float, ...], float]:
    """(bytes one micro-batch of each model chunk of rank `stage` has off the GPU once its forward is done, bytes the
    first chunk to run backward keeps on the GPU besides). `copied`: the bytes copied to host memory instead of those
    freed on the GPU (`OffloadGroup`): what megatron-core's `offload_summary_bytes` counts.

    Layer-level (Transformer Engine `DefaultOffloadSynchronizer`, transformer_engine/pytorch/cpu_offload.py): the
    model's first `num_layers` layers; layer i is released before layer L - num_layers + i runs forward, so all of
    them are off the GPU when the forward ends (megatron-core allows it only without pipeline parallelism).
    Fine-grained (fine_grained_activation_offload.py `PipelineOffloadManager.post_warmup_callback`): of each chunk's
    groups in forward order, the later int(n x (1 - fraction)) stay; and the first chunk to run backward keeps the
    last group of each module on the GPU (the "offload margin", so that its reload does not stall the compute
    stream). `should_bulk_offload` keeps the same groups on a rank whose next backward is the chunk just run
    forward (pp = 1, the last pipeline rank), where only that chunk is in flight: counted once either way."""
    config = workload.activation_offload
    layout = pipeline_layout_of(model, parallel)
    per_chunk: list[float] = []
    kept = 0.0
    by_kind: dict[tuple, tuple[OffloadGroup, ...]] = {}
    for chunk in range(layout.vpp):
        groups: list[OffloadGroup] = []
        for layer in layout.chunk_layers(stage, chunk):
            if config.layer_level and layer >= config.num_layers:
                continue
            kind = model.layer_kind(layer)
            if kind not in by_kind:
                by_kind[kind] = offload_groups(model, parallel, workload, layer, options)
            groups.extend(by_kind[kind])
        freed = _offloaded_after_fraction(groups, config.fraction, copied)
        per_chunk.append(freed)
        if config.fine_grained and chunk == layout.vpp - 1:
            last_of_module = {g.module: i for i, g in enumerate(groups)}
            rest = [g for i, g in enumerate(groups) if i not in set(last_of_module.values())]
            kept = freed - _offloaded_after_fraction(rest, config.fraction, copied)
    return tuple(per_chunk), kept


def _offloaded_after_fraction(groups: list[OffloadGroup], fraction: float, copied: bool = False) -> float:
    """Freed (or copied) bytes of the first n - int(n x (1 - fraction)) groups (the later ones stay on the GPU)."""
    n = len(groups)
    keep_on_gpu = int(n * (1.0 - fraction))
    return sum(g.copied_bytes if copied else g.freed_bytes for g in groups[: n - keep_on_gpu])


def in_flight_microbatches(parallel: ParallelConfig, workload: Workload, stage: int) -> int:
    """Micro-batches (per model chunk for interleaving) whose activations rank `stage` holds at peak.

    1F1B: min(pp - stage, m). Interleaved with v chunks: min(m*v, 2(pp - stage - 1) + (v - 1)pp + 1),
    counted in chunk-micro-batches. Forward-only work keeps nothing for backward: 0.
    """
    if not workload.is_training:
        return 0
    m = num_microbatches(parallel, workload)
    return sum(in_flight_chunk_counts(parallel.pp, parallel.virtual_stages, stage, m)[0])


@lru_cache(maxsize=4096)
def in_flight_chunk_counts(pp: int, v: int, stage: int, m: int) -> tuple[tuple[int, ...], ...]:
    """Every distinct count of in-flight micro-batches per model chunk that rank `stage` passes through in the
    steady state of the schedule (their sum is the in-flight count of `in_flight_microbatches`).

    megatron-core's interleaved schedule (`forward_backward_pipelining_with_interleaving`, micro-batch groups of
    pp): the k-th forward runs chunk (k mod pp*v) // pp, the k-th backward chunk v - 1 - (k mod pp*v) // pp; after
    W = min(m*v, 2(pp - stage - 1) + (v - 1)pp + 1) - 1 warm-up forwards each step runs one forward then one
    backward, so W + 1 chunk-micro-batches are in flight, in a mix of chunks that repeats every pp*v steps. With
    uneven chunks the heaviest mix sets the peak. 1F1B (v = 1): one vector, min(pp - stage, m).
    """
    if v == 1:
        return ((min(pp - stage, m),),)
    total = m * v
    in_flight = min(total, 2 * (pp - stage - 1) + (v - 1) * pp + 1)
    group = pp * v

    def forward_chunk(k: int) -> int:
        return (k % group) // pp

    counts = [0] * v
    for k in range(in_flight):
        counts[forward_chunk(k)] += 1
    seen = {tuple(counts)}
    for i in range(min(total - in_flight, 2 * group)):
        counts[v - 1 - (i % group) // pp] -= 1  # backward i
        counts[forward_chunk(in_flight + i)] += 1  # next forward
        seen.add(tuple(counts))
    return tuple(sorted(seen))


@dataclass(frozen=True)
class StageMemory:
    """Peak memory of one rank of one pipeline stage, in bytes, by kind."""

    stage: int
    parameters: ParameterCounts
    weights_bytes: float
    gradients_bytes: float
    optimizer_bytes: float
    activations_bytes: float
    activation_detail: dict[str, float] = field(default_factory=dict)
    in_flight_microbatches: int = 0
    allowance_bytes: float = 0.0
    optimizer_step_bytes: float = 0.0
    # the part of `allowance_bytes` outside the caching allocator (CUDA context, NCCL buffers)
    non_torch_bytes: float = 0.0
    # activations held in CUDA-graph memory pools, which the optimizer step cannot reuse (`cuda_graph_bytes`)
    graph_pool_bytes: float = 0.0
    # activations activation offloading holds in pinned host memory at the peak instead (not in `activations_bytes`)
    offloaded_bytes: float = 0.0

    @property
    def model_state_bytes(self) -> float:
        return self.weights_bytes + self.gradients_bytes + self.optimizer_bytes

    @property
    def allocated_bytes(self) -> float:
        """What torch.cuda.max_memory_allocated would show: model state + the larger of the activations
        (forward / backward) and what only the optimizer step holds (beside what CUDA-graph pools keep)."""
        return self.model_state_bytes + max(self.activations_bytes, self.optimizer_step_bytes + self.graph_pool_bytes)

    @property
    def total_bytes(self) -> float:
        return self.allocated_bytes + self.allowance_bytes

    def to_dict(self) -> dict:
        return {
            "stage": self.stage,
            "parameters": self.parameters.to_dict(),
            "weights_gib": self.weights_bytes / GIB,
            "gradients_gib": self.gradients_bytes / GIB,
            "optimizer_gib": self.optimizer_bytes / GIB,
            "activations_gib": self.activations_bytes / GIB,
            "optimizer_step_gib": self.optimizer_step_bytes / GIB,
            "allowance_gib": self.allowance_bytes / GIB,
            "non_torch_gib": self.non_torch_bytes / GIB,
            "graph_pool_gib": self.graph_pool_bytes / GIB,
            "offloaded_gib": self.offloaded_bytes / GIB,
            "allocated_gib": self.allocated_bytes / GIB,
            "total_gib": self.total_bytes / GIB,
            "in_flight_microbatches": self.in_flight_microbatches,
            "activation_detail_gib": {k: v / GIB for k, v in self.activation_detail.items()},
        }


def fp8_weight_counts(counts: ParameterCounts) -> ParameterCounts:
    """The parameters Transformer Engine runs in fp8: the TE linear layers of the decoder (and MTP), taken as all
    decoder parameters (their norm weights and the MoE router, < 0.1%, are not cast). The word embedding, final
    norm and megatron-core's output layer (`tensor_parallel.ColumnParallelLinear`, not TE) stay bf16."""
    return ParameterCounts(
        decoder_dense=counts.decoder_dense,
        mtp_dense=counts.mtp_dense,
        expert=counts.expert,
        mtp_expert=counts.mtp_expert,
    )


def param_gather_bytes(counts: ParameterCounts, workload: Workload) -> tuple[float, float]:
    """(dense, expert) bytes the distributed optimizer all-gathers per step: bf16, 2 per parameter; with fp8
    parameters the TE linear weights travel in fp8, 1 byte (megatron-core keeps them in a uint8 buffer)."""
    dense, experts = BF16_BYTES * float(counts.dense), BF16_BYTES * float(counts.experts)
    if workload.precision == "fp8" and workload.fp8_param:
        fp8 = fp8_weight_counts(counts)
        dense -= (BF16_BYTES - FP8_BYTES) * fp8.dense
        experts -= (BF16_BYTES - FP8_BYTES) * fp8.experts
    return dense, experts


def _model_state_bytes(
    counts: ParameterCounts, parallel: ParallelConfig, workload: Workload
) -> tuple[float, float, float]:
    weight_bytes = BF16_BYTES * counts.total
    if workload.precision == "fp8" and not workload.fp8_param:
        # cached fp8 weight + its transpose; forward-only passes run under no_grad, where TE's weight quantizer
        # asks for no column-wise (transposed) copy
        cache_bytes = 2 * FP8_BYTES if workload.is_training else FP8_BYTES
        weight_bytes += cache_bytes * fp8_weight_counts(counts).total
    # fp8 parameters: fp8 weight + transpose = 2 bytes, in place of the bf16 weight
    if not workload.is_training:
        return weight_bytes, 0.0, 0.0
    grads = parallel.main_grad_bytes * counts.total
    optimizer = 3 * FP32_BYTES * optimizer_shard_parameters(counts, parallel)
    return weight_bytes, grads, optimizer


def optimizer_shard_parameters(counts: ParameterCounts, parallel: ParallelConfig) -> float:
    """Parameters whose optimizer state one rank holds: dense over dp*cp and experts over edp with the
    distributed optimizer, all of them without it."""
    if parallel.use_distributed_optimizer:
        return counts.dense / (parallel.dp * parallel.cp) + counts.experts / parallel.edp
    return counts.total


def optimizer_step_bytes(counts: ParameterCounts, parallel: ParallelConfig, training: bool) -> float:
    """Held only during the optimizer step: the fp32 copy of the local gradient shard that megatron-core
    makes when the main grads are bf16 (with fp32 main grads `.float()` returns the buffer itself)."""
    if not training or parallel.grad_reduce_in_fp32:
        return 0.0
    return FP32_BYTES * optimizer_shard_parameters(counts, parallel)


def _tower_run(model: ModelSpec, parallel: ParallelConfig, workload: Workload) -> tuple[ParallelConfig, Workload]:
    """The vision tower's blocks as a run of their own: the largest micro-batch's images as sequences of P patches,
    split over the decoder's TP without sequence parallelism or CP (`costmodel.vision`), the run's recompute."""
    vision = model.vision
    images = max(1, math.ceil(images_per_microbatch(parallel, workload, largest=True)))
    patches = max(1, round(patches_per_image(vision, workload.image_tokens_per_sequence)))
    tower_parallel = ParallelConfig(num_gpus=parallel.tp, tp=parallel.tp)
    return tower_parallel, Workload(patches, images, images, workload.recompute, workload.precision, workload.mode)


def vision_activation_bytes(
    model: ModelSpec, parallel: ParallelConfig, workload: Workload, options: ActivationOptions
) -> dict[str, float]:
    """Bytes the vision tower of the first stage keeps for backward, one micro-batch (training), or its largest
    working set (forward only): its blocks as decoder layers (`layer_activation_bytes` of `tower_model`; with full
    recompute their inputs only), the patch embedding's bf16 pixels (its wgrad's input) and the merger's norm input,
    fc1 input, GELU input and fc2 input. Empty without a tower or images."""
    if model.vision is None or not workload.image_tokens_per_sequence:
        return {}
    vision, tower = model.vision, model.vision.tower_model()
    tower_parallel, tower_workload = _tower_run(model, parallel, workload)
    e, tp = options.bytes_per_element, parallel.tp
    patches = tower_workload.tokens_per_micro_batch
    tokens = patches / vision.patches_per_token
    if not workload.is_training:
        fc1 = (2 if vision.gated_linear_unit else 1) * vision.ffn_hidden_size / tp
        return {"vision_working_set": e * patches * (fc1 + vision.ffn_hidden_size / tp + vision.hidden_size)}
    if workload.recompute.is_full:
        blocks = (
            vision.depth * layer_input_bytes(tower, tower_parallel, tower_workload, e) / workload.recompute.num_layers
        )
    else:
        blocks = sum(
            layer_activation_bytes(tower, tower_parallel, tower_workload, i, options) for i in range(vision.depth)
        )
    m = vision.merger_width
    ends = e * patches * (vision.patch_features + vision.hidden_size) + e * tokens * m * (1 + 2 / tp)
    return {"vision_blocks": blocks, "vision_embed_merger": ends}


@dataclass(frozen=True)
class _StageStatic:
    """What a stage's memory needs that does not depend on how many micro-batches it holds in flight: shared by
    every stage with the same layers, embedding, loss and MTP (`memory_per_stage` computes it once per kind)."""

    counts: ParameterCounts
    model_state: tuple[float, float, float]
    optimizer_step: float
    stored: tuple[float, ...]  # one micro-batch of each model chunk (training)
    embedding: float  # per in-flight micro-batch of the first chunk (first stage)
    detail: dict[str, float]  # everything else (forward-only: the whole activation detail)
    forward_only: bool
    graph_pool: tuple[float, ...] = ()  # per chunk, one micro-batch: activations kept in CUDA-graph pools
    graph_static: tuple[float, ...] = ()  # per chunk, one micro-batch: transformer_engine graphs' static inputs
    offloaded: tuple[float, ...] = ()  # per chunk: of `stored`, the bytes offloading moves off the GPU


def _stage_static(
    model: ModelSpec,
    parallel: ParallelConfig,
    workload: Workload,
    stage: int,
    options: ActivationOptions,
    padded_vocab_size: int | None,
    device_bytes: float | None = None,
    kind_bytes: dict[tuple, float] | None = None,
) -> _StageStatic:
    """`kind_bytes`: a whole layer's activations per `ModelSpec.layer_kind`, shared by the stages of one layout."""
    counts = stage_parameters(model, parallel, stage, padded_vocab_size)
    model_state = _model_state_bytes(counts, parallel, workload)
    step = optimizer_step_bytes(counts, parallel, workload.is_training)
    e = options.bytes_per_element
    tokens = local_tokens(workload, parallel)
    h, t, x = model.hidden_size, parallel.tp, _sp_divisor(parallel)
    vocab = padded_vocab_size or model.vocab_size
    first, last = stage == 0, stage == parallel.pp - 1
    layers = stage_layer_range(model, parallel, stage)
    detail: dict[str, float] = {}

    if not workload.is_training:
        # Forward only (no_grad): nothing is kept; the peak is the largest working set of one layer
        # (MLP: fc1 output + activation output) or of the logits on the last stage (bf16 logits +
        # fp32 log-softmax as RL log-prob passes compute).
        working, moe_working = [], []
        for layer in layers:
            if model.is_moe_layer(layer):
                routed = model.routed_tokens(tokens, t, parallel.etp, workload.expert_load(parallel.ep))
                f = model.moe_ffn_hidden_size
                moe_working.append(e * routed * (2 * h + 3 * f / parallel.etp))
                working.append(moe_working[-1])
            elif model.has_mlp(layer):
                working.append(e * tokens * 3 * model.ffn_hidden_size / t + e * tokens * h)
            else:
                working.append(0.0)
            mixer = model.token_mixer(layer)
            if mixer in SCAN_MIXERS:
                working[-1] = max(working[-1], SCAN_MIXERS[mixer].forward_working_bytes(model, tokens, e) / t)
            elif mixer == "attention" and not model.has_mlp(layer):
                working[-1] = e * tokens * (model.qkv_projection_size / t + h)  # qkv output beside the input
        detail["layer_working_set"] = max(working) if working else 0.0
        if first:  # the vision tower's blocks run one after the other, before the decoder's
            tower = vision_activation_bytes(model, parallel, workload, options).get("vision_working_set", 0.0)
            detail["layer_working_set"] = max(detail["layer_working_set"], tower)
        if moe_working:
            detail["moe_layer_working_set"] = max(moe_working)  # informative: in `layer_working_set` already
        if last:
            detail["logits_working_set"] = (e + FP32_BYTES) * tokens * vocab / t
            fragment = packed_logits_fragment(parallel, workload, vocab, device_bytes)
            if fragment:
                # not an activation (not in the peak below): reserved-but-unallocated bytes, added by
                # `MemoryAllowance.bytes_for` without expandable segments
                detail["packed_logits_fragment"] = fragment
        detail["pipeline_buffers"] = 2 * e * tokens * h / x * (parallel.pp > 1)
        pools, statics = (), ()
        if workload.cuda_graph.impl == "transformer_engine":
            # captured with autograd for the schedule's in-flight micro-batches, replayed in training mode: the
            # saved activations and static inputs stay (module docstring)
            pools, statics = cuda_graph_chunk_bytes(model, parallel, workload, stage, options)
            detail["cuda_graph_grad_output"] = e * tokens * h / x
        return _StageStatic(counts, model_state, step, (), 0.0, detail, True, pools, statics)

    layout = pipeline_layout_of(model, parallel)
    rc = workload.recompute
    per_chunk_kinds = chunk_layer_kinds(model, parallel, stage, rc)
    by_kind: dict[tuple, float] = {}  # a whole layer's activations, per `ModelSpec.layer_kind` of this stage's layers
    shared = {} if kind_bytes is None else kind_bytes
    for kinds in per_chunk_kinds:
        for _moe, _full, _n, layer in kinds:
            kind = model.layer_kind(layer)
            if kind not in shared:
                shared[kind] = layer_activation_bytes(model, parallel, workload, layer, options)
            by_kind[kind] = shared[kind]
    layer_in = layer_input_bytes(model, parallel, workload, e)
    # uniform: groups of rc.num_layers keep one input each; block: every recomputed layer keeps its input
    checkpoint = layer_in / rc.num_layers if rc.method == "uniform" else layer_in
    # one micro-batch of each model chunk of this rank
    stored = tuple(
        sum(n * (checkpoint if full else by_kind[model.layer_kind(layer)]) for _moe, full, n, layer in kinds)
        for kinds in per_chunk_kinds
    )
    offloaded: tuple[float, ...] = ()
    if workload.activation_offload.enabled:
        offloaded, kept = offloaded_per_chunk(model, parallel, workload, stage, options)
        stored = tuple(b - o for b, o in zip(stored, offloaded, strict=True))
        if kept:
            detail["offload_margin"] = kept
    transient = 0.0
    if rc.is_full and by_kind:
        # During backward one recomputed group is materialised in full, once.
        group = rc.num_layers if rc.method == "uniform" else 1
        transient = max(by_kind.values()) * group
    embedding = 0.0
    if first and model.hidden_dropout > 0:
        embedding = 1 * tokens * h / x  # the embedding's dropout mask, kept by the first model chunk
    if first:
        tower = vision_activation_bytes(model, parallel, workload, options)
        embedding += sum(tower.values())  # kept with the first chunk's micro-batch, like the embedding's
        detail.update({f"{k}_per_microbatch": v for k, v in tower.items()})
    detail["recompute_working_set"] = transient
    if last:
        # final norm input + output-layer input (bf16) and the fp32 softmax that
        # vocab_parallel_cross_entropy saves for backward (one micro-batch: the last stage runs
        # each micro-batch's backward right after its forward).
        detail["output_layer"] = 2 * e * tokens * h / x + FP32_BYTES * tokens * vocab / t
        # not saved, but alive beside the fp32 softmax at the step's peak: the bf16 logits (forward) /
        # their bf16 gradient (backward). Measured: 4-layer Qwen3-8B training steps on H200
        # (benchmarks/results/validation_h200_x2) peaked above the rest of this model by 1.16-1.26 GiB at
        # 4096 tokens, 0.58-0.71 at TP2 and 2.32-2.54 at 8192 tokens: 2 bytes x tokens x vocab / tp.
        detail["logits_transient"] = e * tokens * vocab / t
        if options.loss_kernel == "native":
            # megatron-core's torch-compiled loss writes its exp / softmax into a new fp32 buffer beside the fp32 copy
            # of the logits, which is still alive: one more fp32 tokens x vocab at the peak. One H200, 2-layer
            # gpt-oss-120b / Qwen3-30B-A3B shapes with 151936-201088 entries at 4096-16384 tokens
            # (benchmarks/results/moe_fused_h200): measured peaks above this model without it by 0.80-1.41x
            # (median 0.92x) of 4 bytes x tokens x vocab, where the loss was the step's peak.
            detail["logits_transient"] += FP32_BYTES * tokens * vocab / t
        if transient:
            # The loss's tensors are freed by the output layer's backward, before any decoder layer is
            # recomputed: the two peaks come one after the other, and the larger one counts. Measured:
            # 4-layer Qwen3-30B-A3B, full recompute, 32k tokens per micro-batch: 28.85 GiB of activations at
            # the peak = checkpoints + output layer + logits (28.6), not + the recomputed layer (4.5 more)
            # (benchmarks/results/validation_h200_x2/expandable/moe).
            loss_peak = detail["output_layer"] + detail["logits_transient"]
            detail["recompute_working_set"] = max(0.0, transient - loss_peak)
    mtp_layers = layout.rank_mtp_layers(stage)
    if mtp_layers:
        detail["mtp"] = mtp_layers * (
            layer_activation_bytes(model, parallel, workload, model.num_layers - 1, options)
            + 2 * e * tokens * 2 * h / x
            + FP32_BYTES * tokens * vocab / t
        )
    pools, statics = cuda_graph_chunk_bytes(model, parallel, workload, stage, options)
    if workload.cuda_graph.impl == "transformer_engine" and any(statics):
        detail["cuda_graph_grad_output"] = e * tokens * h / x  # one, shared by output signature
    return _StageStatic(counts, model_state, step, stored, embedding, detail, False, pools, statics, offloaded)


def _stage_activations(
    static: _StageStatic, parallel: ParallelConfig, workload: Workload, stage: int
) -> tuple[float, dict[str, float], int, float]:
    """(activation bytes, detail, in-flight micro-batches, bytes held in CUDA-graph pools, bytes offloaded to the host)
    of rank `stage` from its static part."""
    if static.forward_only:
        detail = dict(static.detail)
        layer_ws, logits_ws = detail.get("layer_working_set", 0.0), detail.get("logits_working_set", 0.0)
        peak = max(layer_ws, logits_ws)
        pool = 0.0
        if static.graph_pool:
            m = num_microbatches(parallel, workload)
            counts = in_flight_chunk_counts(parallel.pp, len(static.graph_pool), stage, m)[0]
            pool = sum(k * b for k, b in zip(counts, static.graph_pool, strict=True))
            detail["cuda_graph_saved_activations"] = pool
            detail["cuda_graph_static_inputs"] = sum(k * b for k, b in zip(counts, static.graph_static, strict=True))
            # the graphed layers' working set sits in the pool, which the logits cannot reuse
            peak = layer_ws + logits_ws
        graph_parts = (
            detail.get("cuda_graph_saved_activations", 0.0)
            + detail.get("cuda_graph_static_inputs", 0.0)
            + detail.get("cuda_graph_grad_output", 0.0)
        )
        if workload.cuda_graph.impl == "full_iteration":
            pool = peak
        return peak + detail["pipeline_buffers"] + graph_parts, detail, 0, pool, 0.0
    m = num_microbatches(parallel, workload)
    stored, embedding = static.stored, static.embedding
    vectors = in_flight_chunk_counts(parallel.pp, len(stored), stage, m)
    if len(vectors) == 1 or (len(set(stored)) == 1 and not embedding):
        peak_counts = vectors[0]
    else:  # the heaviest mix of in-flight chunk-micro-batches (equal chunks: in_flight x stored / v)
        peak_counts = max(vectors, key=lambda n: sum(k * b for k, b in zip(n, stored, strict=True)) + n[0] * embedding)
    detail = {"decoder_layers": sum(k * b for k, b in zip(peak_counts, stored, strict=True))}
    detail.update(static.detail)
    if stage == 0:
        detail["embedding"] = embedding * peak_counts[0]
    pool = 0.0
    if workload.cuda_graph.enabled:
        pool = sum(k * b for k, b in zip(peak_counts, static.graph_pool, strict=True))
        if any(static.graph_static):
            detail["cuda_graph_static_inputs"] = sum(
                k * b for k, b in zip(peak_counts, static.graph_static, strict=True)
            )
    activations = sum(detail.values())
    if workload.cuda_graph.impl == "full_iteration":
        pool = activations  # the whole forward-backward is captured into one pool
    offloaded = 0.0
    if static.offloaded:
        offloaded = sum(k * o for k, o in zip(peak_counts, static.offloaded, strict=True))
        offloaded -= detail.get("offload_margin", 0.0)
    return activations, detail, sum(peak_counts), pool, offloaded


def forward_moe_fragment_bytes(detail: dict[str, float]) -> float:
    """Reserved-but-unallocated bytes a forward-only MoE pass leaves under expandable segments: the last MoE
    block's working set (permuted tokens, expert fc1 / activation / fc2 outputs) is freed in pieces that the
    later, larger logits request cannot use, so the segment grows past them. Measured on 1x H100, Qwen3-30B-A3B
    s8192 forward-only: 1.42 / 2.82 GiB reserved unallocated at the peak (mbs2 / mbs4), 0.91 / 0.90 of that
    working set, each the excess growth at the first logits request (allocator history,
    benchmarks/results/validation_h100_x1/moe_holes); 3.8 GiB with ep2 on 2x H200. A dense model of the same
    depth left 0.22 GiB: its freed MLP tensors are reused. Counted only where the logits are the stage's peak."""
    moe = detail.get("moe_layer_working_set", 0.0)
    if moe and detail.get("logits_working_set", 0.0) > detail.get("layer_working_set", 0.0):
        return moe
    return 0.0


def packed_logits_fragment(
    parallel: ParallelConfig, workload: Workload, vocab: int, device_bytes: float | None = None
) -> float:
    """Reserved-but-unallocated bytes the logits of variable-size packed micro-batches leave at the last stage of
    a forward-only pass with the default caching allocator (`theory.allocator`: its large pool replayed over each
    micro-batch's bf16 logits and fp32 copy, in the order verl runs them, `specs.lengths.PackedBatch`; the
    largest over the DP ranks). Measured on 1x H100 (benchmarks/results/validation_h100_x1/rlhf_packing):
    Llama-3.1-8B 16k tokens per micro-batch left 8.74 GiB reserved unallocated, 7.01 of it this (the third
    micro-batch's bf16 logits take the fp32 block of the first, its fp32 logits a new segment); forward-only
    reserved memory within -0.5..+7.1% with it, -26..-46% without.

    Forward-only only: nothing else outlives a micro-batch in the large pool, so the logits requests find exactly
    the blocks the earlier micro-batches' logits left. In training each micro-batch's stored activations are
    allocated into those blocks before its logits, and a logits-only replay over-predicts the training runs
    there (+12% / +24% reserved for two of the four); 0 without `workload.lengths` or in training. The replay
    stops once the logits alone reserve more than `device_bytes` (`released_at_device_limit` then cuts it)."""
    if workload.is_training or workload.lengths is None:
        return 0.0
    packed = packed_batch(parallel, workload)
    if packed is None:
        return 0.0
    vocab_per_rank = -(-vocab // parallel.tp)
    return float(
        max(
            packed_logits_fragment_bytes(
                tuple(sum(mb) // parallel.cp for mb in rank), vocab_per_rank, False, device_bytes
            )
            for rank in packed.ranks
        )
    )


def interleaved_logits_fragment_bytes(detail: dict[str, float], parallel: ParallelConfig) -> float:
    """Reserved-but-unallocated bytes at the last stage of an interleaved pipeline under expandable segments: one
    bf16 logits buffer (`logits_transient`). The loss frees the bf16 logits after the forward; before that
    micro-batch's backward asks for a block of the same size (the logits' gradient), the interleaved schedule
    allocates the next receive buffer (s x b x h) at the start of the freed block, so the gradient does not
    fit there and the segment grows by a whole logits buffer. Allocator histories of every rank of 2-GPU
    layouts, run as memory stand-ins on one H200 (benchmarks/results/validation_h200_x1/stand_in_memory): the
    last stage of pp2 with vpp2 / vpp4 left 1.15-1.29 GiB reserved unallocated at 4096 tokens per micro-batch
    (bf16 logits 1.16 GiB) and 2.42-2.43 GiB at 8192 (2.32); without interleaving 0.05 GiB."""
    if parallel.vpp is None:
        return 0.0
    return detail.get("logits_transient", 0.0)


def stage_memory(
    model: ModelSpec,
    parallel: ParallelConfig,
    workload: Workload,
    stage: int,
    options: ActivationOptions = ActivationOptions(),
    allowance: MemoryAllowance = MemoryAllowance(),
    padded_vocab_size: int | None = None,
    static: _StageStatic | None = None,
) -> StageMemory:
    """Peak memory of one rank of pipeline stage `stage` (`static`: its precomputed in-flight-independent part)."""
    if static is None:
        static = _stage_static(model, parallel, workload, stage, options, padded_vocab_size, allowance.device_bytes)
    weights, grads, optimizer = static.model_state
    activations, detail, in_flight, pool, offloaded = _stage_activations(static, parallel, workload, stage)
    memory = StageMemory(
        stage=stage,
        parameters=static.counts,
        weights_bytes=weights,
        gradients_bytes=grads,
        optimizer_bytes=optimizer,
        activations_bytes=activations,
        activation_detail=detail,
        in_flight_microbatches=in_flight,
        allowance_bytes=allowance.bytes_for(activations, parallel, workload.is_training, detail),
        optimizer_step_bytes=static.optimizer_step,
        non_torch_bytes=allowance.non_torch_for(parallel, workload.is_training) * GIB,
        graph_pool_bytes=pool,
        offloaded_bytes=offloaded,
    )
    return released_at_device_limit(memory, allowance)


def released_at_device_limit(memory: StageMemory, allowance: MemoryAllowance) -> StageMemory:
    """`memory` with the cached logits segments of packed forward-only micro-batches (`packed_logits_fragment`,
    no expandable segments) cut to what leaves the rank within `allowance.device_bytes`. When cudaMalloc fails,
    PyTorch's caching allocator frees every cached segment with nothing allocated in it and retries
    (`release_cached_blocks` in `DeviceCachingAllocator::malloc`, c10/cuda/CUDACachingAllocator.cpp; the
    `release_available_cached_blocks` step before it returns at once with max_split_size unlimited, the default).
    A forward-only pass frees each micro-batch's logits before the next asks, so those segments are all
    releasable and the reserve stops at the device, however many growing micro-batches come: replayed without
    the limit, the 2,000 micro-batches of an 8,192-sequence step at a 10,240-token budget "reserved" 1 TiB."""
    fragment = memory.activation_detail.get("packed_logits_fragment", 0.0)
    if allowance.device_bytes is None or allowance.expandable_segments or not fragment:
        return memory
    over = memory.total_bytes - allowance.device_bytes
    if over <= 0:
        return memory
    return replace(memory, allowance_bytes=memory.allowance_bytes - min(over, fragment))


def stage_signature(model: ModelSpec, parallel: ParallelConfig, stage: int) -> tuple:
    """What makes two pipeline ranks hold the same parameters and per-micro-batch work: the kind of each layer
    of each chunk (MoE or not), and whether the rank holds the embedding, the loss, the final norm, MTP layers."""
    return _signature(model, pipeline_layout_of(model, parallel), stage)


@lru_cache(maxsize=65536)
def _signature(model: ModelSpec, layout, stage: int) -> tuple:
    chunks = tuple(tuple(model.layer_kind(i) for i in layout.chunk_layers(stage, c)) for c in range(layout.vpp))
    return (
        chunks,
        stage == 0,
        stage == layout.pp - 1,
        layout.rank_embedding_copies(stage),
        layout.rank_mtp_layers(stage),
        layout.final_norm_rank == stage,
    )


def memory_parallel(parallel: ParallelConfig) -> ParallelConfig:
    """`parallel` less what this memory model does not read: the EP all-to-all overlap and delayed wgrad schedule
    the same tensors (the overlap's second stream's reserve is not modelled). Layouts that differ only there have
    the same `memory_per_stage`, so the search keys its memo on this."""
    if not (parallel.moe_a2a_overlap or parallel.delay_wgrad_compute):
        return parallel
    return replace(parallel, moe_a2a_overlap=False, delay_wgrad_compute=False)


def memory_per_stage(
    model: ModelSpec,
    parallel: ParallelConfig,
    workload: Workload,
    options: ActivationOptions = ActivationOptions(),
    allowance: MemoryAllowance = MemoryAllowance(),
    padded_vocab_size: int | None = None,
) -> list[StageMemory]:
    """`stage_memory` for every pipeline stage; the job needs max(total_bytes) per GPU. Ranks with the same
    `stage_signature` share their in-flight-independent part (the signature keeps each layer's position in its
    chunk, which is all that block recompute looks at)."""
    statics: dict[tuple, _StageStatic] = {}
    kind_bytes: dict[tuple, float] = {}
    out = []
    for s in range(parallel.pp):
        key = stage_signature(model, parallel, s)
        if key not in statics:
            statics[key] = _stage_static(
                model, parallel, workload, s, options, padded_vocab_size, allowance.device_bytes, kind_bytes
            )
        out.append(stage_memory(model, parallel, workload, s, options, allowance, padded_vocab_size, statics[key]))
    return out
