#!/bin/bash
# #40 on 2 GPUs: the MoE backward's queued frees (costmodel.queued_frees, moe_synced_forward) on three layouts no run
# had: Mixtral-8x7B at 4 layers ep 2 and at micro-batch 2 ep 1, gpt-oss-20b at micro-batch 2 ep 1, each predicted
# with 4.2-4.9 GiB of a backward's weight gradients waiting at the reserved peak. This host's floors measured first. The predictions with the default floors were written first (`mat validate --layouts
# benchmarks/validation/x2_moe_queued_frees_layouts.json --dry-run --json` >
# benchmarks/results/moe_queued_frees_h200_x2/predicted_default.json).
# From the repository root on a 2-GPU host after ../shared/gpu's install (~4 min):
#     bash benchmarks/validation/x2_moe_queued_frees.sh
# Unpack "$OUT"/evidence.tgz in benchmarks/results/moe_queued_frees_h200_x2.
OUT="${OUT:-$PWD/outputs/x2_moe_queued_frees}"
source "$(dirname "$0")/common.sh"
record_gpus
validate_batch "$HERE/x2_moe_queued_frees_layouts.json" run 300 --measure-host-floor
EV="$OUT/evidence"
collect_batch run "$EV"
copy_host_floor run "$EV"
finish "$EV"
