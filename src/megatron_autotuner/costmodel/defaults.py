"""Default efficiencies for GPUs that were never measured, and where each number comes from.

Every constant here is a physical bound or a measurement made in this workplace; none is fitted
to the published training runs the benchmarks compare against. A calibration file measured by
the testbench on the target GPU replaces the compute defaults (see `costmodel.calibration`).

Measurements cited (all bf16 unless stated):
- [M1] /work/.library/device/KINDS.md: an 8192x8192x8192 bf16 matrix product ran at 769-798 TFLOP/s
  on H100 and H200 (0.78-0.81 of the 989 TFLOP/s dense peak); a device-to-device copy moved
  3.0 TB/s on H100 (0.90 of 3.35 TB/s) and 4.3 TB/s on H200 (0.90 of 4.8 TB/s).
- [M2] /work/shared/reference/traces/h200_te_layer_tp1_rank0 (megatron-core TE layer, hidden 4096,
  ffn 12288, 32 heads / 8 groups, seq 8192, H200): the ten layer GEMMs (fwd, dgrad, wgrad of qkv,
  proj, fc1, fc2) ran at 703-798 TFLOP/s, 753 on average (0.76 of peak); TE's RMSNorm kernels moved
  3.5-3.7 TB/s (0.73-0.77 of HBM); with attention dropout 0.1 cuDNN's flash attention took 2.33 ms
  forward and 3.89 ms backward; the TP=2 trace shows NCCL all-gather / reduce-scatter of a
  67 MB tensor at ~210 GB/s bus bandwidth with the Simple protocol (the kernels are named `..._RING_LL` for
  every protocol; their 544-thread blocks are Simple's, see `costmodel.nccl_protocols`).
- [M3] `python -m megatron_autotuner.costmodel.measure_defaults` on one H200 (torch 2.11.0+cu130,
  cuDNN 9.19, 132 SMs, random data), committed as
  benchmarks/results/testbench_h200_x2/defaults_h200.json: a sweep of 91 GEMM shapes per precision
  (median 0.66 of the bf16 peak and 0.62 of the fp8 peak over shapes of >= 1e11 FLOPs; 8192^3 at
  0.70 bf16) and torch SDPA with the cuDNN backend for causal / full attention, head dims
  64 / 128 / 192 (v 128), sequence 1k-32k (the table below), and 4.2-4.4 TB/s for a copy and an
  elementwise add (0.87-0.91 of HBM). `tests/costmodel/test_defaults.py` checks the constants below
  against that file.
- [M4] megatron-core TE linear layers measured by the testbench on the same H200
  (benchmarks/results/testbench_h200_x2/pieces): column-parallel fc1 fwd+bwd at 680-730 TFLOP/s
  (0.69-0.74 of peak), row-parallel fc2 at 645-695 (0.65-0.70) at tp=1.
"""

from __future__ import annotations

# ---- GEMMs ------------------------------------------------------------------------------------
# Sustained large-GEMM efficiency (fraction of the dense peak). bf16 0.70: what megatron-core's TE
# linear layers reach in a layer [M4] (0.65-0.74) and the long square products of [M3] (8192^3
# 0.70, 16384^3 0.69, long enough to reach the power limit); short isolated products run faster
# (0.78-0.81 [M1]) before clocks settle. fp8 0.62: the fp8 sweep median of [M3]
# (torch._scaled_mm, per-tensor scales), ~1.9x the bf16 rate, not 2x.
GEMM_EFFICIENCY = {"bf16": 0.70, "fp8": 0.62}
# A bf16 GEMM whose rows are not a multiple of 16 bytes (k or n not a multiple of 8 elements) cannot use Hopper's
# TMA-fed kernels (cuTensorMapEncodeTiled: every global stride a multiple of 16 bytes): cuBLAS runs sm80
# `cutlass_80_tensorop_*_align2` kernels instead. Measured on one H200 (torch 2.11.0+cu130,
# benchmarks/results/gemm_alignment_h200): 18.9-27.1% of the bf16 peak over 10 shapes, median 0.23, where their
# aligned twins (n, k rounded up to a multiple of 8) ran sm90 `nvjet` kernels at 0.56-0.76. Qwen2.5-VL's
# 3420-wide vision MLP is the case met (its fc2 in the tower's trace, benchmarks/results/vision_tower_h200).
# Applied on the GPUs of that architecture (sm90); unmeasured elsewhere (A100's own fast kernels need no TMA, and
# Blackwell's fallback rate is unknown).
UNALIGNED_GEMM_EFFICIENCY = 0.23
UNALIGNED_GEMM_GPUS = ("H100-SXM", "H200")
GEMM_ALIGNMENT_ELEMENTS = 8  # 16 bytes of bf16
# Output tile of a Hopper cuBLAS kernel (the nvjet kernels of [M2] use 128x256, 256x128, 192x192;
# split-K / stream-K fill the machine once there are as many 128x128 tiles as SMs). A GEMM with
# fewer tiles (after splitting k into chunks of at least GEMM_MIN_K_SPLIT) runs on that share of
# the SMs.
GEMM_TILE_M = 128
GEMM_TILE_N = 128
GEMM_MIN_K_SPLIT = 512
# Fixed time per kernel (launch, prologue, tail wave): [M3] small GEMMs bottom out at 15-20 us in a
# Python loop; on a GPU kept busy by a run-ahead CPU, a few microseconds remain.
KERNEL_OVERHEAD_S = 4e-6

# Streaming SMs per GPU preset (NVIDIA architecture whitepapers: A100 108, H100/H200 SXM 132,
# B200 148 per GPU). Used for the tile-fill rule above; unknown GPUs get 132.
SM_COUNT = {"A100-40GB": 108, "A100-80GB": 108, "H100-SXM": 132, "H200": 132, "B200": 148, "GB200": 148}
DEFAULT_SM_COUNT = 132

