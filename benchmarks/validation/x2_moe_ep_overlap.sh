#!/bin/bash
# #40 on 2 GPUs: the EP all-to-all (alltoall dispatcher, TE's fused permute as NVIDIA's MoE recipes run it) with and
# without megatron-core's overlap (--overlap-moe-expert-parallel-comm, with and without --delay-wgrad-compute), a
# token-dropping layout (capacity 1.0, padded), and the ranking of EP sizes (ep 1 vs ep 2 at dp 2) for two MoE models:
# gpt-oss-20b at 4 layers (its own sliding-window / sink attention and clamped SwiGLU experts) and Mixtral-8x7B at 2.
# The ep 2 layouts with and without the overlap are profiled (every rank's trace summary kept).
# From the repository root on a 2-GPU host after ../shared/gpu's install (~7 min):
#     bash benchmarks/validation/x2_moe_ep_overlap.sh
# The predictions were written first (`mat validate --layouts benchmarks/validation/x2_moe_ep_overlap_layouts.json
# --dry-run --json` > benchmarks/results/moe_ep_overlap_h200_x2/predicted.json). Unpack "$OUT"/evidence.tgz there.
OUT="${OUT:-$PWD/outputs/x2_moe_ep_overlap}"
source "$(dirname "$0")/common.sh"
record_gpus
validate_batch "$HERE/x2_moe_ep_overlap_layouts.json" run 300
EV="$OUT/evidence"
collect_batch run "$EV"
summarize_rank_traces run "$EV/traces"
rank_waits run "$EV/traces"
finish "$EV"
