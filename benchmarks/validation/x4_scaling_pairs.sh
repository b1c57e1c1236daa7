#!/bin/bash
# Pairs of layouts with the same work per GPU on 1-2 and on 4 GPUs of one host (benchmarks/scaling_pairs.py): what
# scaling out costs, measured beside what the cost model predicted before the run. Run from the repository root on
# a 4-GPU machine (nvidia-h200-x4 or -h100-x4), after ../shared/gpu's install:
#     bash benchmarks/validation/x4_scaling_pairs.sh      # ~8 min; stops starting layouts at DEADLINE_S (540 s)
# Rerun on the same machine, it resumes. The GPUs' SM clock and power are sampled every 0.5 s while it runs
# (clocks.csv), to tell a slower 4-GPU step from slower GPUs. Copy "$OUT"/evidence.tgz's folder to
# benchmarks/results/scaling_pairs_<kind>_x4/ and run `python benchmarks/scaling_pairs.py report`.
OUT="${OUT:-$PWD/outputs/x4_scaling_pairs}"
source "$(dirname "$0")/common.sh"
DEADLINE_S="${DEADLINE_S:-540}"
record_gpus
case "$(head -1 "$OUT/gpus.txt")" in
  *H200*) KIND=h200 ;;
  *H100*) KIND=h100 ;;
  *) echo "not an H100 or H200: $(head -1 "$OUT/gpus.txt")"; exit 3 ;;
esac
nvidia-smi --query-gpu=timestamp,index,clocks.sm,clocks.mem,power.draw,temperature.gpu,utilization.gpu \
  --format=csv,noheader -lms 500 > "$OUT/clocks.csv" &
SAMPLER=$!
trap 'kill $SAMPLER 2>/dev/null' EXIT
t=$(( DEADLINE_S - ($(date +%s) - START) ))
timeout -k 15 "$t" $VALIDATE --layouts "$HERE/x4_scaling_pairs_${KIND}_layouts.json" --output-dir "$OUT/pairs" \
  --timeout-s 150 2>&1 | tee "$OUT/pairs.txt"
kill $SAMPLER 2>/dev/null

EV="$OUT/evidence"
collect_batch pairs "$EV"
copy_traces "$OUT/pairs" "$EV/traces"
gzip -c "$OUT/clocks.csv" > "$EV/clocks.csv.gz"
finish "$EV"