# ---- memory-bound kernels ---------------------------------------------------------------------
# Achieved fraction of the HBM bandwidth by norms, activations, rope, residual adds, casts,
# cross-entropy and the optimizer step: 0.8, between TE RMSNorm in [M2] (0.73-0.77) and a plain
# copy / add in [M1]/[M3] (0.89-0.91).
HBM_EFFICIENCY = 0.8
# Kernels measured well below that in the rank-0 traces of real megatron-core training steps on
# H200 (TE 2.20, torch 2.11; benchmarks/results/validation_h200_x2/traces, 4-layer Qwen3-8B, DP2
# and TP2+SP at seq 4096; the two agree within the spread given):
# - the fused SwiGLU backward (torch-compiled, recomputes silu from its input in fp32): 10 bytes per
#   ffn element at 2.2-2.5 TB/s, 0.45-0.52 of HBM (the forward streams at 0.9);
# - TE's fused RoPE (q and k, [s, b, heads, d] layout): 0.30-0.35;
# - the q / k / v split copies before q/k RMSNorm (strided reads): 0.29-0.30.
# These fractions are of the H200's 4.8 TB/s. A kernel that streams below HBM_EFFICIENCY there is
# held back by its SMs, not by HBM: by Little's law its bandwidth is the bytes its SMs keep in flight
# over the memory latency, which does not grow with the HBM. On another GPU it keeps that absolute
# rate, per SM, and never beats HBM_EFFICIENCY of that GPU's own HBM (`compute.memory_bound_time_s`).
# Checked on 1x H100 (3.35 TB/s, 132 SMs; benchmarks/results/validation_h100_x1/traces): the fused
# SwiGLU backward streamed 2.35-2.62 TB/s (H200: 2.2-2.5; HBM-fraction scaling said 1.6) and the
# optimizer kernels 2.68 TB/s (0.80 of H100 HBM, H200 0.72 x 4.8 = 3.46); over whole steps the
# memory-bound kernels moved the same bytes per second on H100 as on H200 (within 2%).
FRACTION_MEASURED_ON_HBM_GBPS = 4800.0
FRACTION_MEASURED_ON_SMS = 132
FUSED_ACTIVATION_BWD_HBM_EFFICIENCY = 0.48
ROPE_HBM_EFFICIENCY = 0.33
QKV_SPLIT_COPY_HBM_EFFICIENCY = 0.3
# TE's RMSNorm backward for a hidden size it has no tuned kernel for (q/k norm, head_dim 128) ends with
# `rmsnorm_bwd_finalize_general_kernel`, which took 75-83 us per call whatever the rows (131 k rows
# at TP1, 65 k at TP2): one for q and one for k per layer and micro-batch (same traces).
QK_NORM_BWD_FINALIZE_S = 78e-6

# MoE token movement (megatron-core's alltoall dispatcher; `layer._moe_dispatch_work`). benchmarks/moe_permute.py ran
# megatron-core 0.19.2's permute / sort_chunks_by_idxs / unpermute, unfused and with TE 2.20.2's fused kernels, on one
# H200 over 4k-32k tokens, hidden 2048 / 4096, 32 / 128 experts, top-2 / top-8
# (benchmarks/results/moe_permute_h200/moe_permute.json; `--fit` gives these). Gathers, the sort's cat and the fused
# kernels stream at HBM_EFFICIENCY (1.04 ps per permuted element for 2 accesses, measured 0.95-1.04 unfused;
# fused 0.45-0.55 per element of each side). Below it:
# - the unfused backward of the permute, autograd's atomic bf16 `index_add_` (torch's indexFuncLargeIndex): 8.27 ps per
#   permuted element (max residual 2%), i.e. 4 bytes per element at 0.101 of 4.8 TB/s;
# - the unfused unpermute's atomic `scatter_add_`: 3.76 ps per element (max residual 3%): 0.222;
# - the pass over the T x E routing map (1 byte per entry) that builds the permutation: 25.2 ps per entry unfused
#   (`masked_select`), 70.2 ps with TE's fused row-id map: 0.0083 and 0.0030.
# The rank-0 trace of the 4-GPU E32 run (plan_regret_h200_x4_r2/moe_traces) shows the same kernels at 32 k tokens,
# top-8: index_add 4.98 ms, scatter_add 2.11 ms per layer (this benchmark: 4.58 / 2.07 ms of kernel time).
MOE_INDEX_ADD_HBM_EFFICIENCY = 0.101
MOE_SCATTER_ADD_HBM_EFFICIENCY = 0.222
MOE_ROUTING_MAP_UNFUSED_HBM_EFFICIENCY = 0.0083
MOE_ROUTING_MAP_FUSED_HBM_EFFICIENCY = 0.0030

# ---- attention --------------------------------------------------------------------------------
# cuDNN flash attention (what TE's DotProductAttention uses on Hopper), fraction of the bf16 dense
# peak, counting the work actually done (causal = half of the s x s square), from [M3]:
# (causal, head_dim_qk) -> phase -> ((seq_length, efficiency), ...). head_dim 192 is MLA's
# (q/k 192, v 128). Backward counts 2x the forward FLOPs.
ATTENTION_EFFICIENCY: dict[tuple[bool, int], dict[str, tuple[tuple[int, float], ...]]] = {
    (True, 64): {
        "fwd": ((1024, 0.348), (2048, 0.403), (4096, 0.439), (8192, 0.458), (16384, 0.468), (32768, 0.486)),
        "bwd": ((1024, 0.168), (2048, 0.233), (4096, 0.288), (8192, 0.325), (16384, 0.354), (32768, 0.33)),
    },
    (True, 128): {
        "fwd": ((1024, 0.463), (2048, 0.54), (4096, 0.584), (8192, 0.604), (16384, 0.641), (32768, 0.623)),
        "bwd": ((1024, 0.211), (2048, 0.292), (4096, 0.367), (8192, 0.406), (16384, 0.422), (32768, 0.42)),
    },
    (True, 192): {
        "fwd": ((1024, 0.454), (2048, 0.545), (4096, 0.597), (8192, 0.624), (16384, 0.622), (32768, 0.593)),
        "bwd": ((1024, 0.191), (2048, 0.259), (4096, 0.324), (8192, 0.353), (16384, 0.355), (32768, 0.376)),
    },
    (False, 64): {
        "fwd": ((1024, 0.451), (2048, 0.468), (4096, 0.482), (8192, 0.496), (16384, 0.49)),
        "bwd": ((1024, 0.257), (2048, 0.311), (4096, 0.349), (8192, 0.354), (16384, 0.353)),
    },
    (False, 128): {
        "fwd": ((1024, 0.622), (2048, 0.639), (4096, 0.652), (8192, 0.66), (16384, 0.642)),
        "bwd": ((1024, 0.311), (2048, 0.377), (4096, 0.428), (8192, 0.413), (16384, 0.416)),
    },
    (False, 192): {
        "fwd": ((1024, 0.581), (2048, 0.645), (4096, 0.67), (8192, 0.665), (16384, 0.651)),
        "bwd": ((1024, 0.195), (2048, 0.219), (4096, 0.235), (8192, 0.242), (16384, 0.246)),
    },
}
# Below the shortest measured sequence the fixed cost of each query tile (load Q, write O, final
# softmax rescale) is amortised over fewer key tiles: eff(s) = eff(s_min) * 2s / (s + s_min).
# Attention dropout makes cuDNN generate and apply a Philox mask inside the kernel: [M2] (dropout
# 0.1, H200) against [M3] (no dropout, same shape, same GPU) is 2.6x slower forward
# and 1.4x backward.
ATTENTION_DROPOUT_SLOWDOWN = {"fwd": 2.6, "bwd": 1.4}

