#!/bin/bash
# One H100 (nvidia-h100-x1), #27: CUDA-graphed training (TE per-layer graphs, attn + mlp) beside the same layouts
# eager, Qwen3-0.6B (full depth), Qwen3-1.7B (14 layers) and Qwen3-4B (8 layers) at micro-batch 1 / 2 / 4, s4096
# (h100_x1_graphed_training_layouts.json: the training half of h100_x1_cuda_graphs_layouts.json, whose graphed
# runs failed at capture before the runner built DDP on a stream of its own). `mat validate` writes each
# prediction (committed default host floor) before its run. Resumable: a second call goes on where the first
# stopped (runs live in $RUNS, outside $OUT).
#     bash benchmarks/validation/h100_x1_graphed_training.sh
# Unpack "$OUT"/evidence.tgz to benchmarks/results/validation_h100_x1/graphed_training.
OUT="${OUT:-$PWD/outputs/h100_x1_graphed_training}"
source "$(dirname "$0")/common.sh"
RUNS="${RUNS:-/root/runs/graphed_training}"
record_gpus
EV="$OUT/evidence"
mkdir -p "$EV" "$RUNS"
$VALIDATE --layouts "$HERE/h100_x1_graphed_training_layouts.json" --output-dir "$RUNS/runs" --timeout-s 240 \
  2>&1 | tee -a "$RUNS/run.log"
copy_runs "$RUNS/runs" "$EV"
cp "$RUNS/run.log" "$EV/run.log"
cp "$OUT/gpus.txt" "$EV/" 2>/dev/null
finish "$EV"
