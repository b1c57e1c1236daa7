#!/bin/bash
# One H200 (nvidia-h200): Qwen2.5-VL-7B's vision tower blocks as megatron-core TE layers with unmasked attention
# (benchmarks/vision_tower.py says why these cases): full-attention blocks over 1024- and 4096-patch images and
# windowed blocks over 64-patch windows, CUDA-event GPU time and the host's wall time per phase, TP 1.   ~2 min
# The predictions were written first (python benchmarks/vision_tower.py predict ->
# benchmarks/results/vision_tower_h200/predicted.json). From the repository root on the GPU machine:
#     bash benchmarks/testbench/h200_x1_vision.sh
# Unpack "$OUT"/evidence.tgz to benchmarks/results/vision_tower_h200, then: python benchmarks/vision_tower.py
OUT="${OUT:-$PWD/outputs/h200_x1_vision}"
source "$(dirname "$0")/../validation/common.sh"
record_gpus
EV="$OUT/evidence"
mkdir -p "$EV/collect"
record_versions "$EV"
$MAT profile --case-file "$HERE/h200_x1_vision_cases.json" --warmup 5 --repeats 20 --case-timeout 240 \
  --output-dir "$OUT/testbench" --json > "$EV/summary.json"
echo "testbench rc=$? ($(elapsed))"
cp "$OUT/testbench"/collect/*.jsonl "$EV/collect/" 2>/dev/null
cp "$OUT/gpus.txt" "$EV/" 2>/dev/null
finish "$EV"
