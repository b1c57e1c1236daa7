#!/bin/bash
# One H200 (nvidia-h200): Grok-1's MoE block as one rank of dgxc's tp 4 ep 2 layout runs it, bf16 and fp8, beside
# Mixtral-8x7B's (benchmarks/grok_moe_block.py says why).                                                   ~2 min
# The predictions were written first (python benchmarks/grok_moe_block.py predict ->
# benchmarks/results/grok_moe_block_h200/predicted.json). From the repository root on the GPU machine:
#     bash benchmarks/testbench/h200_x1_grok_moe.sh
# Unpack "$OUT"/evidence.tgz in benchmarks/results/grok_moe_block_h200, then: python benchmarks/grok_moe_block.py
OUT="${OUT:-$PWD/outputs/h200_x1_grok_moe}"
source "$(dirname "$0")/../validation/common.sh"
record_gpus
EV="$OUT/evidence"
mkdir -p "$EV/testbench/collect"
record_versions "$EV"
$MAT profile --case-file "$HERE/h200_x1_grok_moe_cases.json" --warmup 5 --repeats 20 --case-timeout 240 \
  --output-dir "$OUT/testbench" --json > "$EV/summary.json"
echo "testbench rc=$? ($(elapsed))"
cp "$OUT/testbench"/collect/*.jsonl "$EV/testbench/collect/" 2>/dev/null
cp "$OUT/testbench"/cases.json "$EV/testbench/" 2>/dev/null
cp "$OUT/gpus.txt" "$EV/" 2>/dev/null
finish "$EV"
