#!/bin/bash
# #40 on 2 GPUs, second round of x2_moe_ep_overlap.sh: the same layouts unprofiled, each layer's host issue time kept
# on every rank (host_timing), with this machine's host floors measured first (`--measure-host-floor`: the dense
# probes and the testbench MoE cases on one GPU) and the predictions made with them before each layout runs. The
# predictions with the default floors were written first (`mat validate --layouts
# benchmarks/validation/x2_moe_ep_overlap_r2_layouts.json --dry-run --json` >
# benchmarks/results/moe_ep_overlap_h200_x2_r2/predicted_default.json).
# From the repository root on a 2-GPU host after ../shared/gpu's install (~9 min):
#     bash benchmarks/validation/x2_moe_ep_overlap_r2.sh
# Unpack "$OUT"/evidence.tgz in benchmarks/results/moe_ep_overlap_h200_x2_r2.
OUT="${OUT:-$PWD/outputs/x2_moe_ep_overlap_r2}"
source "$(dirname "$0")/common.sh"
record_gpus
validate_batch "$HERE/x2_moe_ep_overlap_r2_layouts.json" run 300 --measure-host-floor
EV="$OUT/evidence"
collect_batch run "$EV"
copy_host_floor run "$EV"
finish "$EV"
