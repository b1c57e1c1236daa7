#!/bin/bash
# #37: held-out MoE allocator histories on 4 GPUs (EP 4, TP 2 x EP 2, Mixtral-8x7B at EP 4). From the repository
# root on a 4-GPU host after ../shared/gpu's install (~6 min):
#     bash benchmarks/validation/x4_moe_holdout.sh
# Runs x4_moe_holdout_layouts.json (`python benchmarks/moe_fragmentation.py predict holdout4` wrote it and the
# predictions first). Unpack "$OUT"/evidence.tgz to benchmarks/results/moe_holdout_h200_x4/ and the rank 0 / 3
# snapshots ("$OUT"/snapshots) to its snapshots/.
OUT="${OUT:-$PWD/outputs/x4_moe_holdout}"
source "$(dirname "$0")/common.sh"
record_gpus
validate_batch "$HERE/x4_moe_holdout_layouts.json" holdout4 300
collect_batch holdout4 "$OUT/evidence"
copy_memory_histories holdout4 "$OUT/evidence"
finish "$OUT/evidence"
copy_memory_snapshots holdout4 "$OUT/snapshots" 0
copy_memory_snapshots holdout4 "$OUT/snapshots" 3