# ---- collectives ------------------------------------------------------------------------------
# Inside an NVLink domain, all-reduce / all-gather / reduce-scatter follow NCCL's own choice of algorithm and
# protocol (`costmodel.nccl_protocols`, NCCL 2.28.9 tuning.cc) with the two corrections below; scale-out groups,
# all-to-all and send/recv keep the alpha-beta model that follows them.
# What NCCL's chunked protocols (Simple; LL128 assumed alike, not measured) take beyond NCCL's own estimate: a fixed
# overhead per call and a fraction of NCCL's modelled bus bandwidth (12 x 30 = 360 GB/s on H100 / H200), by ring size.
# - 2 ranks: the 2x H200 traces (NCCL 2.28.9, 24 channels; benchmarks/results/validation_h200_x2/traces,
#   .../moe_gpu/traces, testbench_h200_x2/profile): the 244 Simple all-gathers / reduce-scatters that overlapped no
#   other kernel (and were not their group's first call, which also waits for the other rank), 8 message sizes of
#   16.8 MB - 1.24 GB sent per rank, fit t = NCCL latency (11.8 us) + 20 us + bytes / (0.75 x 360 GB/s); each size's
#   median within 8% (`python benchmarks/nccl_curves.py` refits it; tests/costmodel/test_collectives.py holds these
#   constants to that fit); the largest reduce-scatters (1.35 / 2.49 GB) plateau at 271 GB/s. The LL calls of the
#   same traces (16 kB - 151 kB all-reduces) took NCCL's estimate within 7%, so LL gets no correction.
# - 8 ranks: published nccl-tests plateaus of 8x H100 (NVLink 4, ring, no NVLS): reduce-scatter 360 and all-gather
#   350 GB/s (NVIDIA/nccl#1281), all-reduce 330 with NCCL_NVLS_ENABLE=0 (NVIDIA/nccl#1221, NCCL 2.19.3), all-gather
#   and all-reduce ~360 at 128 MB - 16 GB, "exactly what we'd expect on H100" per NCCL's maintainer
#   (NVIDIA/nccl-tests#326; in NVIDIA/nccl-tests#212 the same maintainer gives ~370 GB/s as NCCL's effective NVLink
#   bandwidth after ~20% protocol overhead on the 450 GB/s line rate). Median 360 / 360: 1.0.
# The 2-rank deficit is what the 2x H200 machines measured; NCCL's model (same 24 channels, same per-link speed)
# does not explain it, so it is not carried to 8 ranks, where published runs reach NCCL's own bandwidth. 4 ranks are
# measured nowhere here: `nccl_protocols.chunked_bw_fraction` interpolates in log2(ranks) (0.875), and holds the 8-rank
# value above 8 ranks; benchmarks/nccl_sweep.py measures TP 2 / 4 / 8 on one 8-GPU machine when one is lent.
NCCL_CHUNKED_EXTRA_LATENCY_S = 20e-6
NCCL_CHUNKED_BW_FRACTION = {2: 0.75, 8: 1.0}
# Scale-out and NVLink all-to-all / send-recv: achieved fraction of the per-direction link bandwidth (NVLink 4:
# 18 links x 25 GB/s, ~0.8 after packet headers and synchronisation; InfiniBand / RoCE with GPUDirect RDMA,
# one NIC per GPU: ~0.9 of the line rate) and a per-call latency: a launch / synchronisation base plus one hop
# per ring step (NCCL's tuning model uses ~1 us per NVLink hop and a few us per network hop).
# NVLink: measured. NCCL 2.28.9's all-to-all and send/recv on 2 and 4 H200 (benchmarks/results/nccl_sweep_fit.json,
# bus bandwidth at 64 MiB-1 GiB): 155-355 GB/s, median 287 of NVLink's 450 per direction: 0.64. (0.8 was assumed
# before; the 4-GPU traces' EP all-to-all ran 1.78 ms per 1 GiB call at 2 ranks where 0.8 gave 1.5 ms.)
LINK_EFFICIENCY = {"nvlink": 0.64, "scale_out": 0.9}
COLLECTIVE_BASE_LATENCY_S = 10e-6
HOP_LATENCY_S = {"nvlink": 1e-6, "scale_out": 5e-6}
# TE userbuffers (tp_comm_overlap) move the same bytes without NCCL (transformer_engine/common/comm_gemm_overlap:
# ring-exchange copies each chunk to the next rank with cudaMemcpyAsync on the copy engines and flags the step
# with one-thread push kernels; pipeline and bulk run userbuffers' own reduce-scatter / all-gather kernels on
# num_sm SMs). Measured in /work/shared/reference/traces/h200_te_layer_tp2_userbuffers_rank0 (2x H200, TE 2.20.2,
# TE's default ub config, 16 SMs; extracted in tests/fixtures/ub_h200_tp2_kernels.json), while GEMMs ran:
# - `Memcpy PtoP` 33.5 MB in 87.5-88.9 us (4 copies): 379 GB/s over NVLink;
# - `kuserbuffers_pushsend` 3.9 us + `kuserbuffers_pushrecv` 1.9 us (medians) per ring step;
# - `userbuffers_fp16_sum_inplace_gpu_rw_ag` (bulk all-gather) 33.5 MB sent per rank in 104.6 us: 321 GB/s;
# - `userbuffers_fp16_sum_inplace_gpu_rr_rs` (bulk reduce-scatter) 33.5 MB in 171.7 us: 195 GB/s;
# - `userbuffers_fp16_sum_inplace_gpu_rr_rs_oop` on 16 SMs (pipeline reduce-scatter, one per chunk) 58.4 us per
#   8.4 MB chunk: 144 GB/s.
# NCCL took 158 us for the same all-gather (Simple, 212 GB/s bus bandwidth) in the NCCL trace of the same layer.
UB_P2P_COPY_GBPS = 379.0
UB_STEP_SYNC_S = 5.8e-6
UB_SM_KERNEL_GBPS = {
    ("bulk", "all_gather"): 321.0,
    ("bulk", "reduce_scatter"): 195.0,
    ("pipeline", "reduce_scatter"): 144.0,
}

