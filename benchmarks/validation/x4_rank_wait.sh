#!/bin/bash
# #37, the open MoE misses of round 5 (docs/accuracy.md): the wait across ranks at each rank-synchronising
# collective. Qwen1.5-MoE-A2.7B's #1 (dp4 ep4, all 24 layers; its step ran 12% over the prediction) and Moonlight's
# #1 / #4 (dp4 with 64 local experts, whose gather chains' first calls waited 0.4-4.1 ms on rank 0; ep4, whose
# all-to-alls ran 86 ms against 59 ms modelled), each profiled with every layer's host issue time, every rank's trace
# summary kept (a collective's time on the rank that arrived last is its transfer; the others' excess is the wait).
# From the repository root on a 4-GPU host after ../shared/gpu's install (~4 min):
#     bash benchmarks/validation/x4_rank_wait.sh
# The predictions were written first (`mat validate --layouts benchmarks/validation/x4_rank_wait_layouts.json
# --dry-run --json` > benchmarks/results/rank_wait_h200_x4/predicted.json). Unpack "$OUT"/evidence.tgz there.
OUT="${OUT:-$PWD/outputs/x4_rank_wait}"
source "$(dirname "$0")/common.sh"
record_gpus
validate_batch "$HERE/x4_rank_wait_layouts.json" wait 240
EV="$OUT/evidence"
collect_batch wait "$EV"
summarize_rank_traces wait "$EV/traces"
finish "$EV"
