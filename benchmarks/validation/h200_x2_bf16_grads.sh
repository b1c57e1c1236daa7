#!/bin/bash
# bf16 main grads (Megatron-LM --grad-reduce-in-bf16, layout field grad_reduce_in_fp32=false) against fp32 on
# nvidia-h200-x2: 4 pairs of 4-layer Qwen3-8B layouts at s4096 (h200_x2_bf16_grads_layouts.json), expandable
# segments on. The cost model predicts 2 bytes per parameter less for the whole step, plus an fp32 copy of the
# optimizer's gradient shard during the optimizer step, which sets the peak where the activations are smaller
# than that copy (tp2 sp and dp2 without the distributed optimizer: 3.8 / 7.5 GiB), and half the DP gradient
# traffic. ~4 min. Run from the repository root on the GPU machine:
#     bash benchmarks/validation/h200_x2_bf16_grads.sh
# Copy "$OUT"/evidence (or unpack "$OUT"/evidence.tgz) to benchmarks/results/validation_h200_x2/bf16_grads.
OUT="${OUT:-$PWD/outputs/h200_x2_bf16_grads}"
source "$(dirname "$0")/common.sh"
record_gpus
validate_batch "$HERE/h200_x2_bf16_grads_layouts.json" run 150
collect_batch run "$OUT/evidence"
finish "$OUT/evidence"
