#!/bin/bash
# #39: does a packed forward pass of many growing micro-batches stop at the device? From the repository root on a
# 1-GPU H100 machine after ../shared/gpu's install (~5 min):
#     bash benchmarks/validation/h100_x1_release_limit.sh
# Runs h100_x1_release_limit_layouts.json (`python benchmarks/release_limit.py predict` wrote it and the predictions
# first) with the allocator's history. Unpack "$OUT"/evidence.tgz to benchmarks/results/release_limit_h100/ and the
# snapshots ("$OUT"/snapshots) to its snapshots/.
OUT="${OUT:-$PWD/outputs/h100_x1_release_limit}"
source "$(dirname "$0")/common.sh"
record_gpus
validate_batch "$HERE/h100_x1_release_limit_layouts.json" release 400
collect_batch release "$OUT/evidence"
copy_memory_histories release "$OUT/evidence"
finish "$OUT/evidence"
copy_memory_snapshots release "$OUT/snapshots" 0
