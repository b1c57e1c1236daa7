#!/bin/bash
# Where the reserved-but-unallocated memory of the two expandable-segment misses comes from (the last stage of
# pp2 vpp2: 2.3 GiB; MoE forward-only: 3.8 GiB): 9 layouts on nvidia-h200-x2 with PyTorch's expandable segments and
# the caching allocator's history recorded (`memory_history`; layouts h200_x2_memory_holes_layouts.json): the two
# misses again, interleaved variants with larger logits (s8192, mbs2) and more chunks (vpp4), plain pp2, and
# forward-only passes with 2x / 4x the logits. ~6 min. Run from the repository root on the GPU machine:
#     bash benchmarks/validation/h200_x2_memory_holes.sh
# Copy "$OUT"/evidence (or unpack "$OUT"/evidence.tgz) to benchmarks/results/validation_h200_x2/memory_holes.
OUT="${OUT:-$PWD/outputs/h200_x2_memory_holes}"
source "$(dirname "$0")/common.sh"
record_gpus
validate_batch "$HERE/h200_x2_memory_holes_layouts.json" run 180
EV="$OUT/evidence"
collect_batch run "$EV"
# the replay of every rank's history (small); the raw snapshots stay on the machine except the smallest one
copy_memory_histories run "$EV"
ls -S -r "$OUT"/run/memory/*/rank_*.pickle.gz 2>/dev/null | head -1 | while read -r snap; do
  cp "$snap" "$EV/memory/$(basename "$(dirname "$snap")")/"
done
ls -la "$OUT"/run/memory/*/ 2>/dev/null | head -40
finish "$EV"
