#!/bin/bash
# One H200 (nvidia-h200): 2-layer MoE training steps with TE's fused token permute (gpt-oss-120b and Qwen3-30B-A3B
# shapes at 16 / 4 / 128 experts, one unfused beside them), predicted by `mat validate` with the MoE host floors this
# machine measured minutes before (benchmarks/testbench/h200_x1_moe_host.sh writes them to
# $MOE_HOST_CALIBRATION).                                                                                ~5 min
# The predictions made without that measurement (the default floors) are committed beside the evidence
# (predicted_default.json: `mat validate --layouts ... --dry-run`). From the repository root on the GPU machine:
#     MOE_HOST_CALIBRATION=/root/moe_host/calibration.json bash benchmarks/validation/h200_x1_moe_fused.sh
# Copy "$OUT"/evidence to benchmarks/results/moe_fused_h200.
OUT="${OUT:-$PWD/outputs/h200_x1_moe_fused}"
source "$(dirname "$0")/common.sh"
record_gpus
EV="$OUT/evidence"
mkdir -p "$EV"
cp "$MOE_HOST_CALIBRATION" "$EV/calibration.json"
validate_batch "$HERE/h200_x1_moe_fused_layouts.json" run 240 --calibration "$MOE_HOST_CALIBRATION"
collect_batch run "$EV"
finish "$EV"
