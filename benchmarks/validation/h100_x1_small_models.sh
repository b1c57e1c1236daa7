#!/bin/bash
# One H100 (nvidia-h100-x1), #27: small dense models, Qwen3-0.6B (full depth), Qwen3-1.7B (14 layers) and Qwen3-4B
# (8 layers) at micro-batch 1 / 2 / 4, s4096, eager beside TE's per-layer CUDA graphs (attn + mlp):
#   graphed_training  the training half of h100_x1_cuda_graphs_layouts.json, run again once the runner built DDP on
#                     a stream of its own (before, every graphed training run failed at capture);
#   small_forward     the forward half, plus two eager training layouts again to see the lease's host pace.
# `mat validate` writes each prediction before its run. Resumable: a second call goes on where the first stopped
# (runs live in $RUNS, outside $OUT).
#     bash benchmarks/validation/h100_x1_small_models.sh graphed_training|small_forward
# Unpack "$OUT"/evidence.tgz to benchmarks/results/validation_h100_x1/NAME.
NAME="${1:?graphed_training|small_forward}"
OUT="${OUT:-$PWD/outputs/h100_x1_$NAME}"
source "$(dirname "$0")/common.sh"
RUNS="${RUNS:-/root/runs/$NAME}"
record_gpus
EV="$OUT/evidence"
mkdir -p "$EV" "$RUNS"
$VALIDATE --layouts "$HERE/h100_x1_${NAME}_layouts.json" --output-dir "$RUNS/runs" --timeout-s 240 \
  2>&1 | tee -a "$RUNS/run.log"
copy_runs "$RUNS/runs" "$EV"
cp "$RUNS/run.log" "$EV/run.log"
cp "$OUT/gpus.txt" "$EV/" 2>/dev/null
finish "$EV"
