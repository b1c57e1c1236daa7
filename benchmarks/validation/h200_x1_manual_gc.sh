#!/bin/bash
# One H200 (nvidia-h200): host-bound eager training steps with Python's automatic garbage collector (Megatron-LM's
# default) and with Megatron-LM's --manual-gc (collector off for the steps, as Megatron-Bridge's performance runs set
# it), pair by pair: Qwen3-0.6B (dense), a 4-layer Qwen3-30B-A3B-E16 (dropless, fused permute) and one rank of dgxc's
# Grok-1 proxy MoE block padded to capacity 1.0 (bf16, fp8), each layer's host issue timed (batch `run`); then the
# dense and dropless pairs again in the other order, 12 timed steps each (batch `reversed`), so that a drift of the
# machine over the runs does not read as the collector's effect. The predictions were written first
# (predicted.json: `mat validate --layouts ... --dry-run --json`).                               ~6 + 4 min
#     bash benchmarks/validation/h200_x1_manual_gc.sh            # PART=run or PART=reversed: one batch
# Copy "$OUT"/evidence to benchmarks/results/manual_gc_h200.
OUT="${OUT:-$PWD/outputs/h200_x1_manual_gc}"
source "$(dirname "$0")/common.sh"
record_gpus
EV="$OUT/evidence"
if [ "${PART:-all}" != reversed ]; then
  validate_batch "$HERE/h200_x1_manual_gc_layouts.json" run 300
  collect_batch run "$EV"
fi
if [ "${PART:-all}" != run ]; then
  validate_batch "$HERE/h200_x1_manual_gc_reversed_layouts.json" reversed 300
  collect_batch reversed "$EV/reversed"
fi
finish "$EV"
