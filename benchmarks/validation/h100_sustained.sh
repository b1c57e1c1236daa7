#!/bin/bash
# Sustained load on nvidia-h100-x1: do GEMMs and real training steps slow down after a minute of
# flat-out work (power / thermal limits), and does `dtype: fp8` in the testbench run fp8 GEMMs?
# Run from the repository root on the GPU machine (after ../shared/gpu install):
#     bash benchmarks/validation/h100_sustained.sh
# Writes under "$OUT" (default ./outputs/h100_sustained); target wall time < 9 min:
#   1. 90 s of back-to-back 8192^3 bf16 products, TFLOP/s per second (sustained_gemm.py)     ~1.6 min
#   2. the testbench cases of h100_x1_cases.json again (bf16 and fp8)                           ~2 min
#   3. two 4-layer training runs of 150 / 200 timed steps (h100_sustained_layouts.json)          ~4 min
# with nvidia-smi sampling SM clock / power / temperature every 500 ms throughout (gpu_samples.csv).
# Copy "$OUT"/evidence to benchmarks/results/validation_h100_x1/sustained/.
OUT="${OUT:-$PWD/outputs/h100_sustained}"
source "$(dirname "$0")/common.sh"
EV="$OUT/evidence"
mkdir -p "$EV"
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu --format=csv,nounits -lms 500 > "$EV/gpu_samples.csv" &
SMI=$!
echo "== 1: sustained GEMM"
$PY "$HERE/sustained_gemm.py" --seconds 90 --out "$EV/sustained_gemm.json"
echo "== 2: testbench cases ($(elapsed))"
$MAT profile --case-file "$HERE/../testbench/h100_x1_cases.json" --repeats 10 --warmup 3 \
  --case-timeout 240 --output-dir "$OUT/testbench" --json > "$EV/testbench_summary.json"
echo "testbench rc=$? ($(elapsed))"
echo "== 3: long training runs"
$VALIDATE --layouts "$HERE/h100_sustained_layouts.json" --output-dir "$OUT/long" --timeout-s 300 \
  2>&1 | tail -20
copy_runs "$OUT/long" "$EV/long"
kill $SMI
gzip -f "$EV/gpu_samples.csv"
du -sh "$EV"
echo "wall time: $(elapsed)"
