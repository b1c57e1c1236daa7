#!/bin/bash
# One H100 (nvidia-h100-x1), 5 layouts, expandable segments on (h100_x1_moe_holes_layouts.json):
# - a 2-layer Qwen3-30B-A3B training step at s4096 in bf16 and in the fp8 recipe of Megatron-Bridge's H100 MoE
#   configs (tensorwise, fp8 params), both profiled: the MoE layer's GPU and host time on H100, the GPU of the
#   published Megatron-Bridge row;
# - forward-only passes with the caching allocator's history recorded (Qwen3-8B s8192 mbs4, Qwen3-30B-A3B s8192
#   mbs2 / mbs4): does the reserved-but-unallocated memory of the 2-GPU MoE forward-only miss (3.8 GiB with ep2)
#   appear without expert parallelism, and what requests make it.
# ~4 min. Run from the repository root on the GPU machine:
#     bash benchmarks/validation/h100_x1_moe_holes.sh
# Copy "$OUT"/evidence (or unpack "$OUT"/evidence.tgz) to benchmarks/results/validation_h100_x1/moe_holes.
OUT="${OUT:-$PWD/outputs/h100_x1_moe_holes}"
source "$(dirname "$0")/common.sh"
record_gpus
validate_batch "$HERE/h100_x1_moe_holes_layouts.json" run 150
EV="$OUT/evidence"
collect_batch run "$EV"
copy_traces "$OUT/run" "$EV/traces"
copy_memory_histories run "$EV"
ls -la "$OUT"/run/memory/*/ 2>/dev/null | head -20
finish "$EV"
