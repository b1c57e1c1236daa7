#!/bin/bash
# One H200 (nvidia-h200): 2-layer MoE training steps with token dropping (--moe-expert-capacity-factor, with and
# without --moe-pad-expert-input-to-capacity) and TE's fused permute, routing force-balanced, beside a dropless
# control. The predictions were written first by the default model (predicted.json: `mat validate --layouts ...
# --dry-run --json`).                                                                                      ~4 min
#     bash benchmarks/validation/h200_x1_moe_token_drop.sh
# Copy "$OUT"/evidence to benchmarks/results/moe_token_drop_h200.
OUT="${OUT:-$PWD/outputs/h200_x1_moe_token_drop}"
source "$(dirname "$0")/common.sh"
record_gpus
EV="$OUT/evidence"
validate_batch "$HERE/h200_x1_moe_token_drop_layouts.json" run 240
collect_batch run "$EV"
finish "$EV"
