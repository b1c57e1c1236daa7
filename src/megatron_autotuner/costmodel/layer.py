"""Time of one decoder layer (and of the embedding / output layer) for one micro-batch on one rank.

A layer is the sum of its operators (FLOPs per operator from `theory.flops`):
- GEMMs per phase (fwd, dgrad, wgrad) with the shapes megatron-core gives them on a rank:
  column-parallel (qkv, fc1, q/kv up, shared fc1) split the output by tp, row-parallel (proj, fc2,
  shared fc2) the input; MLA's down projections and the router are duplicated (work on the
  sequence-parallel shard); routed experts are a grouped GEMM of E/ep experts, each on
  T*k*etp/(tp*E/ep) tokens (balanced routing), split by etp.
- core attention (flash / cuDNN), forward = 2*s*a*(d_qk + d_v)/2 per token causal work, backward
  2x; with ring context parallelism 1/cp of the work is a causal block of s/cp tokens and the
  rest full blocks against s/cp keys (load-balanced chunks).
- memory-bound kernels, by the bytes they stream (bf16 = 2 bytes, T = local tokens, x = tp with
  sequence parallelism else 1, f = ffn/tp): per layer forward
      norms 2 x 4h*T/x, residual adds 2 x 6h*T/x (+1 byte mask per element with hidden dropout),
      rope 4(a + g)d*T/tp, activation 6f*T (gated; 4f not gated),
  backward: norms 2 x 6h*T/x, residual-grad adds 2 x 6h*T/x, activation 10f*T (6f), rope again,
  the q/k/v gradient concatenation 4(a + 2g)d*T/tp; with q/k norms (Qwen3) the q, k, v split
  copies 4(a + 2g)d*T/tp forward and TE's fixed-cost dgamma finalize of both norms backward. The
  fused SwiGLU backward, RoPE and the split copies stream below the default HBM fraction (measured
  fractions in `defaults`). MoE adds router softmax/top-k (fp32,
  10*E*T/x each way), the dispatcher's token permute / sort / unpermute (`moe_dispatch_work`: gathers and
  copies at the default fraction, the unfused path's atomic accumulates at their measured rates) and the expert
  activation on R tokens (R = routed tokens on the rank). fp8 adds a cast of every TE GEMM input (fwd) and output grad
  (bwd): 4 bytes per element with delayed scaling (read bf16, write fp8 and its transpose), 6 with
  per-tensor current scaling (an amax pass first; `defaults.FP8_CAST_BYTES_PER_ELEMENT`).
- exposed tensor-parallel communication (NCCL's protocol curves inside a node, `collectives`; TE userbuffers
  by their own copy-engine / SM-kernel curves, `collectives.userbuffers_time_s`). With sequence parallelism
  and no TP overlap: the forward all-gathers (qkv, fc1 inputs) and reduce-scatters (proj, fc2
  outputs) are exposed; backward, the all-gathers of the proj / fc2 output gradients are exposed,
  while TE overlaps the input re-gather with the qkv / fc1 dgrad GEMM and the dgrad
  reduce-scatter with the wgrad GEMM (seen in the TP=2 trace), exposing only max(0, comm - GEMM).
  Without SP: two exposed all-reduces forward, two backward overlapped with wgrad. With TE
  userbuffers (`tp_comm_overlap`) each collective runs under its GEMM with TE's default method:
  ring-exchange (n = tp chunks) t = max(g, c) + min(g, c)/n, pipeline (4 chunks, 16 SMs lent)
  and bulk (16 SMs lent) t = max(g', c); the pair never takes longer than without overlap (the
  overlap tuner keeps the faster setting per GEMM).
- context parallelism (p2p ring): cp-1 sends of the local K,V forward, each hidden behind one
  attention step: exposed (cp-1) * max(0, t_send - t_attn/cp); backward sends K,V and dK,dV.
  a2a (Ulysses) and all-gather CP are exposed.
- expert parallelism: dispatch + combine all-to-all of the rank's own top-k rows forward and backward,
  exposed (megatron-core's default; no EP overlap); with expert tensor parallelism the dispatcher's gather and
  reduce-scatter of the routed tokens over the etp ranks (`expert_tp_comm_s`). A MoE block's own tensor-parallel
  collectives are its shared experts' (TE linears, as a dense MLP's); routed experts with etp = 1 move nothing.
- host-bound MoE (`LayerContext.moe_host_bound`, an eager megatron-core MoE block): the block's
  GPU time is raised to the testbench-measured host floor: the calibration's (`Calibration.moe_host_floor`,
  measured on the machine), else `defaults.MOE_HOST_FLOOR_*`; the difference is reported as "host". The
  dispatcher's wait for the token counts on the host serialises host and GPU at every block. A block that drops and
  pads to capacity has no such wait (`LayerContext.moe_host_issue_ahead`): its floor is issue time like a dense
  layer's, compared per micro-batch; unless its experts' activation stops the host (`experts_activation_syncs_host`,
  gpt-oss's quick-GEGLU), which makes it host-bound as a dropless block: on three 2-GPU H200 hosts gpt-oss-20b's
  padded ep 2 step ran only 7-10% faster than the dropless one (benchmarks/results/moe_ep_*_h200_x2), where GPU time
  alone would make it 30% faster. A GPU-paced padded block (one H200, Qwen3-30B-A3B-E16,
  benchmarks/results/moe_token_drop_h200) runs at its GPU time.
- host-bound dense layer (eager megatron-core issues each layer's kernels from Python, ahead of the GPU): the
  layer's host issue time forward and backward (`LayerCost.host_fwd_s` / `host_bwd_s`: `Calibration.dense_host_floor`
  measured on the machine, else `defaults.DENSE_HOST_FLOOR_*`, plus the host of the TP collectives). CUDA graphs
  replace the captured part's host time with one graph replay (`captured_host_share`). The stage compares a whole
  micro-batch's host time with its GPU time (`costmodel.estimate.stage_time`), since the host runs ahead through
  GPU-heavy stretches (the output layer and loss) and catches up on host-bound layers.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import lru_cache

from ..errors import ConfigError
from ..specs.hardware import ClusterSpec
from ..specs.model import ModelSpec
from ..specs.parallel import FLEX_DISPATCHER_BACKENDS
from ..theory.comm import allgather_dispatch_bytes
from ..theory.flops import attention_flops_per_token
from ..theory.scan_mixers import SCAN_MIXERS
from . import defaults as d
from .calibration import (
    DEFAULT_DENSE_HOST_FLOOR,
    DEFAULT_FUSED_MOE_HOST_FLOOR,
    DEFAULT_MOE_HOST_FLOOR,
    Calibration,
    DenseHostFloor,
    MoeHostFloor,
)
from .collectives import collective_time_s, dispatch_time_s, hidden_collective_cost_s, userbuffers_time_s
from .compute import flash_attention_time_s, gemm_time_s, memory_bound_time_s

E_BF16 = 2
COLUMN_PARALLEL = ("qkv", "q_proj", "q_up", "kv_up", "fc1", "shared_fc1")
ROW_PARALLEL = ("proj", "fc2", "shared_fc2")
DUPLICATED = ("q_down", "kv_down", "router")
MOE_BLOCK_GEMM_PREFIXES = ("experts_", "shared_", "router")  # the GEMMs of a MoE block (not attention)
CLASSES = ("gemm", "attention", "memory_bound")
COMM_DIMS = ("tp", "cp", "ep")


@dataclass(frozen=True)
class LayerContext:
    """Everything besides the model that decides one layer's time on one rank."""

    cluster: ClusterSpec
    tp: int = 1
    sequence_parallel: bool = False
    cp: int = 1
    ep: int = 1
    etp: int = 1
    tokens: float = 1.0  # local tokens of one micro-batch (b*s/cp, averaged for dynamic batching)
    seq_length: int = 1
    precision: str = "bf16"
    fp8_recipe: str = "delayed"  # with precision fp8: delayed | tensorwise (Megatron-LM --fp8-recipe)
    training: bool = True
    full_recompute: bool = False
    recompute_modules: tuple[str, ...] = ()  # selective recompute
    tp_comm_overlap: bool = False
    cp_comm_type: str = "p2p"
    flash_attention: bool = True
    fused_bias_activation: bool = True  # Megatron-LM's default fused SwiGLU / GeLU
    moe_host_bound: bool = False  # eager MoE block: never faster than its host floor (see the module doc)
    # eager MoE block that drops and pads to capacity: no host sync, so its host floor is issue time the stage compares
    # per micro-batch, as a dense layer's (see the module doc)
    moe_host_issue_ahead: bool = False
    moe_permute_fusion: bool = False  # TE's fused token permute (--moe-permute-fusion): its kernels and host floor
    host_floor: bool = True  # a dense layer's phase never faster than its host's issue time (see the module doc)
    calibration: Calibration | None = None
    main_grad_bytes: int = 4  # fp32 main grads (2: --grad-reduce-in-bf16); wgrad GEMMs accumulate into them
    # CUDA graphs (`specs.parallel.CudaGraphConfig`): Megatron-LM --cuda-graph-impl and --cuda-graph-modules, as
    # megatron-core normalises them; an empty scope with local / transformer_engine captures the whole layer
    cuda_graph_impl: str = "none"
    cuda_graph_scope: tuple[str, ...] = ()
    # the busiest expert-parallel rank's routed tokens over the mean (`Workload.expert_load`)
    expert_load: float = 1.0
    moe_dispatcher: str = "alltoall"  # `ParallelConfig.moe_dispatcher`
    # CP's ring exchange starts before the attention chunk it hides behind: one hardware queue
    # (CUDA_DEVICE_MAX_CONNECTIONS=1) or Blackwell; off, it runs exposed (`estimate.cp_ring_hides`)
    cp_ring_hides: bool = True


