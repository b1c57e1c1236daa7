#!/bin/bash
# One H100 (nvidia-h100-x1), #27: forward-only passes of small dense models, eager and with TE's per-layer CUDA
# graphs (attn + mlp), Qwen3-0.6B (full depth), Qwen3-1.7B (14 layers) and Qwen3-4B (8 layers) at micro-batch
# 1 / 2 / 4, s4096, predicted by the model with the launch-queue host term and the no-grad forward floor
# (h100_x1_small_forward_layouts.json: the forward half of h100_x1_cuda_graphs_layouts.json, plus two eager
# training layouts again to see this lease's host pace). `mat validate` writes each prediction before its run.
# Resumable: a second call goes on where the first stopped (runs live in $RUNS, outside $OUT).
#     bash benchmarks/validation/h100_x1_small_forward.sh
# Unpack "$OUT"/evidence.tgz to benchmarks/results/validation_h100_x1/small_forward.
OUT="${OUT:-$PWD/outputs/h100_x1_small_forward}"
source "$(dirname "$0")/common.sh"
RUNS="${RUNS:-/root/runs/small_forward}"
record_gpus
EV="$OUT/evidence"
mkdir -p "$EV" "$RUNS"
$VALIDATE --layouts "$HERE/h100_x1_small_forward_layouts.json" --output-dir "$RUNS/runs" --timeout-s 240 \
  2>&1 | tee -a "$RUNS/run.log"
copy_runs "$RUNS/runs" "$EV"
cp "$RUNS/run.log" "$EV/run.log"
cp "$OUT/gpus.txt" "$EV/" 2>/dev/null
finish "$EV"
