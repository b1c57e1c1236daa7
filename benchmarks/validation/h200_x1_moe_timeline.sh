#!/bin/bash
# #40 on one H200: where an eager gpt-oss-20b layer's time goes, in the model. On host F (moe_r7_h200_x2) its dropless
# ep 1 layers (32 local experts) took 19.2 ms forward at 4096 tokens against 9.5 ms at 512, where the testbench block
# took 7.7 ms and the model gives the layer ~2.5 ms of GPU; its padded layers (16 local experts) issued in 10.5 ms
# against the model's ~8 ms (padded_host_h200). A torch-profiler trace of each, with every layer's host time, says
# which kernels and which host waits fill them. The predictions were written first (`mat validate --layouts
# benchmarks/validation/h200_x1_moe_timeline_layouts.json --dry-run --json` >
# benchmarks/results/moe_timeline_h200/predicted_default.json).
# From the repository root on a 1-GPU host after ../shared/gpu's install (~3 min):
#     bash benchmarks/validation/h200_x1_moe_timeline.sh
# Unpack "$OUT"/evidence.tgz in benchmarks/results/moe_timeline_h200; the raw rank traces come back beside it in
# "$OUT"/raw (kept out of the repository: `mat trace` reads them).
OUT="${OUT:-$PWD/outputs/h200_x1_moe_timeline}"
source "$(dirname "$0")/common.sh"
record_gpus
mkdir -p "$OUT/raw"
validate_batch "$HERE/h200_x1_moe_timeline_layouts.json" run 300
EV="$OUT/evidence"
collect_batch run "$EV"
summarize_rank_traces run "$EV/traces"
for trace in "$OUT"/run/traces/*/rank_0.json.gz; do
  [ -f "$trace" ] && cp "$trace" "$OUT/raw/$(basename "$(dirname "$trace")").rank_0.json.gz"
done
finish "$EV"