# ---- host-bound MoE layers ----------------------------------------------------------------------
# megatron-core's MoE layer run eagerly (alltoall token dispatcher without permute fusion, TE grouped
# experts, no CUDA graphs) issues several kernels per local expert and waits on the host for the
# routing counts, so with few tokens per expert the CPU, not the GPU, sets its pace. The testbench's
# `moe` operator (router + dispatcher + experts of Qwen3-30B-A3B, 4096 tokens, 2x H200 host, torch 2.11,
# megatron-core 0.19.2, TE 2.20.2; benchmarks/results/testbench_h200_x2/rerun/moe_block_summary.json)
# took 9.14 / 9.29 ms forward at 128 / 64 local experts, flat, and 20.18 / 14.89 ms backward: 9.6 ms
# plus 83 us per local expert, while its GPU work is 1-3 ms. A MoE layer's block never takes less.
# These are one host's: the floor is the host CPU's pace, and another host (1x H100 leases, three of them:
# benchmarks/results/validation_h100_x1/moe_host_floor) ran it 36% faster to 5% slower (128 experts), with
# forward growing 25-48 us per local expert. A calibration file measured on the machine (`mat profile --ops moe
# --calibration-out`, its `moe_host_floor`) replaces these.
MOE_HOST_FLOOR_FWD_S = 9.2e-3
MOE_HOST_FLOOR_FWD_PER_LOCAL_EXPERT_S = 0.0  # flat on that host; a line on 1x H100's (a calibration says so)
MOE_HOST_FLOOR_BWD_S = 9.6e-3
MOE_HOST_FLOOR_BWD_PER_LOCAL_EXPERT_S = 83e-6
# Shares of that forward's host time spent in the router (with the shared experts) and in the dispatcher's
# preprocess: what CUDA graphs of scope moe_router / moe_preprocess take off the host. The testbench times the host in
# each MoELayer step (`testbench.operators.MOE_FORWARD_STEPS`); on one H200 lease (torch 2.11, megatron-core 0.19.2,
# TE 2.20.2, 2026-11-29; benchmarks/results/moe_host_h200, `python benchmarks/moe_host.py`) the medians over the
# host-bound unfused cases were 0.19 and 0.13 (1.2-1.6 ms and 0.8-1.1 ms of 6-16 ms).
MOE_HOST_ROUTER_SHARE = 0.186
MOE_HOST_PREPROCESS_SHARE = 0.125
# The same block with TE's fused permute (--moe-permute-fusion), as NVIDIA's MoE recipes run it without a CUDA graph
# over the block: just as host-bound. Its router still launches a dozen small kernels, the dispatcher's preprocess
# still waits for the token counts on the host, and the grouped experts still issue per-expert work; the fused
# kernels only replace the permute's. Same lease, 14 bf16 cases (Qwen3-30B-A3B shapes at 128 / 32 / 16 / 8 experts,
# gpt-oss-120b shapes at 128 / 16 / 4, 1024 and 4096 tokens), the 13 host-bound ones (each phase over 1.5x the block's
# GPU time: `testbench.calibration.moe_host_floors_from_records`): forward 4.56 ms + 91 us per local expert, backward
# 3.91 ms + 184 us per local expert (least squares; the block's GPU work is 0.2-2 ms forward). A first run of the
# same cases on the same machine gave 4.76 ms + 110 us and 4.45 ms + 190 us (calibration_first_run.json). Before
# this the cost model priced the fused block at its GPU time alone, 5-30x short (comparison.json).
FUSED_MOE_HOST_FLOOR_FWD_S = 4.56e-3
FUSED_MOE_HOST_FLOOR_FWD_PER_LOCAL_EXPERT_S = 91e-6
FUSED_MOE_HOST_FLOOR_BWD_S = 3.91e-3
FUSED_MOE_HOST_FLOOR_BWD_PER_LOCAL_EXPERT_S = 184e-6
FUSED_MOE_HOST_ROUTER_SHARE = 0.152
FUSED_MOE_HOST_PREPROCESS_SHARE = 0.131

