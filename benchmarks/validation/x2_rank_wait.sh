#!/bin/bash
# #37, the wait across ranks on 2 GPUs (the 4-GPU batch, x4_rank_wait.sh, waits for a 4-GPU lease): Qwen1.5-MoE-A2.7B
# at 12 layers (60 experts top-4 and a shared expert) at ep 2 and ep 1, and Moonlight-16B-A3B at 8 layers at ep 1 (64
# local experts, the gather chains) and ep 2, each profiled with every layer's host issue time on every rank and
# every rank's trace summary kept (a collective's time on the rank that arrived last is its transfer; the other
# ranks' excess is the wait).
# From the repository root on a 2-GPU host after ../shared/gpu's install (~4 min):
#     bash benchmarks/validation/x2_rank_wait.sh
# The predictions were written first (`mat validate --layouts benchmarks/validation/x2_rank_wait_layouts.json
# --dry-run --json` > benchmarks/results/rank_wait_h200_x2/predicted.json). Unpack "$OUT"/evidence.tgz there.
OUT="${OUT:-$PWD/outputs/x2_rank_wait}"
source "$(dirname "$0")/common.sh"
record_gpus
validate_batch "$HERE/x2_rank_wait_layouts.json" wait 240
EV="$OUT/evidence"
collect_batch wait "$EV"
summarize_rank_traces wait "$EV/traces"
finish "$EV"
