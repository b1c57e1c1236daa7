#!/bin/bash
# #40 on 2 GPUs, sixth round: the MoE host floor measured in three processes per case (`--measure-host-floor`,
# `host_floor.HOST_FLOOR_ROUNDS`) on a host none of the rounds before had, then gpt-oss-20b and Mixtral-8x7B at ep 1
# and ep 2 predicted with it before they run. Round 5 fitted a one-process floor whose slope put gpt-oss ep 1 14% over
# its step. The predictions with the default floors were written first (`mat validate --layouts
# benchmarks/validation/x2_moe_r6_layouts.json --dry-run --json` > benchmarks/results/moe_r6_h200_x2/predicted_default.json);
# the ones with this host's floors are in results.jsonl, made after the floors and before the steps.
# From the repository root on a 2-GPU host after ../shared/gpu's install (~5 min):
#     bash benchmarks/validation/x2_moe_r6.sh
# Unpack "$OUT"/evidence.tgz in benchmarks/results/moe_r6_h200_x2.
OUT="${OUT:-$PWD/outputs/x2_moe_r6}"
source "$(dirname "$0")/common.sh"
record_gpus
validate_batch "$HERE/x2_moe_r6_layouts.json" run 300 --measure-host-floor
EV="$OUT/evidence"
collect_batch run "$EV"
copy_host_floor run "$EV"
finish "$EV"
