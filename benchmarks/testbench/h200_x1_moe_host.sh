#!/bin/bash
# One H200 (nvidia-h200): the eager MoE block's host time with TE's fused token permute and without, per local expert
# count and per MoELayer step (benchmarks/moe_host.py says why these cases), bf16 and fp8 tensorwise.       ~5 min
# The predictions were written first (python benchmarks/moe_host.py predict ->
# benchmarks/results/moe_host_h200/predicted.json). From the repository root on the GPU machine:
#     bash benchmarks/testbench/h200_x1_moe_host.sh
# Copy "$OUT"/evidence to benchmarks/results/moe_host_h200, then: python benchmarks/moe_host.py
OUT="${OUT:-$PWD/outputs/h200_x1_moe_host}"
source "$(dirname "$0")/../validation/common.sh"
record_gpus
EV="$OUT/evidence"
mkdir -p "$EV/testbench/collect"
record_versions "$EV"
$MAT profile --case-file "$HERE/h200_x1_moe_host_cases.json" --warmup 5 --repeats 20 --case-timeout 240 \
  --output-dir "$OUT/testbench" --calibration-out "$EV/calibration.json" --json > "$EV/summary.json"
echo "testbench rc=$? ($(elapsed))"
cp "$OUT/testbench"/collect/*.jsonl "$EV/testbench/collect/" 2>/dev/null
cp "$OUT/testbench"/cases.json "$EV/testbench/" 2>/dev/null
cp "$OUT/gpus.txt" "$EV/" 2>/dev/null
finish "$EV"