# ---- host-bound dense layers ---------------------------------------------------------------------
# An eager megatron-core TE layer costs the host a roughly fixed time to issue, whatever its size: Python of
# TransformerLayer / SelfAttention / MLP, TE's autograd functions and a few dozen kernel launches forward, and the
# autograd engine's nodes backward. The host runs ahead of the GPU (launches are asynchronous), so a layer's phase
# takes max(GPU time, host time): small layers at small micro-batches are host-bound (Qwen3-0.6B at micro-batch 1
# ran over twice its GPU time). Measured by the testbench (`testbench.measure`: the wall time of the forward and
# backward calls from an empty launch queue) on one H100 lease (16 vCPUs), megatron-core 0.19.2, TE 2.20.2,
# torch 2.11: the median over the host-bound bf16 decoder cases (`testbench.calibration.dense_host_floors_from_records`)
# of Qwen3-0.6B / 1.7B / 4B / Llama-3.1-8B at s4096, micro-batch 1-4
# (benchmarks/results/testbench_h100_x1/host_floor_unfused_rope: 3.41 / 2.81 ms). A second lease with Megatron-LM's
# fusions (fused RoPE) measured 3.42 / 2.90 ms (testbench_h100_x1/host_floor). A calibration file measured on the
# machine (`mat profile --ops decoder --calibration-out`, its `dense_host_floor`) replaces these: the floor is the
# host CPU's pace, not the GPU's.
DENSE_HOST_FLOOR_FWD_S = 3.41e-3
DENSE_HOST_FLOOR_BWD_S = 2.81e-3
# The forward under torch.no_grad(), as forward-only passes (RLHF log-prob / reference) run it: autograd records
# no graph and TE's functions save nothing for backward. The testbench times both forwards of the same layer in
# one process (`testbench.measure`); on the H100 diagnostics lease
# (benchmarks/results/validation_h100_x1/host_diagnostics/testbench) the no-grad / training ratio of the
# host-bound bf16 decoder cases (Qwen3-0.6B micro-batch 1 / 2 / 4, Qwen3-1.7B micro-batch 1) was 0.917 / 0.847 /
# 0.872 / 0.996, median 0.895; that lease's host was slower overall (4.44 ms training forward), so the ratio, not
# its absolute times, scales a training forward's floor where the no-grad one was not measured
# (`DenseHostFloor.fwd_no_grad_s`).
NO_GRAD_FWD_HOST_RATIO = 0.895
# The host's work outside the decoder layers, in units of the layer floor (the host's pace scales all it does):
# measured by the in-model probes of `mat validate --measure-host-floor` (`validate.host_floor`: Qwen3-0.6B /
# 1.7B.L14 / 4B.L8 at 512 tokens, TP 1, micro-batch 1, eager, 3 + 5 steps, where the GPU waits on the host): a
# probe's median step less its layers' host times (`Layout.host_timing`), over its own training-forward layer time.
# One H100 lease, two rounds (benchmarks/results/validation_h100_x1/host_probe, run / after), megatron-core 0.19.2,
# TE 2.20.2:
# - per micro-batch (embedding, final norm, output layer, loss, the schedule's own work): the forward-only probe's
#   5.2 / 5.1 / 3.5 and 8.8 / 4.4 / 3.2 ms over 4.83 / 4.45 / 3.44 and 4.18 / 3.88 / 4.26 ms, median 1.105 layer
#   forwards;
# - per training step (the optimizer step: grad finalize, grad-norm, Adam and the main -> model parameter copies;
#   zero-grad; the backward of the embedding and output layer): the training probe's less the forward-only probe's,
#   36.9 / 28.9 / 25.9 and 28.1 / 29.6 / 29.0 ms over the layer's forward + backward, 8.42 / 8.11 / 7.31 and 6.66 /
#   7.48 / 8.92 ms, median 3.76 layer forward + backwards (it grows slowly with the layer count: more parameters
#   for the optimizer to walk).
# `DenseHostFloor.microbatch_s` / `step_s` where the probes measured them; a step never takes less than its
# host's issue time, these included (`costmodel.estimate.time_model`).
# How far the host's pace strays from the default floor: the in-model host times of 81 layer phases (training
# forward, backward, no-grad forward of Qwen3-0.6B / 1.7B.L14 / 4B.L8 at micro-batch 1 / 2 / 4, `Layout.host_timing`)
# on three single-GPU leases, two machine kinds (benchmarks/results/validation_h100_x1/host_probe/run,
# host_probe_2/run, validation_h200_x1/host_probe/run) over the default's: 0.547x (the H200 host's no-grad forward
# of Qwen3-0.6B) to 2.227x (an H100 process's Qwen3-1.7B backward), rounded outward. A prediction paced by the
# default floor gives the step at both ends (`Estimate.step_time_range_s`).
HOST_PACE_RANGE = (0.54, 2.23)
# How far one process's host pace strays from another's on the same machine, where a calibration file gives the
# machine's own floor: ten fresh processes of one 2x H200 host ran the same Qwen3-30B-A3B-E32 ep 2 step (six eager,
# four graphed); the slower rank's issue time per forward span over its mode's median, 0.764x to 1.501x, rounded
# outward (benchmarks/results/rank_pace_h200_x2/report.json, "repeats"). The floor's own median over three processes
# does not tell which draw a run gets.
HOST_PROCESS_PACE_RANGE = (0.76, 1.51)
DENSE_HOST_MICROBATCH_PER_LAYER_FWD = 1.105
DENSE_HOST_STEP_PER_LAYER = 3.76
# A layer's forward started from an empty launch queue (the testbench times each phase right after a synchronize)
# waits for the host twice: until the host launches each op, and then for the op's GPU work. The host launches a
# TE layer's op groups at these fractions of the forward call's host time (first kernel of each group), read from
# torch-profiler traces (`decoder.fwd` ranges, the second timed forward; launch = the cudaLaunchKernel /
# cuLaunchKernelEx correlated with the kernel):
# - TP 1: Qwen3-0.6B decoder, s4096, micro-batch 1, one H100 lease
#   (benchmarks/results/testbench_h100_x1/host_floor/qwen3_0.6b_decoder.rank_0.json.gz): input norm + qkv GEMM
#   0.11, core attention 0.53, proj 0.607, pre-MLP norm + fc1 0.777, fc2 0.905;
# - TP 2 with sequence parallelism: Llama-3.1-8B decoder, s8192, 2x H200, rank 0
#   (benchmarks/results/testbench_h200_x2/profile/torch_profiler/Llama-3.1-8B.decoder.tp2.cp1.ep1.s8192.b1.554a6d35ec):
#   all-gather before qkv 0.143, core attention 0.582, proj 0.654, all-gather before fc1 0.805, fc2 0.92.
# Both traces ran under the profiler, which slows the host evenly enough to keep the fractions
# (`costmodel.layer.empty_queue_forward_s`). Keyed by TP > 1. A later trace of a large TP 1 layer (Qwen3-8B, s4096,
# one H200: benchmarks/results/validation_h200_x1/issue_order/qwen3_8b_decoder.rank_0.json.gz) read 0.104 / 0.517 /
# 0.596 / 0.769 / 0.898, within 0.013 of the TP 1 fractions: they belong to the layer's code, not its shape.
FORWARD_ISSUE_FRACTIONS = {False: (0.11, 0.53, 0.607, 0.777, 0.905), True: (0.143, 0.582, 0.654, 0.805, 0.92)}
# megatron-core's fine-grained activation offloading costs the host time per offloaded group (one module of one
# layer, one micro-batch), all of it Python and launches, no host synchronisation (fine_grained_activation_offload.py,
# megatron-core 0.19: forward `FineGrainedOffloadingGroupCommitFunction` -> `bulk_offload_group`, per saved tensor a
# checker, a pinned pool buffer, `copy_(non_blocking=True)` on the D2H stream and `record_stream`, plus the
# forced release; backward `FineGrainedOffloadingGroupStartFunction.backward` -> `bulk_reload_group`, per tensor an
# empty GPU tensor and its H2D copy, and the stream / event waits). The torch-profiler step of Qwen3-0.6B (28 layers,
# s4096, micro-batch 1, 4 micro-batches, core_attn + attn_proj offloaded: 2 groups of 4 and 1 tensors per layer,
# 27 layers offloaded) on one H100 lease, megatron-core 0.19.2, TE 2.20.2, torch 2.11
# (benchmarks/results/validation_h100_x1/activation_offload/profile): forward 78.5 ms (group commit + start),
# backward 75.3 ms (their backward nodes) over 216 offloaded groups; under the profiler, which inflates host time
# (the profiled step grew 187 ms with offloading, the 8 timed steps of the same run 122 ms by their medians). The
# 4-tensor core_attn commit took 398 us, the 1-tensor attn_proj commit 221 us (medians): part of the cost grows
# with the tensors, which one module pair cannot separate. Only the host pays it: hidden where the GPU sets the pace.
FINE_GRAINED_OFFLOAD_HOST_FWD_S_PER_GROUP = 78.5e-3 / 216
FINE_GRAINED_OFFLOAD_HOST_BWD_S_PER_GROUP = 75.3e-3 / 216
# Each TP collective a layer issues adds the host time of its torch.distributed call: the CPU span of
# `nccl:_all_gather_base` / `nccl:_reduce_scatter_base` in the 2x H200 TP=2 decoder trace
# (benchmarks/results/testbench_h200_x2/profile, 20 calls: median 70 us, 50-200 us; under the profiler, which
# inflates it, while the Python around the call is not counted). With sequence parallelism a layer issues 4
# forward (2 all-gathers, 2 reduce-scatters) and 6 backward (input re-gathers of qkv / fc1 for wgrad, their dgrad
# reduce-scatters, and the all-gathers of the proj / fc2 output gradients): counted in that trace. Without it,
# 2 all-reduces each way.
TP_COLLECTIVE_HOST_S = 70e-6
TP_COLLECTIVES_PER_LAYER = {True: (4, 6), False: (2, 2)}  # sequence parallel -> (forward, backward)
# A CUDA-graphed layer costs the host one graph replay per phase instead: TE's graphed callable (an autograd
# Function whose forward / backward replays a captured graph). Measured by benchmarks/testbench/graph_replay_host.py
# on one H100 lease (benchmarks/results/testbench_h100_x1/host_floor/graph_replay_host.json): a Qwen3-0.6B-shaped TE
# TransformerLayer's forward call 0.153 ms graphed (1.777 ms eager), its backward call 0.565 ms (1.785 ms eager).
CUDA_GRAPH_REPLAY_HOST_FWD_S = 0.153e-3
CUDA_GRAPH_REPLAY_HOST_BWD_S = 0.565e-3
# The attention half of a dense layer (input norm, qkv, RoPE, core attention, proj, residual) in the layer's
# forward host time: the CPU span from the layer's start to the MLP's first op (_LayerNormLinear of fc1), 4.22 of
# 5.41 ms in the torch-profiler trace of the Qwen3-0.6B decoder
# (benchmarks/results/testbench_h100_x1/host_floor_unfused_rope/qwen3_0.6b_decoder.rank_0.json.gz; unfused RoPE).
ATTN_HOST_SHARE = 0.78

