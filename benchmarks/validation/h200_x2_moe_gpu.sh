#!/bin/bash
# MoE evidence on nvidia-h200-x2 (2x H200) with GPU-bound micro-batches: Qwen3-30B-A3B shapes, 4 layers,
# 32k tokens per micro-batch (seq 8192 x 4, seq 4096 x 8) over EP2 / DP2 / TP2+SP+EP2 / PP2 / CP2+EP2, full
# recompute and forward-only (h200_x2_moe_gpu_layouts.json). At 4k tokens per micro-batch the eager MoE block
# waits on the host (moe_host/, moe_long/: steps moved 9-23% between leases); here the GPU work per MoE layer
# (predicted) is larger than the host floor the testbench measured, so the GPU sets the pace.
# Run from the repository root on the GPU machine (after ../shared/gpu install):
#     bash benchmarks/validation/h200_x2_moe_gpu.sh
# Writes under "$OUT" (default ./outputs/h200_x2_moe_gpu); target wall time < 9 min. One torch-profiler trace.
# Copy "$OUT"/evidence to benchmarks/results/validation_h200_x2/moe_gpu/.
OUT="${OUT:-$PWD/outputs/h200_x2_moe_gpu}"
source "$(dirname "$0")/common.sh"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$OUT/gpus.txt"

$VALIDATE --layouts "$HERE/h200_x2_moe_gpu_layouts.json" --output-dir "$OUT/moe_gpu" --timeout-s 120 \
  2>&1 | tee "$OUT/moe_gpu.txt"

EV="$OUT/evidence"
copy_runs "$OUT/moe_gpu" "$EV"
copy_traces "$OUT/moe_gpu" "$EV/traces"
cp "$OUT/gpus.txt" "$EV/"
du -sh "$EV"
echo "wall time: $(elapsed)"
