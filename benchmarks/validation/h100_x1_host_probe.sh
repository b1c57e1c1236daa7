#!/bin/bash
# One H100 (nvidia-h100-x1), #27: the dense host floor measured in the model, on the machine, before predicting.
# Part "run" (~10 min): `mat validate --measure-host-floor` on h100_x1_host_probe_layouts.json: the three small
#   Qwen3 shapes first issue 3 + 5 steps at 512 tokens (TP 1, micro-batch 1, training and forward-only) with each
#   layer's host time recorded (host_floor/probes), the floor from them predicts the 18 eager layouts (Qwen3-0.6B,
#   1.7B.L14, 4B.L8 at micro-batch 1 / 2 / 4, s4096, training and forward-only), written before each run, and each
#   run records its own layers' host times too (`Layout.host_timing`).
# Part "after" (~4 min): the same probes again into after/ (did the host's pace move during the lease?), and the
#   testbench's single decoder layers (h100_x1_host_no_grad_cases.json) for the floor the testbench would give.
# Part "pin" (~6 min): is the host's pace a property of the process? The Qwen3-0.6B probe (train and forward,
#   h100_x1_host_pinning_layouts.json) in six fresh processes, alternately free and pinned to four cores
#   (taskset -c 4-7, which its threads inherit), into pin/free_N and pin/pinned_N.
# Resumable: runs live in $RUNS, outside $OUT.
#     bash benchmarks/validation/h100_x1_host_probe.sh run|after|pin
# Unpack "$OUT"/evidence.tgz to benchmarks/results/validation_h100_x1/host_probe.
OUT="${OUT:-$PWD/outputs/h100_x1_host_probe}"
source "$(dirname "$0")/common.sh"
RUNS="${RUNS:-/root/runs/host_probe}"
record_gpus
EV="$OUT/evidence"
mkdir -p "$EV" "$RUNS"
LAYOUTS="${LAYOUTS:-$HERE/h100_x1_host_probe_layouts.json}"  # h200_x1_host_probe.sh passes its own
case "${1:?run|after|pin}" in
  run)
    $VALIDATE --layouts "$LAYOUTS" --output-dir "$RUNS/run" --timeout-s 240 --measure-host-floor \
      2>&1 | tee -a "$RUNS/run.log"
    ;;
  after)
    $PY -c "
from pathlib import Path
from megatron_autotuner.validate.host_floor import measure_host_floor
from megatron_autotuner.validate.layout import load_layouts_file
layouts, extra = load_layouts_file('$LAYOUTS')
measure_host_floor(layouts, extra['gpu'], Path('$RUNS/after/host_floor'))
" 2>&1 | tee -a "$RUNS/after.log"
    $MAT profile --case-file "$HERE/../testbench/h100_x1_host_no_grad_cases.json" --warmup 5 --repeats 20 \
      --case-timeout 240 --output-dir "$RUNS/testbench" --calibration-out "$RUNS/testbench/host_floor.calibration.json" \
      --json > "$RUNS/testbench-summary.json" 2>>"$RUNS/after.log"
    echo "testbench rc=$? ($(elapsed))" | tee -a "$RUNS/after.log"
    ;;
  pin)
    for n in 1 2; do
      $VALIDATE --layouts "$HERE/h100_x1_host_pinning_layouts.json" --output-dir "$RUNS/pin/free_$n" \
        --timeout-s 120 2>&1 | tee -a "$RUNS/pin.log"
      taskset -c 4-7 $VALIDATE --layouts "$HERE/h100_x1_host_pinning_layouts.json" \
        --output-dir "$RUNS/pin/pinned_$n" --timeout-s 120 2>&1 | tee -a "$RUNS/pin.log"
    done
    ;;
esac
for dir in "$RUNS"/pin/*/; do
  [ -d "$dir" ] && copy_runs "$dir" "$EV/pin/$(basename "$dir")"
done
# whatever exists so far, both parts
copy_runs "$RUNS/run" "$EV/run"
for part in run after; do
  hf="$RUNS/$part/host_floor"
  [ -d "$hf" ] || continue
  copy_runs "$hf/probes" "$EV/$part/host_floor/probes"
  cp "$hf/host_floor.calibration.json" "$EV/$part/host_floor/" 2>/dev/null
done
cp "$RUNS"/*.log "$EV/" 2>/dev/null
if [ -d "$RUNS/testbench" ]; then
  mkdir -p "$EV/testbench/collect"
  cp "$RUNS/testbench"/cases.json "$RUNS/testbench-summary.json" "$RUNS/testbench"/host_floor.calibration.json \
    "$EV/testbench/" 2>/dev/null
  cp "$RUNS/testbench"/collect/*.jsonl "$EV/testbench/collect/" 2>/dev/null
fi
cp "$OUT/gpus.txt" "$EV/" 2>/dev/null
finish "$EV"