# ---- the host's lead over the GPU -----------------------------------------------------------------
# A GPU-bound eager step keeps CUDA's launch queue full: the host runs this many GPU operations (kernels, memsets,
# copies, as torch.profiler counts them) ahead of the GPU. benchmarks/launch_queue.py on one H200 (torch 2.11,
# CUDA 13.0, CUDA_DEVICE_MAX_CONNECTIONS=1): 1027-1028 back-to-back 1 ms kernels return at once, the next blocks
# (1041-1047 from a side stream); in the profiled steps of Qwen3-32B (16 layers, 4x H200, tp1 dp4 and tp2 pp2 vpp8;
# benchmarks/results/reserved_memory_h200_x4/queue) the launched-but-not-started operations held at 988 (median)
# and 1001-1003 (max) through the step: the rest of the 1028 are event records and stream waits.
LAUNCH_QUEUE_OPS = 1000
# GPU operations the host launches per decoder layer and micro-batch, forward and backward, with the work around the
# layers (embedding, output layer, loss, DDP's gradient hooks and bucket reduce-scatters, pipeline sends) spread
# over them, in the same two profiled steps: tp1 dp4 939 forward / 1668 backward over 32 layer passes (29.3 / 52.1),
# tp2 pp2 vpp8 1994 / 3224 over 64 (31.2 / 50.4). Keyed by TP > 1.
LAUNCHES_PER_LAYER = {False: (29.3, 52.1), True: (31.2, 50.4)}
# A MoE layer launches more: TE's GroupedLinear issues one GEMM per local expert for each of fc1 and fc2 forward and
# for each one's dgrad and wgrad backward (2 + 4 per local expert), and without gradient-accumulation fusion DDP's
# hook adds each expert parameter's gradient into main_grad (`CUDAFunctor_add`, one per weight, one per bias). The
# rest of the layer (attention, router, dispatcher, the work around the layers spread over them) counted in the
# profiled eager step of Qwen3-30B-A3B-E32 (4 layers, 16 local experts, ep 2, TE's fused permute, 4 micro-batches,
# forward on the main thread, backward on autograd's; benchmarks/results/moe_graphs_h200_x2/profile/raw_traces/
# *.a6b9b446a9.rank_0.json.gz: 1728 / 2650 operations over 16 layer passes, 256 of each GEMM kind, 636 adds) less
# those: 108 - 2 x 16 = 76 forward, 166 - 6 x 16 = 70 backward. Held against a MoE block alone (Grok-1's tp4 ep2
# rank, 4 local experts, unfused permute, no DDP; moe_r7_h200_x2/grok/traces: 46 forward, 53 backward a block: 38 / 37
# less the GEMMs, which leaves 38 / 33 for attention and the rest) and four more steps (Qwen3-30B-A3B at 16 / 64 / 128
# local experts, unfused, 1 micro-batch of 4 layers: 64-72 forward and 32-51 backward over the count a pass, the
# embedding, loss and optimizer-side work of a 4-pass step). Experts with biases (gpt-oss) launch more per expert:
# the bias gradient's own epilogue and reduction kernels, memsets and elementwise ops; the slope between gpt-oss-20b's
# 16- and 32-local-expert steps (moe_timeline_h200/raw, 4 layers x 4 micro-batches each: 145 / 220 forward, 322.5 /
# 534.5 backward a pass) is 4.7 forward and 13.25 backward per local expert, of which 4 adds and 4 GEMMs.
MOE_LAUNCHES_PER_LAYER = (76.0, 70.0)
MOE_LAUNCHES_PER_LOCAL_EXPERT = {False: (2.0, 4.0), True: (4.7, 9.25)}  # by expert bias -> (forward, backward)
# Tensors an interleaved pipeline chunk pass frees while NCCL still holds them (ProcessGroupNCCL records its
# stream on p2p buffers): the forward's received and sent activations, the backward's received and sent gradients.
# In the allocator history of the tp2 pp2 vpp8 layout 47 activation-sized blocks (80 MiB) were awaiting their
# stream at the peak beside 12 layers' weight gradients: 4 per forward + backward pair.
P2P_TENSORS_PER_CHUNK_PASS = 4

# ---- SM sharing while overlapping TP communication (TE userbuffers) -----------------------------
# TE defaults: pipeline / bulk overlaps use 16 SMs for communication and set an SM margin on the
# GEMM; ring-exchange uses copy engines and 1 SM. The GEMM then runs on (SMs - num_sm) SMs.
UB_COMM_SMS = {"pipeline": 16, "bulk": 16, "ring_exchange": 1}

