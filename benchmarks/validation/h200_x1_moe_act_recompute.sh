#!/bin/bash
# One H200 (nvidia-h200): gpt-oss's clamped GLU under --recompute-modules moe_act. megatron-core runs the whole expert
# activation (the clamps, their cat and the fused kernel) under CheckpointWithoutOutput, so the model keeps neither
# the clamped copy of fc1's output nor fc2's input and redoes the clamps in the backward; the published gpt-oss rows
# recompute moe_act. The 2-layer gpt-oss-120b-E16 step of micro-batch 4, with and without it.            ~4 min
# The predictions were written first (`mat validate --layouts benchmarks/validation/h200_x1_moe_act_recompute_layouts.json
# --dry-run --json` > benchmarks/results/moe_act_recompute_h200/predicted.json). From the repository root:
#     bash benchmarks/validation/h200_x1_moe_act_recompute.sh
# Unpack "$OUT"/evidence.tgz in benchmarks/results/moe_act_recompute_h200.
OUT="${OUT:-$PWD/outputs/h200_x1_moe_act_recompute}"
source "$(dirname "$0")/common.sh"
record_gpus
validate_batch "$HERE/h200_x1_moe_act_recompute_layouts.json" run 300
EV="$OUT/evidence"
collect_batch run "$EV"
finish "$EV"
