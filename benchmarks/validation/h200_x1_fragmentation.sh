#!/bin/bash
# One H200 (nvidia-h200), #27: where the reserved-but-unallocated memory of eager small-model training comes from.
# Six training layouts of h200_x1_host_probe_layouts.json (Qwen3-0.6B micro-batch 2 / 4, Qwen3-1.7B.L14 micro-batch
# 2 / 4, Qwen3-4B.L8 micro-batch 1 / 2; three of them miss 5% peak memory on every lease, three do not) again, with
# the caching allocator's history recorded (`--memory-history`), each predicted before it runs. ~4 min.
#     bash benchmarks/validation/h200_x1_fragmentation.sh
# Unpack "$OUT"/evidence.tgz to benchmarks/results/validation_h200_x1/fragmentation.
OUT="${OUT:-$PWD/outputs/h200_x1_fragmentation}"
source "$(dirname "$0")/common.sh"
record_gpus
validate_batch "$HERE/h200_x1_fragmentation_layouts.json" run 300
collect_batch run "$OUT/evidence"
copy_memory_histories run "$OUT/evidence"
finish "$OUT/evidence"