@dataclass(frozen=True)
class Phases:
    """Seconds by class ('gemm', 'attention', 'memory_bound', 'tp', 'cp', 'ep') of one pass."""

    parts: dict[str, float] = field(default_factory=dict)

    @property
    def total(self) -> float:
        return sum(self.parts.values())

    def scaled(self, factor: float) -> Phases:
        return Phases({k: v * factor for k, v in self.parts.items()})


@dataclass(frozen=True)
class LayerCost:
    """One layer, one micro-batch, one rank: forward, backward, and forward work redone in backward; and the
    host's time to issue its forward and its backward (recompute included) in eager megatron-core, which the
    stage's micro-batch compares with its GPU time (`costmodel.estimate`: the host runs ahead)."""

    fwd: Phases
    bwd: Phases
    recompute: Phases
    host_fwd_s: float = 0.0
    host_bwd_s: float = 0.0
    # a MoE layer's block alone (router, dispatcher, experts), forward and backward GPU seconds; 0 for other layers
    moe_gpu_fwd_s: float = 0.0
    moe_gpu_bwd_s: float = 0.0

    @property
    def total(self) -> float:
        return self.fwd.total + self.bwd.total + self.recompute.total

    def scaled(self, factor: float) -> LayerCost:
        """GPU times scaled by `factor` (a calibration); the host's issue times stay."""
        return replace(
            self, fwd=self.fwd.scaled(factor), bwd=self.bwd.scaled(factor), recompute=self.recompute.scaled(factor)
        )

    def pass_parts(self) -> tuple[dict[str, float], dict[str, float]]:
        """(forward, backward) seconds by class as a stage adds them up: the forward work redone in backward goes
        into the backward under "recompute" (its computation) or its own class (its communication)."""
        fwd: dict[str, float] = {}
        bwd: dict[str, float] = {}
        merge_parts(fwd, self.fwd.parts)
        merge_parts(bwd, self.bwd.parts)
        merge_parts(bwd, self.recompute.parts, rename=_compute_to_recompute)
        return fwd, bwd


def _compute_to_recompute(key: str) -> str:
    return "recompute" if key in CLASSES else key


def merge_parts(target: dict[str, float], parts: dict[str, float], factor: float = 1.0, rename=None) -> None:
    """Add seconds by class `parts` (x `factor`, keys through `rename`) into `target`."""
    for k, v in parts.items():
        key = rename(k) if rename else k
        target[key] = target.get(key, 0.0) + v * factor


def _add(parts: dict[str, float], key: str, value: float) -> None:
    if value:
        parts[key] = parts.get(key, 0.0) + value


