#!/bin/bash
# #40 on 2 GPUs: what an eager MoE layer's host time grows with at ep > 1. On two H200s gpt-oss-20b's MoE layers issued
# their forward in 12.7 ms at ep 2 (16 local experts of 32) against 11 ms at ep 1 (32 local), where the one-GPU floor
# (testbench, a copy of the model with as many experts as local ones) gives 4 ms less at 16 local experts
# (benchmarks/results/moe_ep_overlap_h200_x2_r2). These four layouts separate the local experts from the model's
# experts and from expert parallelism itself: 16 local of 16 (ep 1) against 16 local of 32 (ep 2), and 8 local of 16
# (ep 2) against 32 of 32 (ep 1); every rank's layer host times kept, this machine's floors measured first.
# From the repository root on a 2-GPU host after ../shared/gpu's install (~6 min):
#     bash benchmarks/validation/x2_moe_ep_host.sh
# The predictions with the default floors were written first (`mat validate --layouts
# benchmarks/validation/x2_moe_ep_host_layouts.json --dry-run --json` >
# benchmarks/results/moe_ep_host_h200_x2/predicted_default.json). Unpack "$OUT"/evidence.tgz there.
OUT="${OUT:-$PWD/outputs/x2_moe_ep_host}"
source "$(dirname "$0")/common.sh"
record_gpus
validate_batch "$HERE/x2_moe_ep_host_layouts.json" run 300 --measure-host-floor
EV="$OUT/evidence"
collect_batch run "$EV"
copy_host_floor run "$EV"
finish "$EV"
