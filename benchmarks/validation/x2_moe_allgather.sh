#!/bin/bash
# #40 on 2 GPUs: megatron-core's allgather dispatcher (Megatron-LM's default) against alltoall, Mixtral-8x7B at 2 layers
# and ep 2 on one host; the allgather step profiled so each all-gather / reduce-scatter's kernel time stands beside
# the model's (`layer.allgather_dispatch_s`). Default floors (the lease's device time left no floor measurement). The
# predictions were written first (`mat validate --layouts benchmarks/validation/x2_moe_allgather_layouts.json
# --dry-run --json` > benchmarks/results/moe_allgather_h200_x2/predicted_default.json).
# From the repository root on a 2-GPU host after ../shared/gpu's install (~3 min):
#     bash benchmarks/validation/x2_moe_allgather.sh
# Unpack "$OUT"/evidence.tgz in benchmarks/results/moe_allgather_h200_x2.
OUT="${OUT:-$PWD/outputs/x2_moe_allgather}"
source "$(dirname "$0")/common.sh"
record_gpus
validate_batch "$HERE/x2_moe_allgather_layouts.json" run 300
EV="$OUT/evidence"
collect_batch run "$EV"
summarize_rank_traces run "$EV/traces"
rank_waits run "$EV/traces"
finish "$EV"