def gemm_shapes(model: ModelSpec, layer_index: int, ctx: LayerContext) -> dict[str, tuple[float, float, float, int]]:
    """op -> (tokens m, out n, in k, groups) of each GEMM of the layer on one rank (forward pass)."""
    h, tp, x = model.hidden_size, ctx.tp, (ctx.tp if ctx.sequence_parallel else 1)
    t = ctx.tokens
    a = model.num_attention_heads
    gate = 2 if model.gated_linear_unit else 1
    shapes: dict[str, tuple[float, float, float, int]] = {}
    # gated DeltaNet's / Mamba-2's in_proj and out_proj take the attention projections' roles ("qkv", "proj")
    widths = model.token_mixer_widths(layer_index)
    if model.multi_latent_attention:
        q_head = model.qk_head_dim + model.qk_pos_emb_head_dim
        if model.q_lora_rank is None:
            shapes["q_proj"] = (t, a * q_head / tp, h, 1)
        else:
            shapes["q_down"] = (t / x, model.q_lora_rank, h, 1)
            shapes["q_up"] = (t, a * q_head / tp, model.q_lora_rank, 1)
        shapes["kv_down"] = (t / x, model.kv_lora_rank + model.qk_pos_emb_head_dim, h, 1)
        shapes["kv_up"] = (t, a * (model.qk_head_dim + model.v_head_dim) / tp, model.kv_lora_rank, 1)
    elif widths:
        shapes["qkv"] = (t, widths[0] / tp, h, 1)
    if widths:
        shapes["proj"] = (t, h, widths[1] / tp, 1)
    if not model.has_mlp(layer_index):
        return shapes
    if model.is_moe_layer(layer_index):
        shapes["router"] = (t / x, model.num_moe_experts, h, 1)
        groups = max(1, model.num_moe_experts // ctx.ep)
        routed = model.routed_tokens(t, tp, ctx.etp, ctx.expert_load)
        f = model.moe_ffn_hidden_size / ctx.etp
        shapes["experts_fc1"] = (routed / groups, gate * f, h, groups)
        shapes["experts_fc2"] = (routed / groups, h, f, groups)
        s = model.moe_shared_expert_intermediate_size
        if s:
            shapes["shared_fc1"] = (t, gate * s / tp, h, 1)
            shapes["shared_fc2"] = (t, h, s / tp, 1)
    else:
        f = model.ffn_hidden_size
        shapes["fc1"] = (t, gate * f / tp, h, 1)
        shapes["fc2"] = (t, h, f / tp, 1)
    return shapes


def gemm_phase_time(op: str, shape: tuple[float, float, float, int], phase: str, ctx: LayerContext, sm=1.0) -> float:
    m, n, k, groups = shape
    precision = "bf16" if op == "router" else ctx.precision
    gpu = ctx.cluster.gpu
    factor = d.FP8_GEMM_TIME_FACTOR[ctx.fp8_recipe] if precision == "fp8" else 1.0
    if phase == "fwd":
        return factor * gemm_time_s(m, n, k, gpu, precision, groups, op, "fwd", ctx.calibration, sm)
    if phase == "dgrad":
        return factor * gemm_time_s(m, k, n, gpu, precision, groups, op, "dgrad", ctx.calibration, sm)
    wgrad = gemm_time_s(k, n, m, gpu, precision, groups, op, "wgrad", ctx.calibration, sm, ctx.main_grad_bytes)
    return factor * wgrad


def _attention_times(model: ModelSpec, ctx: LayerContext, windowed: bool = False) -> tuple[float, float, float]:
    """(fwd, bwd, memory-bound extra fwd) seconds of core attention for one micro-batch.

    A sliding-window layer shorter than its sequence (flash path) is one causal-masked kernel whose queries each
    see about w keys, as a causal kernel over 2w tokens does on average: its efficiency is the causal one at 2w
    (an assumption: no sliding-window kernel has been measured here). Megatron's unfused path masks the full
    s x s scores (get_sliding_window_causal_mask), so its time does not change."""
    gpu = ctx.cluster.gpu
    fwd_flops = attention_flops_per_token(model, ctx.seq_length, "causal", windowed) * ctx.tokens / ctx.tp
    if model.multi_latent_attention:
        d_qk, d_v = model.qk_head_dim + model.qk_pos_emb_head_dim, model.v_head_dim
    else:
        d_qk = d_v = model.kv_channels
    causal = model.causal_attention
    if ctx.flash_attention and windowed and model.window_size < ctx.seq_length:
        dropout = model.attention_dropout > 0
        # bidirectional windows (a vision tower's) are varlen sequences of w tokens each, unmasked
        seq_eff = 2.0 * model.window_size if causal else float(model.window_size)
        fwd = flash_attention_time_s("fwd", fwd_flops, seq_eff, d_qk, causal, gpu, dropout, ctx.calibration)
        bwd = flash_attention_time_s("bwd", 2 * fwd_flops, seq_eff, d_qk, causal, gpu, dropout, ctx.calibration)
        return fwd, bwd, 0.0
    if ctx.flash_attention:
        # Ring CP (load-balanced, 2cp chunks): of the cp steps, the local one is a causal block of
        # s/cp tokens and the others are full (unmasked) blocks against s/cp keys.
        cp = ctx.cp
        seq_eff = ctx.seq_length / cp
        dropout = model.attention_dropout > 0
        fwd = bwd = 0.0
        for masked, share in ((causal, 1.0 / cp), (False, (cp - 1) / cp)):
            if share <= 0:
                continue
            f = fwd_flops * share
            fwd += flash_attention_time_s("fwd", f, seq_eff, d_qk, masked, gpu, dropout, ctx.calibration)
            bwd += flash_attention_time_s("bwd", 2 * f, seq_eff, d_qk, masked, gpu, dropout, ctx.calibration)
        return fwd, bwd, 0.0
    # Unfused attention (Megatron's 2021 path): batched GEMMs over the full s x s square, a fused
    # scale-mask-softmax (read + write the scores, 4 bytes/element forward, 6 backward) and,
    # with attention dropout, a dropout on the probabilities (5 bytes/element each way).
    s = ctx.seq_length
    heads = model.num_attention_heads / ctx.tp
    sequences = ctx.tokens * ctx.cp / s
    groups = max(1, round(heads * sequences))
    qk = gemm_time_s(s, s, d_qk, gpu, "bf16", groups, "core_attention", "fwd", None)
    pv = gemm_time_s(s, d_v, s, gpu, "bf16", groups, "core_attention", "fwd", None)
    elements = heads * sequences * s * s
    per_elem_fwd, per_elem_bwd = 4.0, 6.0
    if model.attention_dropout > 0:
        per_elem_fwd += 5.0
        per_elem_bwd += 5.0
    soft_fwd = memory_bound_time_s(per_elem_fwd * elements, gpu, 2)
    soft_bwd = memory_bound_time_s(per_elem_bwd * elements, gpu, 2)
    return qk + pv + soft_fwd, 2 * (qk + pv) + soft_bwd, 0.0


def _scan_times(scan, model: ModelSpec, ctx: LayerContext) -> tuple[float, float, float]:
    """(fwd, bwd, 0) seconds of a chunked scan (`scan`: the module `theory.gated_delta_net` or `theory.mamba`) for
    one micro-batch: a roofline of its FLOPs at the generic bf16 GEMM efficiency and its bytes at the generic HBM
    efficiency, plus its forward kernels' launch overhead; backward twice the forward. An assumption, not a
    measurement: neither flash-linear-attention nor mamba_ssm is installed on the GPU machine. Under context
    parallelism megatron-core moves the sequence onto heads first (a2a), so a rank's share of the work is the same."""
    gpu = ctx.cluster.gpu
    tokens_heads = ctx.tokens / ctx.tp
    flops = scan.scan_flops_per_token(model) * tokens_heads
    nbytes = scan.scan_bytes_per_token(model, E_BF16) * tokens_heads
    compute = flops / (gpu.peak_tflops("bf16") * 1e12 * d.GEMM_EFFICIENCY["bf16"])
    fwd = max(compute, memory_bound_time_s(nbytes, gpu)) + scan.FORWARD_KERNELS * d.KERNEL_OVERHEAD_S
    return fwd, 2 * fwd, 0.0


def _token_mixer_times(model: ModelSpec, layer_index: int, ctx: LayerContext) -> tuple[float, float, float]:
    mixer = model.token_mixer(layer_index)
    if mixer in SCAN_MIXERS:
        return _scan_times(SCAN_MIXERS[mixer], model, ctx)
    if mixer == "attention":
        return _attention_times(model, ctx, model.is_window_layer(layer_index))
    return 0.0, 0.0, 0.0


MemoryBoundWork = tuple[float, float, float, float | None]


def _memory_bound_bytes(model: ModelSpec, layer_index: int, ctx: LayerContext) -> dict[str, MemoryBoundWork]:
    """Memory-bound work of one layer: name -> (fwd bytes, bwd bytes, kernels per pass, fraction of HBM
    bandwidth those kernels reach, None for `defaults.HBM_EFFICIENCY`)."""
    e = E_BF16
    h, tp = model.hidden_size, ctx.tp
    x = tp if ctx.sequence_parallel else 1
    t = ctx.tokens
    tt = t / x
    out: dict[str, MemoryBoundWork] = {}
    mixer = model.token_mixer(layer_index)
    # one input norm and one residual add per block: token mixer and MLP (a hybrid model's layer has one of them)
    blocks = model.residual_blocks(layer_index)
    out["norm"] = (blocks * 2 * e * h * tt, blocks * 3 * e * h * tt, blocks, None)
    mask = h * tt if model.hidden_dropout > 0 else 0.0
    out["residual"] = (blocks * (3 * e * h * tt + mask), blocks * (3 * e * h * tt + mask), blocks, None)
    if mixer == "gdn":
        out.update(_gated_delta_net_memory_bound(model, t / tp))
    elif mixer == "mamba":
        out.update(_mamba_memory_bound(model, t / tp))
    if mixer == "attention":
        out.update(_attention_memory_bound(model, ctx))
    if model.has_mlp(layer_index):
        out.update(_mlp_memory_bound(model, layer_index, ctx))
    return out


def _attention_memory_bound(model: ModelSpec, ctx: LayerContext) -> dict[str, MemoryBoundWork]:
    """Self-attention's elementwise work: rope, q / k norms and the copies around the fused qkv output."""
    e = E_BF16
    tp = ctx.tp
    t = ctx.tokens
    tt = t / (tp if ctx.sequence_parallel else 1)
    a_l = model.num_attention_heads / tp
    g_l = model.query_groups_per_rank(tp)
    dh = model.kv_channels
    out: dict[str, MemoryBoundWork] = {}
    if model.position_embedding_type == "rope":
        if model.multi_latent_attention:
            r = model.qk_pos_emb_head_dim
            rope = 2 * e * (a_l * r + r) * t
        else:
            rope = 2 * e * (a_l + g_l) * dh * t
        out["rope"] = (rope, rope, 1, d.ROPE_HBM_EFFICIENCY)
    if model.qk_layernorm:
        qkn = 2 * e * (a_l + g_l) * dh * t
        out["qk_norm"] = (qkn, 1.5 * qkn, 2, None)
        if not model.multi_latent_attention:
            # q, k and v are copied out of the fused qkv output before the q/k norms (read + write)
            out["qkv_split_copy"] = (2 * e * (a_l + 2 * g_l) * dh * t, 0.0, 3, d.QKV_SPLIT_COPY_HBM_EFFICIENCY)
    if model.multi_latent_attention:
        lat = 2 * e * ((model.q_lora_rank or 0) + model.kv_lora_rank) * tt
        out["latent_norm"] = (lat, 1.5 * lat, 2, None)
    else:
        out["qkv_grad_concat"] = (0.0, 2 * e * (a_l + 2 * g_l) * dh * t, 1, None)
    return out


def _mlp_memory_bound(model: ModelSpec, layer_index: int, ctx: LayerContext) -> dict[str, MemoryBoundWork]:
    """The MLP / MoE block's elementwise work: the activation and, in a MoE block, the router and the dispatcher."""
    e = E_BF16
    tp = ctx.tp
    t = ctx.tokens
    tt = t / (tp if ctx.sequence_parallel else 1)
    out: dict[str, MemoryBoundWork] = {}
    gated = model.gated_linear_unit
    act_fwd, act_bwd = (3 * e, 5 * e) if gated else (2 * e, 3 * e)
    dense_fwd, dense_bwd = act_fwd, act_bwd
    act_bwd_eff = d.FUSED_ACTIVATION_BWD_HBM_EFFICIENCY if gated and ctx.fused_bias_activation else None
    dense_bwd_eff = act_bwd_eff
    if gated and not ctx.fused_bias_activation:
        # Unfused GLU of dense MLPs / shared experts (torch ops; TE grouped experts fuse it):
        # silu(a) (read a, write) and * b (read 2, write 1) forward; backward two products
        # (3 + 3), the silu gradient (3) and the concatenation of both halves' gradients (4):
        # 5 and 13 elements per f-element instead of 3 and 5.
        dense_fwd, dense_bwd = 5 * e, 13 * e
    if model.is_moe_layer(layer_index):
        experts = model.num_moe_experts
        routed = model.routed_tokens(t, tp, ctx.etp, ctx.expert_load)
        out["router"] = (10.0 * experts * tt, 10.0 * experts * tt, 4, None)
        out.update(moe_dispatch_work(model, ctx, tt, routed))
        out["activation"] = (act_fwd * model.moe_ffn_hidden_size / ctx.etp * routed, 0.0, 1, None)
        out["activation_bwd"] = (0.0, act_bwd * model.moe_ffn_hidden_size / ctx.etp * routed, 1, act_bwd_eff)
        out.update(_glu_clamp_work(model, model.moe_ffn_hidden_size / ctx.etp * routed))
        s = model.moe_shared_expert_intermediate_size
        if s:
            out["shared_activation"] = (dense_fwd * s / tp * t, 0.0, 1, None)
            out["shared_activation_bwd"] = (0.0, dense_bwd * s / tp * t, 1, dense_bwd_eff)
    else:
        f = model.ffn_hidden_size / tp
        out["activation"] = (dense_fwd * f * t, 0.0, 1, None)
        out["activation_bwd"] = (0.0, dense_bwd * f * t, 1, dense_bwd_eff)
        out.update(_glu_clamp_work(model, f * t))
    return out


GLU_CLAMP_WORK = ("activation_clamp", "activation_clamp_cat")


def _glu_clamp_work(model: ModelSpec, elements: float) -> dict[str, MemoryBoundWork]:
    """A clamped GLU (gpt-oss: activation_func_clamp_value) over `elements` = rows x ffn: megatron-core splits the fc1
    output, clamps each half with torch (x_glu from above, x_linear both ways) and concatenates them again before
    its fused kernel (megatron/core/fusions/fused_bias_geglu.py weighted_bias_quick_geglu_impl, Megatron-LM d98e8a6).
    Forward: two clamps (read + write a half: 8 bytes per element) and the concatenation (8); backward: three
    comparisons (3 bytes each), a logical and (3) and two masked selects (5 each) = 22, and the gradients'
    concatenation (8). The clamps and their backward run on the halves' strided views at
    `defaults.GLU_CLAMP_HBM_EFFICIENCY`, the concatenations at the generic rate."""
    if model.activation_clamp_value is None or not model.gated_linear_unit:
        return {}
    return {
        "activation_clamp": (8.0 * elements, 22.0 * elements, 3, d.GLU_CLAMP_HBM_EFFICIENCY),
        "activation_clamp_cat": (8.0 * elements, 8.0 * elements, 1, None),
    }


def _mamba_memory_bound(model: ModelSpec, tokens_heads: float) -> dict[str, MemoryBoundWork]:
    """A Mamba-2 mixer's elementwise work besides its scan, for `tokens_heads` = tokens / tp (megatron-core MambaMixer
    through mamba_split_conv1d_scan_combined): splitting the in_proj output (read + write; backward the gradients'
    concatenation), the depthwise conv1d with its SiLU over x, B, C, and the gated RMSNorm (read y and z, write).
    Bytes at the generic HBM efficiency, as the other norms."""
    e = E_BF16
    split = 2 * e * model.mamba_in_proj_size * tokens_heads
    conv = 2 * e * model.mamba_conv_dim * tokens_heads
    norm = 3 * e * model.mamba_inner_size * tokens_heads
    return {
        "mamba_split_copy": (split, split, 2, None),
        "mamba_conv": (conv, 1.5 * conv, 2, None),
        "mamba_gated_norm": (norm, 5.0 / 3.0 * norm, 2, None),
    }


def _gated_delta_net_memory_bound(model: ModelSpec, tokens_heads: float) -> dict[str, MemoryBoundWork]:
    """A gated-DeltaNet mixer's elementwise work besides its scan, for `tokens_heads` = tokens / tp (megatron-core
    ssm/gated_delta_net.py forward): copying q/k/v, z, beta, alpha out of the in_proj output (read + write) and, in
    backward, concatenating their gradients; the depthwise conv1d with its SiLU (read + write; backward reads the
    gradient and the input and writes the input gradient); the l2 norms of q and k; repeating q and k to the value
    heads; the gated RMSNorm (read o and z, write). Bytes at the generic HBM efficiency, as the other norms."""
    e = E_BF16
    nv, dk = model.linear_num_value_heads, model.linear_key_head_dim
    split = 2 * e * model.gdn_in_proj_size * tokens_heads
    conv = 2 * e * model.gdn_conv_dim * tokens_heads
    l2 = 2 * e * 2 * model.linear_qk_dim * tokens_heads
    repeat = e * (2 * model.linear_qk_dim + 2 * nv * dk) * tokens_heads
    norm = 3 * e * model.linear_v_dim * tokens_heads
    return {
        "gdn_split_copy": (split, split, 4, None),
        "gdn_conv": (conv, 1.5 * conv, 2, None),
        "gdn_l2norm": (l2, 1.5 * l2, 2, None),
        "gdn_repeat": (repeat, repeat, 2, None),
        "gdn_gated_norm": (norm, 5.0 / 3.0 * norm, 2, None),
    }


MOE_DISPATCH_WORK = (
    "moe_allgather_casts",
    "moe_permute",
    "moe_permute_atomic",
    "moe_sort_chunks",
    "moe_unpermute",
    "moe_unpermute_atomic",
    "moe_routing_map",
)


def moe_dispatch_work(model: ModelSpec, ctx: LayerContext, tokens: float, routed: float) -> dict[str, MemoryBoundWork]:
    """The alltoall dispatcher's token movement on one rank (megatron-core token_dispatcher.py / moe_utils.py) for
    T = `tokens` local rows of h bf16 elements, P = T x top-k permuted rows and R = `routed` rows after the
    all-to-all (R = P without tensor parallelism), by the bytes each step moves and the rate measured for its kernels
    (`benchmarks/moe_permute.py` on H200, `defaults.MOE_*`):
    - unfused (megatron-core's default, `ctx.moe_permute_fusion` off): permute = `index_select` gather
      (2 accesses per permuted element) forward, an atomic `index_add_` backward; unpermute = atomic `scatter_add_`
      forward, a gather backward; the permute walks the T x E routing map forward (`masked_select`);
    - TE's fused kernels (`--moe-permute-fusion`): permute and unpermute each read one side and write the other
      (P + T rows) each way; the permute builds its row-id map from the routing map forward;
    - sort by local expert (only with more than one local expert): a split + `torch.cat` (or TE's fused sort) of the
      R rows each way."""
    e, h = E_BF16, model.hidden_size
    permuted = e * h * tokens * model.moe_router_topk
    out: dict[str, MemoryBoundWork] = {}
    group = ctx.ep * ctx.etp
    if ctx.moe_dispatcher == "allgather" and group > 1:
        # the allgather dispatcher permutes the gathered rows straight to its local experts (no sort) and its
        # unpermute restores the gathered shape, cast to fp32 for the reduce-scatter and back (`allgather_dispatch_s`)
        tokens, permuted = group * tokens, e * h * routed
        gathered = e * h * tokens
        casts = 3 * gathered + 3 * gathered / group  # bf16 -> fp32 of the gathered rows, fp32 -> bf16 of the local
        out["moe_allgather_casts"] = (casts, casts, 2, None)
    elif model.num_moe_experts // max(1, ctx.ep) > 1:
        out["moe_sort_chunks"] = (2 * e * h * routed, 2 * e * h * routed, 1, None)
    map_entries = tokens * model.num_moe_experts  # one byte each (bool)
    if not ctx.moe_permute_fusion:
        out["moe_permute"] = (2 * permuted, 0.0, 1, None)
        out["moe_permute_atomic"] = (0.0, 2 * permuted, 2, d.MOE_INDEX_ADD_HBM_EFFICIENCY)
        out["moe_unpermute"] = (0.0, 2 * permuted, 1, None)
        out["moe_unpermute_atomic"] = (2 * permuted, 0.0, 2, d.MOE_SCATTER_ADD_HBM_EFFICIENCY)
        out["moe_routing_map"] = (map_entries, 0.0, 3, d.MOE_ROUTING_MAP_UNFUSED_HBM_EFFICIENCY)
    else:
        both = permuted + e * h * tokens
        out["moe_permute"] = (both, both, 1, None)
        out["moe_unpermute"] = (both, both, 1, None)
        out["moe_routing_map"] = (map_entries, 0.0, 2, d.MOE_ROUTING_MAP_FUSED_HBM_EFFICIENCY)
    return out


def moe_token_movement_s(model: ModelSpec, ctx: LayerContext) -> tuple[float, float]:
    """(forward, backward) seconds one MoE layer's dispatcher moves tokens between ranks, exposed: the allgather
    dispatcher's gathers and reduce-scatters (`allgather_dispatch_s`); else the dispatch + combine all-to-all of the
    rank's own top-k rows, before any expert-TP gather (`ModelSpec.dispatched_tokens`, `collectives.dispatch_time_s`,
    deduplicated across nodes by the flex backends) and, over expert-TP, the gather / reduce-scatter of the routed
    tokens (`expert_tp_comm_s`), the same both passes."""
    if ctx.moe_dispatcher == "allgather":
        return allgather_dispatch_s(model, ctx)
    a2a = 0.0
    if ctx.ep > 1:
        dispatched = model.dispatched_tokens(ctx.tokens, ctx.tp, ctx.expert_load)
        a2a = dispatch_time_s(
            E_BF16 * dispatched * model.hidden_size, ctx.ep, ctx.cluster, ctx.etp, model.num_moe_experts,
            model.moe_router_topk, ctx.moe_dispatcher in FLEX_DISPATCHER_BACKENDS, model.moe_router_num_groups,
            model.moe_router_group_topk,
        )  # fmt: skip
    moved = 2 * a2a + expert_tp_comm_s(model, ctx)
    return moved, moved


def allgather_dispatch_s(model: ModelSpec, ctx: LayerContext) -> tuple[float, float]:
    """(forward, backward) seconds of megatron-core's allgather dispatcher (Megatron-LM's default
    --moe-token-dispatcher-type) in one MoE layer, exposed: its gathers and reduce-scatters over the etp x ep group
    (`theory.comm.allgather_dispatch_bytes`), the backward's two reduce-scatters (hidden, probabilities) apart. Every
    token moves, whatever the top-k or the load; with a group of one nothing moves."""
    group = ctx.ep * ctx.etp
    if group <= 1:
        return 0.0, 0.0
    hidden, hidden_fp32, probs, routing_map = allgather_dispatch_bytes(model, ctx.tokens / ctx.tp, group)

    def coll(kind: str, nbytes: float) -> float:
        return collective_time_s(kind, group, nbytes, ctx.cluster, 1)

    fwd = coll("all_gather", hidden + probs + routing_map) + coll("reduce_scatter", hidden_fp32)
    bwd = coll("reduce_scatter", hidden) + coll("reduce_scatter", probs) + coll("all_gather", hidden_fp32)
    return fwd, bwd


def _fp8_cast_bytes(
    shapes: dict[str, tuple[float, float, float, int]], recipe: str, training: bool
) -> tuple[float, float, int]:
    """fp8 casts of GEMM inputs (fwd) and output gradients (bwd): (fwd bytes, bwd bytes, kernels per pass).
    Without autograd (forward-only passes run under no_grad) TE writes no transpose of the input (its
    quantizers ask for column-wise data only when grad is enabled): 1 byte per element less forward."""
    per_element = d.FP8_CAST_BYTES_PER_ELEMENT[recipe]
    fwd_per_element = per_element if training else per_element - d.FP8_TRANSPOSE_BYTES_PER_ELEMENT
    fwd = bwd = 0.0
    count = 0
    for op, (m, n, k, groups) in shapes.items():
        if op == "router":
            continue
        fwd += fwd_per_element * m * k * groups
        bwd += per_element * m * n * groups
        count += d.FP8_CAST_KERNELS[recipe]
    return fwd, bwd, count


def _overlapped_pair(g: float, g_chunked: float, c: float, method: str, tp: int) -> float:
    """Time of a GEMM (g alone) with collective c run under it by TE userbuffers."""
    if method == "ring_exchange":
        return max(g_chunked, c) + min(g_chunked, c) / max(tp, 1)
    if method == "pipeline":
        return max(g_chunked, c) + min(g_chunked, c) / 4
    return max(g_chunked, c)


def expert_tp_comm_s(model: ModelSpec, ctx: LayerContext) -> float:
    """One pass of a MoE layer's routed tokens over the expert-tensor-parallel group (etp > 1), exposed: megatron-core's
    alltoall dispatcher all-gathers the permuted tokens of the etp ranks after the all-to-all (`dispatch_postprocess`,
    `gather_from_sequence_parallel_region` over `pg_collection.expt_tp`) and reduce-scatters the expert outputs
    before the combine (`combine_preprocess`), megatron/core/transformer/moe/token_dispatcher.py; backward, each turns
    into the other. Gathered rows on a rank: R = T*k*etp/tp (T the micro-batch's tokens), 2*R*h bytes. With etp = 1
    the experts take the sequence-parallel shard as it is: nothing moves. On 4x H200 (Qwen3-235B-A22B, tp = etp = 2,
    no EP, 32k tokens, top-8) a step ran 16 such gathers and 16 reduce-scatters of 2 GiB, 4.3 and 4.0 ms on average
    (benchmarks/results/plan_regret_h200_x4_r4/etp_trace, tests/costmodel/test_expert_tp_comm.py)."""
    if ctx.etp <= 1:
        return 0.0
    rows = model.routed_tokens(ctx.tokens, ctx.tp, ctx.etp, ctx.expert_load)
    message = E_BF16 * rows * model.hidden_size
    return collective_time_s("all_gather", ctx.etp, message, ctx.cluster, 1) + collective_time_s(
        "reduce_scatter", ctx.etp, message, ctx.cluster, 1
    )


def layer_cost(model: ModelSpec, layer_index: int, ctx: LayerContext) -> LayerCost:
    """Time of decoder layer `layer_index` for one micro-batch on one rank. It depends on the layer's kind only
    (`ModelSpec.layer_kind`), so layers of one kind share one computation across the layouts a search tries (the
    result is read, never changed, by its callers)."""
    return _kind_cost(model, model.layer_kind(layer_index), ctx)


@lru_cache(maxsize=16384)
def _kind_cost(model: ModelSpec, kind: tuple[bool, ...], ctx: LayerContext) -> LayerCost:
    return _layer_cost(model, next(i for i in range(model.num_layers) if model.layer_kind(i) == kind), ctx)


def _layer_cost(model: ModelSpec, layer_index: int, ctx: LayerContext) -> LayerCost:
    gpu, cluster, tp = ctx.cluster.gpu, ctx.cluster, ctx.tp
    is_moe = model.is_moe_layer(layer_index)
    shapes = gemm_shapes(model, layer_index, ctx)
    fwd: dict[str, float] = {}
    bwd: dict[str, float] = {}
    rec: dict[str, float] = {}
    gemm = {op: {ph: gemm_phase_time(op, sh, ph, ctx) for ph in ("fwd", "dgrad", "wgrad")} for op, sh in shapes.items()}
    for times in gemm.values():
        _add(fwd, "gemm", times["fwd"])
        if ctx.training:
            _add(bwd, "gemm", times["dgrad"] + times["wgrad"])
    attn_fwd, attn_bwd, _ = _token_mixer_times(model, layer_index, ctx)
    _add(fwd, "attention", attn_fwd)
    if ctx.training:
        _add(bwd, "attention", attn_bwd)
    mem = _memory_bound_bytes(model, layer_index, ctx)
    mem_fwd = {name: memory_bound_time_s(fb, gpu, kn if fb else 0, eff) for name, (fb, _, kn, eff) in mem.items()}
    mem_bwd = {name: memory_bound_time_s(bb, gpu, kn if bb else 0, eff) for name, (_, bb, kn, eff) in mem.items()}
    if "qk_norm" in mem and not model.multi_latent_attention:
        mem_bwd["qk_norm"] += 2 * d.QK_NORM_BWD_FINALIZE_S
    if ctx.precision == "fp8":
        cf, cb, count = _fp8_cast_bytes(shapes, ctx.fp8_recipe, ctx.training)
        mem_fwd["fp8_cast"] = memory_bound_time_s(cf, gpu, count)
        mem_bwd["fp8_cast"] = memory_bound_time_s(cb, gpu, count)
    _add(fwd, "memory_bound", sum(mem_fwd.values()))
    if ctx.training:
        _add(bwd, "memory_bound", sum(mem_bwd.values()))

    # ---- tensor parallel communication ----
    tp_fwd = tp_bwd = 0.0
    if tp > 1:
        msg = E_BF16 * ctx.tokens * model.hidden_size
        attn_in = [op for op in ("qkv", "q_proj", "q_up", "kv_up") if op in gemm]
        mixed = "proj" in gemm  # a token mixer's TP pattern (a hybrid model's MLP / MoE layer has none)
        if ctx.sequence_parallel:
            ag = collective_time_s("all_gather", tp, msg, cluster, 1)
            rs = collective_time_s("reduce_scatter", tp, msg, cluster, 1)
            # the MLP's TE linears gather / scatter the hidden states; a MoE block's only when it has shared experts
            # (routed experts move their tokens in the dispatcher: `expert_tp_comm_s`)
            mlp_in = next((op for op in ("fc1", "shared_fc1") if op in gemm), None)
            mlp_out = next((op for op in ("fc2", "shared_fc2") if op in gemm), None)
            ub = ctx.tp_comm_overlap
            # userbuffers move the same tensors without NCCL (own curves, `collectives.userbuffers_time_s`)
            ag_ring = userbuffers_time_s("ring_exchange", "all_gather", tp, msg)
            rs_pipe = userbuffers_time_s("pipeline", "reduce_scatter", tp, msg)
            # forward: AG -> attention input GEMM(s), RS after proj; AG -> fc1, RS after fc2
            pairs_fwd = []
            if mixed:
                pairs_fwd += [
                    ("qkv" if "qkv" in gemm else None, "fwd", ag, "ring_exchange", ag_ring),
                    ("proj", "fwd", rs, "pipeline", rs_pipe),
                ]
            if mlp_in:
                pairs_fwd += [(mlp_in, "fwd", ag, "ring_exchange", ag_ring), (mlp_out, "fwd", rs, "pipeline", rs_pipe)]
            for op, ph, c, method, c_ub in pairs_fwd:
                tp_fwd += _pair_exposed(gemm, shapes, op, ph, c, method, ctx, c_ub) if (ub and op) else c
            if ctx.training:
                # row-parallel output-gradient gathers: exposed unless userbuffers ring-exchange
                for op in ("proj",) * mixed + ((mlp_out,) if mlp_in else ()):
                    if ub and op:
                        tp_bwd += _pair_exposed(gemm, shapes, op, "dgrad", ag, "ring_exchange", ctx, ag_ring)
                    else:
                        tp_bwd += ag
                # column-parallel input re-gather (under dgrad) and dgrad reduce-scatter (under wgrad)
                for ops in (attn_in,) * mixed + (([mlp_in],) if mlp_in else ()):
                    if not ops:
                        tp_bwd += ag + rs  # no TE linear to hide behind
                        continue
                    g_d = sum(gemm[o]["dgrad"] for o in ops)
                    g_w = sum(gemm[o]["wgrad"] for o in ops)
                    base = max(0.0, ag - g_d) + max(0.0, rs - g_w)
                    base += hidden_collective_cost_s("all_gather", tp, cluster, 1, min(ag, g_d))
                    base += hidden_collective_cost_s("reduce_scatter", tp, cluster, 1, min(rs, g_w))
                    if ub and len(ops) == 1 and ops[0] in ("qkv", "fc1"):
                        slow = _sm_slowdown(gpu, "bulk")
                        ag_bulk = userbuffers_time_s("bulk", "all_gather", tp, msg)
                        rs_bulk = userbuffers_time_s("bulk", "reduce_scatter", tp, msg)
                        ub_time = max(0.0, max(g_d * slow, ag_bulk) - g_d) + max(0.0, max(g_w * slow, rs_bulk) - g_w)
                        base = min(base, ub_time)
                    tp_bwd += base
        else:
            ar = collective_time_s("all_reduce", tp, msg, cluster, 1)
            tp_fwd += (mixed + model.has_mlp(layer_index)) * ar
            if ctx.training:
                w_attn = sum(gemm[o]["wgrad"] for o in attn_in)
                w_mlp = gemm["fc1"]["wgrad"] if "fc1" in gemm else 0.0
                tp_bwd += max(0.0, ar - w_attn) if mixed else 0.0
                if model.has_mlp(layer_index):
                    tp_bwd += max(0.0, ar - w_mlp) if "fc1" in gemm else ar
                hidden = min(ar, w_attn) * mixed + (min(ar, w_mlp) if "fc1" in gemm else 0.0)
                tp_bwd += hidden_collective_cost_s("all_reduce", tp, cluster, 1, hidden)
    if model.gathers_qkv_over_tp(layer_index, tp):
        # fewer K / V heads than TP ranks: megatron-core all-gathers the qkv output over TP before splitting it
        # (SelfAttention.get_query_key_value_tensors, all_gather_last_dim_from_tensor_parallel_region); its backward
        # is a reduce-scatter. Exposed: nothing runs beside them.
        qkv_all = E_BF16 * ctx.tokens * model.qkv_projection_size
        tp_fwd += collective_time_s("all_gather", tp, qkv_all, cluster, 1)
        tp_bwd += collective_time_s("reduce_scatter", tp, qkv_all, cluster, 1)
    _add(fwd, "tp", tp_fwd)
    if ctx.training:
        _add(bwd, "tp", tp_bwd)

    # ---- context parallel communication ----
    cp = ctx.cp
    mixer = model.token_mixer(layer_index)
    if cp > 1 and mixer in SCAN_MIXERS:
        # a scan mixer under CP: the in_proj output goes from sequence to head shards and the output projection's
        # input back, one all-to-all each way per pass (Megatron-LM d98e8a6 ssm/gated_delta_net/common.py
        # a2a_cp_to_hp / a2a_hp_to_cp; megatron-core ssm/mamba_context_parallel.py cp2hp / hp2cp)
        moved = E_BF16 * ctx.tokens * (shapes["qkv"][1] + shapes["proj"][2])
        t_a2a = collective_time_s("all_to_all", cp, moved * cp, cluster, tp)
        _add(fwd, "cp", t_a2a)
        if ctx.training:
            _add(bwd, "cp", t_a2a)
    elif cp > 1 and mixer == "attention":
        kv_local = E_BF16 * ctx.tokens * 2 * model.query_groups_per_rank(tp) * model.kv_channels
        if ctx.cp_comm_type == "p2p":
            step = collective_time_s("send_recv", 2, kv_local, cluster, tp)
            for phase, sends, attn in (
                ((fwd, 1, attn_fwd), (bwd, 2, attn_bwd)) if ctx.training else ((fwd, 1, attn_fwd),)
            ):
                exposed = max(0.0, sends * step - (attn / cp if ctx.cp_ring_hides else 0.0))
                hidden = hidden_collective_cost_s("send_recv", cp, cluster, tp, sends * step - exposed)
                _add(phase, "cp", (cp - 1) * (exposed + hidden))
        elif ctx.cp_comm_type == "a2a":
            qkv_local = E_BF16 * ctx.tokens * model.qkv_projection_size / tp
            o_local = E_BF16 * ctx.tokens * model.attention_output_size / tp
            t = collective_time_s("all_to_all", cp, qkv_local * cp, cluster, tp) + collective_time_s(
                "all_to_all", cp, o_local * cp, cluster, tp
            )
            _add(fwd, "cp", t)
            if ctx.training:
                _add(bwd, "cp", t)
        else:
            _add(fwd, "cp", collective_time_s("all_gather", cp, kv_local * cp, cluster, tp))
            if ctx.training:
                _add(bwd, "cp", collective_time_s("reduce_scatter", cp, kv_local * cp, cluster, tp))

    # ---- expert parallel communication ----
    moved_fwd, moved_bwd = moe_token_movement_s(model, ctx) if is_moe else (0.0, 0.0)
    if moved_fwd:
        _add(fwd, "ep", moved_fwd)
    if moved_bwd and ctx.training:
        _add(bwd, "ep", moved_bwd)

    # ---- host-bound MoE block ----
    moe_gpu = _moe_block_gpu_s(gemm, mem_fwd, mem_bwd, moved_fwd, moved_bwd, ctx.training) if is_moe else (0.0, 0.0)
    # the floors were measured on megatron-core's alltoall dispatcher. The flex dispatchers are assumed to cost the
    # host as much: they too wait on the host for the token counts before the permute (DeepEP: `.item()` of
    # tokens_per_expert; HybridEP: a blocking dispatch unless the permuted-token count is given; Megatron-LM d98e8a6
    # megatron/core/transformer/moe/token_dispatcher.py, fused_a2a.py), and the router and experts are the same
    if is_moe and ctx.moe_host_bound:
        host_fwd_s, host_bwd_s = moe_block_host_s(model, ctx)
        _add(fwd, "host", max(0.0, host_fwd_s - moe_gpu[0]))
        if ctx.training:
            _add(bwd, "host", max(0.0, host_bwd_s - moe_gpu[1]))

    # ---- host-bound dense layer and padded MoE block: the host issue time, compared per micro-batch by the stage ----
    host_fwd = host_bwd = 0.0
    if is_moe and ctx.moe_host_issue_ahead:
        host_fwd, host_bwd = moe_block_host_s(model, ctx)
        if ctx.host_floor:
            # and the layer's attention block: half a dense layer's floor, as a hybrid layer's one block (an
            # assumption: a padded layer's attention host has not been measured apart)
            dense_fwd, dense_bwd = dense_host_s(ctx)
            host_fwd, host_bwd = host_fwd + dense_fwd / 2, host_bwd + dense_bwd / 2
    elif not is_moe and ctx.host_floor:
        host_fwd, host_bwd = dense_host_s(ctx)
        # the floor was measured on GPT layers of two blocks (attention and MLP); a hybrid model's layer of one block
        # is charged half of it (an assumption: no hybrid layer's host has been measured)
        share = model.residual_blocks(layer_index) / 2
        host_fwd, host_bwd = share * host_fwd, share * host_bwd
    if not ctx.training:
        host_bwd = 0.0
    elif ctx.full_recompute:
        host_bwd += host_fwd

    # ---- recompute ----
    if ctx.training:
        if ctx.full_recompute:
            rec = dict(fwd)
        else:
            mods = set(ctx.recompute_modules)
            if "core_attn" in mods and model.token_mixer(layer_index) == "attention":
                _add(rec, "attention", attn_fwd)  # as `flops.recomputed_forward_flops_per_token`: not a scan
            if "mlp" in mods and not is_moe and "fc1" in gemm:
                _add(rec, "gemm", gemm["fc1"]["fwd"] + gemm["fc2"]["fwd"])
                _add(rec, "memory_bound", mem_fwd.get("activation", 0.0))
            if "moe" in mods and is_moe:
                _add(rec, "gemm", sum(gemm[o]["fwd"] for o in gemm if o.startswith(MOE_BLOCK_GEMM_PREFIXES)))
                redone = ("router", "activation") + GLU_CLAMP_WORK + MOE_DISPATCH_WORK
                _add(rec, "memory_bound", sum(mem_fwd.get(k, 0.0) for k in redone))
                _add(rec, "ep", moved_fwd)
            if "moe_act" in mods and "moe" not in mods and is_moe:  # the moe module recomputes the activation too
                # the checkpointed activation function includes a clamped GLU's clamps and cat (experts.py)
                _add(rec, "memory_bound", sum(mem_fwd.get(k, 0.0) for k in ("activation", *GLU_CLAMP_WORK)))
            if "shared_experts" in mods and is_moe:
                _add(rec, "gemm", sum(gemm[o]["fwd"] for o in ("shared_fc1", "shared_fc2") if o in gemm))
                _add(rec, "memory_bound", mem_fwd.get("shared_activation", 0.0))
            if "layernorm" in mods:
                _add(rec, "memory_bound", mem_fwd.get("norm", 0.0))
            if "mla_up_proj" in mods:
                _add(rec, "gemm", sum(gemm[o]["fwd"] for o in ("q_up", "kv_up") if o in gemm))
    return LayerCost(Phases(fwd), Phases(bwd), Phases(rec), host_fwd, host_bwd, *moe_gpu)


# a MoE block's memory-bound work (`_mlp_memory_bound`): router, expert activations, dispatcher
MOE_BLOCK_MEMORY_WORK = (
    ("router", "activation", "activation_bwd", "shared_activation", "shared_activation_bwd")
    + GLU_CLAMP_WORK
    + MOE_DISPATCH_WORK
)


def _moe_block_gpu_s(gemm, mem_fwd, mem_bwd, moved_fwd: float, moved_bwd: float, training: bool) -> tuple[float, float]:
    """(forward, backward) GPU seconds of a MoE block alone: router, dispatcher (token movement and its
    communication), routed and shared experts; what its host floor is compared with."""
    moe_ops = [o for o in gemm if o.startswith(MOE_BLOCK_GEMM_PREFIXES)]
    moe_mem = MOE_BLOCK_MEMORY_WORK
    gpu_fwd = sum(gemm[o]["fwd"] for o in moe_ops) + sum(mem_fwd.get(k, 0.0) for k in moe_mem) + moved_fwd
    if not training:
        return gpu_fwd, 0.0
    gpu_bwd = sum(gemm[o]["dgrad"] + gemm[o]["wgrad"] for o in moe_ops)
    gpu_bwd += sum(mem_bwd.get(k, 0.0) for k in moe_mem) + moved_bwd
    return gpu_fwd, gpu_bwd


def moe_host_floor_of(ctx: LayerContext) -> MoeHostFloor:
    """The eager MoE block's host floor of the context: measured on the machine (`Calibration.moe_host_floor`, for
    its permute path) or the default of that path."""
    cal = ctx.calibration
    floor = cal.moe_host_floor(ctx.precision, ctx.fp8_recipe, ctx.moe_permute_fusion) if cal is not None else None
    if floor is not None:
        return floor
    return DEFAULT_FUSED_MOE_HOST_FLOOR if ctx.moe_permute_fusion else DEFAULT_MOE_HOST_FLOOR


def experts_activation_syncs_host(model: ModelSpec, fused_bias_activation: bool) -> bool:
    """Whether megatron-core's grouped experts stop the host once per forward in their activation, dropless or
    padded: the fused token-weighted quick-GEGLU (gpt-oss: a gated quick_gelu) builds its linear offset with
    `torch.tensor(linear_offset, device=input.device)`, a pageable host-to-device copy that synchronizes the stream
    (Megatron-LM d98e8a6 megatron/core/fusions/fused_bias_geglu.py `weighted_bias_quick_geglu_impl`, called from
    moe/experts.py TEGroupedMLP when bias_activation_fusion is on). Seen on one H200: gpt-oss-20b-E16's padded layers
    each waited once in that copy (`aten::to` with cudaStreamSynchronize before WeightedQuickGeGLUFunction;
    benchmarks/results/moe_timeline_h200), so its host cannot issue ahead of the GPU across the layer."""
    return fused_bias_activation and model.gated_linear_unit and model.activation == "quick_gelu"


def moe_block_host_s(model: ModelSpec, ctx: LayerContext) -> tuple[float, float]:
    """(forward, backward) seconds the host needs to issue one eager MoE block for one micro-batch at its local
    experts (`moe_host_floor_of`), less what CUDA graphs over the router (`moe_router`: router and shared experts)
    and the dispatcher's preprocess (`moe_preprocess`) take off the forward: their measured shares of it
    (`MoeHostFloor.router_share` / `preprocess_share`), replaced by one graph replay."""
    floor = moe_host_floor_of(ctx)
    local_experts = max(1, model.num_moe_experts // ctx.ep)
    fwd, bwd = floor.forward_s(local_experts), floor.backward_s(local_experts)
    if ctx.cuda_graph_impl != "none" and "moe_router" in ctx.cuda_graph_scope:
        captured = floor.router_share + (floor.preprocess_share if "moe_preprocess" in ctx.cuda_graph_scope else 0.0)
        fwd = (1.0 - captured) * fwd + d.CUDA_GRAPH_REPLAY_HOST_FWD_S
    return fwd, bwd


ATTENTION_OUT_GEMMS = ("proj",)
MLP_GEMMS = ("fc1", "fc2")


def forward_issue_groups_s(model: ModelSpec, layer_index: int, ctx: LayerContext) -> tuple[float, ...]:
    """GPU seconds of a dense layer's forward in the order the host issues it, five groups: input norm + attention
    input GEMM(s) + q/k/v split, q/k norms and RoPE (+ the TP all-gather before them); core attention (and any
    context-parallel exchange); proj + residual add (+ its reduce-scatter / all-reduce); pre-MLP norm + fc1 +
    activation (+ all-gather); fc2 + residual add (+ reduce-scatter / all-reduce). They add up to the layer's
    forward time (`layer_cost`)."""
    if model.is_moe_layer(layer_index):
        raise ConfigError("layer", "the issue order is measured for dense layers only")
    gpu = ctx.cluster.gpu
    lc = layer_cost(model, layer_index, ctx)
    gemm = {op: gemm_phase_time(op, sh, "fwd", ctx) for op, sh in gemm_shapes(model, layer_index, ctx).items()}
    mem = {
        name: memory_bound_time_s(fb, gpu, kn if fb else 0, eff)
        for name, (fb, _, kn, eff) in _memory_bound_bytes(model, layer_index, ctx).items()
    }
    norm, residual = mem.pop("norm", 0.0) / 2, mem.pop("residual", 0.0) / 2
    attn_in = sum(t for op, t in gemm.items() if op not in ATTENTION_OUT_GEMMS + MLP_GEMMS)
    attn_in += sum(mem.pop(k, 0.0) for k in ("qkv_split_copy", "qk_norm", "rope", "latent_norm"))
    tp = lc.fwd.parts.get("tp", 0.0)
    # sequence parallel: one all-gather before each input GEMM, one reduce-scatter after each output GEMM (equal
    # messages); without it one all-reduce after each output GEMM
    tp_in, tp_out = (tp / 4, tp / 4) if ctx.sequence_parallel else (0.0, tp / 2)
    groups = [
        norm + attn_in + tp_in,
        0.0,
        gemm.get("proj", 0.0) + residual + tp_out,
        norm + gemm.get("fc1", 0.0) + mem.pop("activation", 0.0) + tp_in,
        gemm.get("fc2", 0.0) + residual + tp_out,
    ]
    groups[1] = lc.fwd.total - sum(groups)  # core attention, CP exchange and what is left (fp8 casts)
    return tuple(groups)


def empty_queue_forward_s(model: ModelSpec, layer_index: int, ctx: LayerContext, host_s: float) -> float:
    """A dense layer's forward timed from an empty launch queue, as the testbench times it: the host launches op
    group k at f_k x `host_s` (`defaults.FORWARD_ISSUE_FRACTIONS`, measured), the GPU runs each group once launched
    and in order, so the pass ends at max(host_s, max_k (f_k x host_s + GPU time of groups k..end)). Neither the
    GPU time nor the host time alone: an 8B layer at s4096 waits about 1 ms for the host to reach its MLP. Inside a
    step the host runs ahead and `layer_cost` applies."""
    groups = forward_issue_groups_s(model, layer_index, ctx)
    fractions = d.FORWARD_ISSUE_FRACTIONS[ctx.tp > 1]
    return max([host_s] + [f * host_s + sum(groups[k:]) for k, f in enumerate(fractions)])


def empty_queue_phases_s(
    model: ModelSpec, layer_index: int, ctx: LayerContext, host_s: tuple[float, float] | None = None
) -> tuple[float, float]:
    """(forward, backward) seconds of a dense layer timed phase by phase from an empty launch queue, as the testbench
    times it: the forward by its issue order (`empty_queue_forward_s`), the backward the longer of its GPU and host
    time. `host_s`: the host's (forward, backward) seconds; None: the context's dense host floor (`dense_host_s`)."""
    host_fwd, host_bwd = host_s if host_s is not None else dense_host_s(ctx)
    backward = max(layer_cost(model, layer_index, ctx).bwd.total, host_bwd)
    return empty_queue_forward_s(model, layer_index, ctx, host_fwd), backward


def captured_host_share(ctx: LayerContext, is_moe: bool = False) -> float:
    """The share of a layer's host time that CUDA graphs take off the host (Megatron-LM --cuda-graph-impl /
    --cuda-graph-modules): all of it for full-iteration graphs and for a whole captured layer (an empty scope); a
    dense layer's attention or MLP part alone by `defaults.ATTN_HOST_SHARE` (its share of the eager layer's host
    time). MoE scopes (moe, moe_router, moe_preprocess) leave a dense layer's host as it is."""
    if ctx.cuda_graph_impl == "none":
        return 0.0
    scope = set(ctx.cuda_graph_scope)
    if not scope or ctx.cuda_graph_impl == "full_iteration" or ("attn" in scope and "mlp" in scope and not is_moe):
        return 1.0
    share = 0.0
    if "attn" in scope:
        share += d.ATTN_HOST_SHARE
    if "mlp" in scope and not is_moe:
        share += 1.0 - d.ATTN_HOST_SHARE
    return share


def dense_host_floor_of(ctx: LayerContext) -> DenseHostFloor:
    """The dense host floor of the context: measured on the machine (`Calibration.dense_host_floor`) or the
    default."""
    cal = ctx.calibration
    floor = cal.dense_host_floor(ctx.precision, ctx.fp8_recipe, ctx.tp) if cal is not None else None
    return floor or DEFAULT_DENSE_HOST_FLOOR


def dense_host_s(ctx: LayerContext) -> tuple[float, float]:
    """(forward_s, backward_s) the host needs to issue one dense layer for one micro-batch: the floor measured on
    the machine (`Calibration.dense_host_floor`) or the default, at this TP size, with the captured share replaced
    by one CUDA-graph launch per phase."""
    fwd, bwd = dense_host_floor_of(ctx).at(ctx.tp, ctx.sequence_parallel, ctx.training)
    share = captured_host_share(ctx)
    if share:
        fwd = (1.0 - share) * fwd + d.CUDA_GRAPH_REPLAY_HOST_FWD_S
        bwd = (1.0 - share) * bwd + d.CUDA_GRAPH_REPLAY_HOST_BWD_S
    return fwd, bwd


def _sm_slowdown(gpu, method: str) -> float:
    from .compute import sm_count

    sms = sm_count(gpu)
    return sms / max(1, sms - d.UB_COMM_SMS[method])


def _pair_exposed(gemm, shapes, op, phase, c, method, ctx: LayerContext, c_ub: float) -> float:
    """Exposed communication when userbuffers run the collective (`c_ub` s) under `op`'s `phase` GEMM; never
    more than NCCL's `c` s without overlap (the overlap tuner keeps the faster setting)."""
    g = gemm[op][phase]
    m, n, k, groups = shapes[op]
    if method == "ring_exchange":
        chunks = ctx.tp
        sm = 1.0
    else:
        chunks = 4
        sm = 1.0 / _sm_slowdown(ctx.cluster.gpu, method)
    chunk_shape = (m / chunks, n, k, groups)
    g_chunked = chunks * gemm_phase_time(op, chunk_shape, phase, ctx, sm)
    overlapped = _overlapped_pair(g, g_chunked, c_ub, method, ctx.tp)
    return max(0.0, min(g + c, overlapped) - g)
