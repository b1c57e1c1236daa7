#!/bin/bash
# What MoE layers cost beyond their GEMMs, on one 4-GPU host (after ../shared/gpu's install), from the repository root:
#     bash benchmarks/validation/x4_moe_permute.sh        # ~5 min
#     bash benchmarks/validation/x4_moe_permute.sh memory # step 2 alone (~2 min)
# 1. benchmarks/moe_permute.py on GPU 0: megatron-core's token permute / sort-chunks / unpermute, unfused and TE-fused,
#    forward and backward, over token counts, hidden sizes, expert counts and top-k.
# 2. The allocator history of round 2's MoE layouts #1 (EP 2) and #3 (no EP) (x4_moe_memory_layouts.json: Qwen3-30B-A3B
#    with 32 experts, 12 layers, seq 8192, 4 GPUs), whose peaks came out 6% over the prediction: where the peak is.
# Copy "$OUT"/evidence.tgz's folder to benchmarks/results/moe_permute_<kind>/.
OUT="${OUT:-$PWD/outputs/x4_moe_permute}"
source "$(dirname "$0")/common.sh"
record_gpus
EV="$OUT/evidence"
mkdir -p "$EV"
[ "${1:-}" = memory ] || CUDA_VISIBLE_DEVICES=0 timeout -k 10 200 $PY benchmarks/moe_permute.py --out "$EV/moe_permute.json" 2>&1 | tail -40
validate_batch "$HERE/x4_moe_memory_layouts.json" moe_memory 200
collect_batch moe_memory "$EV/moe_memory"
copy_memory_histories moe_memory "$EV/moe_memory"
finish "$EV"
