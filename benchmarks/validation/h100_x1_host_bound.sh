#!/bin/bash
# One H100 (nvidia-h100-x1), #27: small dense models, eager and CUDA-graphed, training and forward-only, micro-batch
# 1 / 2 / 4 at s4096 (h100_x1_cuda_graphs_layouts.json: Qwen3-0.6B at full depth, Qwen3-1.7B at 14 and Qwen3-4B at
# 8 layers), predicted before the runs twice:
# 1. with the committed default host floor (defaults.DENSE_HOST_FLOOR_*): `validate --dry-run --json`, written to
#    predictions_default.json before anything runs;
# 2. with the floor measured on this machine just before by benchmarks/testbench/h100_x1_host_floor.sh (its dense
#    floor only, $FLOOR, default /root/dense_host_floor.calibration.json): the predictions `mat validate` writes
#    next to each measurement.
# Run after h100_x1_host_floor.sh on the same machine:   bash benchmarks/validation/h100_x1_host_bound.sh
# Unpack "$OUT"/evidence.tgz to benchmarks/results/validation_h100_x1/host_bound.
OUT="${OUT:-$PWD/outputs/h100_x1_host_bound}"
source "$(dirname "$0")/common.sh"
record_gpus
FLOOR="${FLOOR:-/root/dense_host_floor.calibration.json}"
EV="$OUT/evidence"
mkdir -p "$EV"
LAYOUTS="$HERE/h100_x1_cuda_graphs_layouts.json"
$VALIDATE --layouts "$LAYOUTS" --dry-run --json > "$EV/predictions_default.json"
echo "default predictions rc=$? ($(elapsed))"
cp "$FLOOR" "$EV/dense_host_floor.calibration.json"
validate_batch "$LAYOUTS" runs 240 --calibration "$FLOOR"
collect_batch runs "$EV"
finish "$EV"
