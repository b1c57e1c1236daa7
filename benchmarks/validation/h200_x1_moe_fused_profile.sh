#!/bin/bash
# One H200 (nvidia-h200): two layouts of h200_x1_moe_fused.sh again with the torch profiler, to see where the steps
# went beside their predictions: gpt-oss-120b-E16 at micro-batch 4 (GPU-bound, 25% above its prediction) and
# Qwen3-30B-A3B at 128 experts (host-bound).                                                             ~3 min
#     MOE_HOST_CALIBRATION=/root/moe_host/calibration.json bash benchmarks/validation/h200_x1_moe_fused_profile.sh
# Copy "$OUT"/evidence to benchmarks/results/moe_fused_h200/profile.
OUT="${OUT:-$PWD/outputs/h200_x1_moe_fused_profile}"
source "$(dirname "$0")/common.sh"
record_gpus
EV="$OUT/evidence"
validate_batch "$HERE/h200_x1_moe_fused_profile_layouts.json" prof 240 --calibration "$MOE_HOST_CALIBRATION"
collect_batch prof "$EV"
copy_traces "$OUT/prof" "$EV/traces"
finish "$EV"