# ---- NCCL beside compute ---------------------------------------------------------------------
# An NVLink collective hidden under compute is not free: its kernel keeps one CTA per channel resident (24 CTAs
# for the 4-GPU ring reduce-scatter / all-gather in the H200 traces of benchmarks/results/scaling_pairs_h200_x4)
# and its copies share HBM. Share of a hidden collective's time that the compute beside it still loses: a bf16
# 8192^3 GEMM issued right after each collective on the other stream (benchmarks/nccl_interference.py), (GEMM +
# collective pair - GEMM alone) / collective alone, median of 2 and 4 ranks on 4x H200, NCCL 2.28.9
# (benchmarks/results/nccl_interference_h200/). Inter-node collectives were not measured and get none.
NCCL_OVERLAP_COST = {
    "reduce_scatter": 0.38,
    "all_gather": 0.51,
    "all_reduce": 0.39,
    "send_recv": 0.10,
    "all_to_all": 0.71,
}

# ---- Megatron defaults that shape overlap -----------------------------------------------------
# megatron-core DistributedDataParallelConfig: bucket_size = max(40_000_000, 1_000_000 * dp) params.
DDP_BUCKET_PARAMS = 40_000_000
# Optimizer step of megatron-core's distributed optimizer with TE's fused Adam, bytes per parameter of
# the local shard: the global grad-norm for clipping reads the fp32 grad (4), the clip scales it in
# place (8), Adam reads fp32 master weight, grad, m, v (16) and writes master, m, v (12), and the
# updated master weights are copied into the bf16 model weights (4 + 2): 46. In the H200 traces above
# these four kernels (`multi_tensor_l2norm`, `multi_tensor_scale`, `multi_tensor_adam`,
# `bfloat16_copy`) took 1.19 + 2.23 + 8.64 + 1.42 = 13.5 ms for a 1.01 G-parameter shard: 0.72 of HBM.
OPTIMIZER_BYTES_PER_PARAM = 46.0
OPTIMIZER_HBM_EFFICIENCY = 0.72
# Megatron-LM's default DDP (average_in_collective=False, per-sequence loss) multiplies every gradient
# bucket by 1/(dp*cp) in place before its reduce-scatter, on the compute stream: read + write fp32,
# 8 bytes per local parameter once per step when dp*cp > 1 (DP2 trace: 25 calls, 3.86 ms for
# 2.02 G parameters, 0.87 of HBM; absent from the TP2 trace).
GRAD_SCALE_BYTES_PER_PARAM = 8.0
# Zeroing the fp32 main-grad buffer before each iteration: 4 bytes per local parameter.
# Without gradient_accumulation_fusion (Megatron-LM's --no-gradient-accumulation-fusion; also forced off
# when APEX's fused_weight_gradient_mlp_cuda is missing, since megatron-core's output layer needs it) every
# micro-batch's backward writes a bf16 weight gradient and DDP's hook adds it into the fp32 main_grad:
# read main_grad (4) + read grad (2) + write main_grad (4) = 10 bytes per local parameter per micro-batch.
# That cast-add (`unrolled_elementwise_kernel<CUDAFunctor_add<float>, LoadWithCast<2>>`) ran at 0.54 of
# HBM on H200: 30.9 ms over 8 micro-batches x 1.009 G local parameters in the profiled TP2 step of
# benchmarks/results/validation_h200_x2 (traces/tp2_sp.summary.json: 280 calls = 35 parameters x 8).
# With the fusion on, the word embedding still takes this path (it is not a linear layer).
GRAD_ACCUMULATION_BYTES_PER_PARAM = 10.0
GRAD_ACCUMULATION_HBM_EFFICIENCY = 0.54
GRAD_ZERO_BYTES_PER_PARAM = 4.0
# The same passes with a bf16 main-grad buffer (--grad-reduce-in-bf16), by the same byte counting (not
# measured here; the efficiencies above are kept): accumulate read 2 + read 2 + write 2, scale read + write
# 2 + 2, zero 2; the optimizer step first casts its bf16 gradient shard to fp32 (read 2 + write 4) and
# then runs the fp32 kernels counted in OPTIMIZER_BYTES_PER_PARAM.
GRAD_ACCUMULATION_BYTES_PER_PARAM_BF16 = 6.0
GRAD_SCALE_BYTES_PER_PARAM_BF16 = 4.0
GRAD_ZERO_BYTES_PER_PARAM_BF16 = 2.0
OPTIMIZER_GRAD_CAST_BYTES_PER_PARAM_BF16 = 6.0
# The word embedding's backward (torch's dense embedding backward) zero-fills a bf16 gradient of the
# whole local table (2 bytes per vocab x hidden entry) every micro-batch before scattering into it:
# 370 us per micro-batch for 151936 x 4096 in the DP2 trace (184 us at TP2), 0.7 of HBM.
EMBEDDING_GRAD_FILL_BYTES_PER_PARAM = 2.0

