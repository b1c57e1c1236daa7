#!/bin/bash
# #37: MoE peaks under full recompute / forward-only reserve 11-23 GiB beyond what they hold. From the repository root
# on a 2-GPU H200 host after ../shared/gpu's install (~8 min):
#     bash benchmarks/validation/x2_moe_fragmentation.sh
#     bash benchmarks/validation/x2_moe_fragmentation.sh recompute   # ~4 min
# Runs x2_moe_fragmentation_layouts.json (`python benchmarks/moe_fragmentation.py predict` wrote it and the predictions
# first): allocator histories of Qwen3-30B-A3B at 4 layers (EP 1 / EP 2, full recompute / none / forward-only), a
# control with expandable segments, and two profiled pp2 vpp4 steps. Unpack "$OUT"/evidence.tgz to
# benchmarks/results/moe_fragmentation_h200_x2/ and the rank-0 snapshots ("$OUT"/snapshots) to its snapshots/.
# recompute: x2_moe_recompute_layouts.json (`moe_fragmentation.py predict recompute`), the 128-expert block with and
# without full recompute, profiled and with host issue times; unpack to benchmarks/results/moe_recompute_h200_x2/.
# holdout: x2_moe_holdout_layouts.json (`moe_fragmentation.py predict holdout`, ~6 min), both ranks' snapshots and
# traces; unpack to benchmarks/results/moe_holdout_h200_x2/ (snapshots to its snapshots/).
OUT="${OUT:-$PWD/outputs/x2_moe_fragmentation}"
source "$(dirname "$0")/common.sh"
record_gpus
if [ "${1:-}" = recompute ]; then
  validate_batch "$HERE/x2_moe_recompute_layouts.json" recompute 300
  collect_batch recompute "$OUT/evidence"
  copy_traces "$OUT/recompute" "$OUT/evidence/traces"
  finish "$OUT/evidence"
  exit 0
fi
if [ "${1:-}" = holdout ]; then
  validate_batch "$HERE/x2_moe_holdout_layouts.json" holdout 300
  collect_batch holdout "$OUT/evidence"
  copy_memory_histories holdout "$OUT/evidence"
  copy_traces "$OUT/holdout" "$OUT/evidence/traces"
  for trace in "$OUT"/holdout/traces/*/rank_1.json.gz; do  # the other rank: does one wait for the other?
    [ -f "$trace" ] && cp "$trace" "$OUT/evidence/traces/$(basename "$(dirname "$trace")").rank_1.json.gz"
  done
  finish "$OUT/evidence"
  copy_memory_snapshots holdout "$OUT/snapshots" 0
  copy_memory_snapshots holdout "$OUT/snapshots" 1
  exit 0
fi
validate_batch "$HERE/x2_moe_fragmentation_layouts.json" frag 300
collect_batch frag "$OUT/evidence"
copy_memory_histories frag "$OUT/evidence"
copy_traces "$OUT/frag" "$OUT/evidence/traces"
copy_memory_snapshots frag "$OUT/snapshots" 0
finish "$OUT/evidence"
