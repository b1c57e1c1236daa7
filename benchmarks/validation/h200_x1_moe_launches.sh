#!/bin/bash
# #40 on one H200: padded (token-dropping) MoE steps, whose host never waits for the token counts, predicted before the
# run with the MoE layer's launch count (predicted.json) and with a dense layer's (predicted_dense_launches.json). Four
# record the allocator history (what awaited its stream event at the reserved peak), two run plain (their peaks), two
# are profiled (launches per layer pass: `python benchmarks/moe_launches.py count`).                     ~7 min
#     bash benchmarks/validation/h200_x1_moe_launches.sh
# Unpack "$OUT"/evidence.tgz in benchmarks/results/moe_launches_h200.
OUT="${OUT:-$PWD/outputs/h200_x1_moe_launches}"
source "$(dirname "$0")/common.sh"
record_gpus
EV="$OUT/evidence"
validate_batch "$HERE/h200_x1_moe_launches_layouts.json" run 300
collect_batch run "$EV"
copy_memory_histories run "$EV"
mkdir -p "$EV/traces"
$PY benchmarks/moe_launches.py count "$OUT"/run/traces/*/rank_0.json.gz > "$EV/traces/launches.json"
for trace in "$OUT"/run/traces/*/rank_0.json.gz; do
  summarize_trace "$trace" "$EV/traces/$(basename "$(dirname "$trace")").summary.json"
  echo "$(basename "$(dirname "$trace")") $(stat -c %s "$trace")" >> "$EV/traces/trace_bytes.txt"
done
record_versions "$EV"
finish "$EV"