# ---- fp8 casts ----------------------------------------------------------------------------------
# Bytes streamed per element when Transformer Engine quantizes a GEMM input (forward) or an output gradient
# (backward) on Hopper: delayed scaling takes the scale from the amax history and casts in one fused
# cast-transpose kernel (read bf16 2, write fp8 1 and its transpose 1: 4); per-tensor current scaling
# ("tensorwise") first reads the tensor once more for its amax (TE `nvte_compute_amax`, then the cast): 6,
# in two kernels. With sequence parallelism the amaxes of the gathered inputs are also all-reduced over the
# TP group (4-byte messages, latency only; not modelled). Byte counts from the kernels' inputs and outputs,
# not measured here for tensorwise; delayed scaling's 4 is what the H100 fp8 runs of
# benchmarks/results/validation_h100_x1 were predicted with.
# Blockwise scaling (TE Float8BlockScaling) finds each 1x128 tile's amax inside its quantize kernel
# (`block_scaled_1d_cast_transpose_kernel`) and writes the row-wise fp8 data, the column-wise (transposed) fp8 data,
# each with one fp32 scale per 128 elements: read 2, write 1 + 1 + 2 x 4/128. In the trace of "L3-8B s8192 fp8
# blockwise" (1x H100, TE 2.20.2; benchmarks/results/validation_h100_x1/fp8_blockwise) its 288 calls moved those
# bytes at 2.2 TB/s, as delayed scaling's cast-transpose did (2.25 TB/s); the norm cannot emit block-scaled fp8,
# so the inputs of qkv and fc1 get their own cast (288 calls vs 208).
FP8_CAST_BYTES_PER_ELEMENT = {"delayed": 4.0, "tensorwise": 6.0, "blockwise": 4.0625}
# ... of which the transpose, written only when autograd will need it (not in no_grad forward-only passes)
FP8_TRANSPOSE_BYTES_PER_ELEMENT = 1.0
FP8_CAST_KERNELS = {"delayed": 1, "tensorwise": 2, "blockwise": 1}
# GEMM time of a recipe relative to the per-tensor-scaled fp8 GEMM (`GEMM_EFFICIENCY["fp8"]`): blockwise scaling
# runs cuBLAS's block-scaled kernels (`nvjet_sm90_q*_Ablk128_Bvec128`, 128x128 tiles), which rescale the
# accumulator per 128-deep slice of the reduction. The 384 fp8 GEMMs of the same 4-layer step took 310.3 ms with
# blockwise scaling and 247.7 ms with delayed scaling (247.3 tensorwise; benchmarks/results/validation_h100_x1:
# fp8_blockwise and fp8_traces traces, 1x H100): 1.25x. The testbench's TE linear layers agree (fwd+bwd with
# casts: column-parallel fc1 5.90 vs 4.82 ms, row-parallel fc2 3.62 vs 2.72 ms).
FP8_GEMM_TIME_FACTOR = {"delayed": 1.0, "tensorwise": 1.0, "blockwise": 1.25}
# Once per step the fp8 weights are made: without fp8 parameters TE casts each bf16 TE linear weight at the
# first micro-batch (the same bytes per element as an activation cast, by recipe). With fp8 parameters
# (--fp8-param-gather) the optimizer still writes its bf16 copy of the updated master shard (counted in
# OPTIMIZER_BYTES_PER_PARAM; the H100 traces below show the same copy kernels with and without fp8 params), then
# TE's `cast_master_weights_to_fp8` quantizes that flat 1-D shard into the fp8 weight with
# `cast_transpose_general_kernel` (read bf16 2, write fp8 1 and its transpose 1: 4 bytes), a kernel that moves
# 64 elements per 128-thread block and runs far below HBM speed: in the trace of "L3-8B s8192 fp8 delayed
# fp8-params" (1x H100, TE 2.20.2, megatron-core 0.19.2; benchmarks/results/validation_h100_x1/fp8_traces) its
# 16 calls took 65.3 ms for 872 M parameters (12-18 G elements/s), 0.011 of 4.8 TB/s, SM-bound; the step was
# 6% longer than without fp8 params (1072 vs 1008 ms; tensorwise 1082 vs 1019). Current scaling first reads the
# master shard for its amax (fp32, 4 bytes, at streaming speed). After the parameter all-gather the transposes
# are rebuilt (megatron-core `post_all_gather_processing`: read 1, write 1 per local weight; 0.63 ms measured
# for the same 872 M).
# Blockwise scaling quantizes the shard with its own block-scaled kernel, at streaming speed: its fp8-params step
# took 1087.8 ms against 1086.0 without fp8 parameters (fp8_blockwise), so the slow kernel is the per-tensor
# recipes' only.
FP8_PARAM_CAST_BYTES_PER_PARAM = 4.0
FP8_PARAM_CAST_HBM_EFFICIENCY = 0.0111
FP8_PARAM_CAST_SM_BOUND_RECIPES = ("delayed", "tensorwise")
FP8_PARAM_AMAX_BYTES_PER_PARAM = {"delayed": 0.0, "tensorwise": 4.0, "blockwise": 0.0}
FP8_PARAM_TRANSPOSE_BYTES_PER_PARAM = 2.0

# ---- output layer -------------------------------------------------------------------------------
# Bytes streamed per local vocabulary entry per token by the vocab-parallel cross-entropy,
# (forward, backward), by implementation. te (--cross-entropy-loss-fusion --cross-entropy-fusion-impl te,
# Transformer Engine's Triton parallel_cross_entropy; Megatron-Bridge's performance overrides set it,
# scripts/performance/utils/overrides.py @ Megatron-Bridge 067f987): one pass reads the bf16 logits and writes
# fp32 partial results (8), backward writes the bf16 gradient from them (6); not measured here.
# native (--cross-entropy-loss-fusion, Megatron-LM's default impl: megatron-core fused_cross_entropy.py, five
# torch-compiled kernels over an fp32 copy of the logits): forward the cast + max (2 + 4), subtract, exp and sum
# (4 + 4), softmax divide (4 + 4) = 22; backward the one-hot subtract (4 + 4) and the multiply by the loss
# gradient with the cast to bf16 (4 + 2) = 14. In two H200 training traces (benchmarks/results/moe_fused_h200/
# profile: gpt-oss-120b-E16 at 16384 tokens x 201088 entries, Qwen3-30B-A3B at 4096 x 151936, 8 micro-batches each)
# they took 7.5 / 7.6 ps per entry forward and 4.3 / 4.3 backward: those 36 bytes at 0.64 of the H200's HBM. Unfused
# (megatron-core `vocab_parallel_cross_entropy(logits.float())`): cast to fp32 (2 + 4), max (4),
# subtract in place (8), exp (8), sum (4), divide in place (8) forward = 38; backward the one-hot
# subtract and the multiply by the loss gradient in place (8) and the cast back to bf16 (6) = 14.
# The unfused loss's kernels (torch's broadcasting in-place sub / div / mul, the bf16 -> fp32 cast)
# stream at 0.5-0.6 of HBM, exp / max / sum at 0.8-0.9: all of them together 0.62 of HBM for the
# 52 bytes in both H200 traces above (43.3 ms for 4 micro-batches x 4096 tokens x 151936 entries at
# TP1, 43.5 ms for 8 x 4096 x 75968 at TP2).
CROSS_ENTROPY_BYTES = {"te": (8.0, 6.0), "native": (22.0, 14.0), "unfused": (38.0, 14.0)}
CROSS_ENTROPY_HBM_EFFICIENCY = {"te": HBM_EFFICIENCY, "native": 0.64, "unfused": 0.62}

# ---- clamped GLU (gpt-oss) ---------------------------------------------------------------------------
# megatron-core clamps the two halves of a clamped GLU's input with torch ops on their strided views before the fused
# kernel (`layer._glu_clamp_work`). In a profiled 2-layer gpt-oss-120b-E16 training step on one H200 (micro-batch 4,
# 65536 routed rows x 2880; benchmarks/results/moe_fused_h200/profile, torch 2.11) the two forward clamps took
# 533 us each (8 bytes per element in all: 1.42 TB/s) and the backward's comparisons, logical and and masked selects
# 2.88 ms (22 bytes: 1.44 TB/s), both 0.30 of the H200's HBM; the concatenations streamed at the generic rate
# (393 / 392 us for 8 bytes).
GLU_CLAMP_HBM_EFFICIENCY = 0.30
