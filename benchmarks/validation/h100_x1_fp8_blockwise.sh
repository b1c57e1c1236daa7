#!/bin/bash
# fp8 blockwise scaling (TE Float8BlockScaling, Megatron-LM --fp8-recipe blockwise) on nvidia-h100-x1, against the
# delayed and tensorwise recipes: how much slower its GEMMs and casts run, what its steps take and allocate.
# Run from the repository root on the GPU machine, in two parts (each under the device's 10-minute limit) that share
# one OUT folder (the steps resume: a finished layout is not run again):
#     OUT=/root/fp8_blockwise bash benchmarks/validation/h100_x1_fp8_blockwise.sh testbench  # cases, then steps (5 min)
#     OUT=/root/fp8_blockwise bash benchmarks/validation/h100_x1_fp8_blockwise.sh steps      # the rest, one profiled
#   1. testbench: Llama-3.1-8B s8192 column / row linear and decoder layer, fp8 delayed / tensorwise / blockwise
#      (benchmarks/testbench/h100_x1_fp8_blockwise_cases.json)
#   2. 4-layer Llama-3.1-8B s8192 steps (h100_x1_fp8_blockwise_layouts.json): delayed, blockwise, blockwise with fp8
#      parameters, blockwise forward-only; and a profiled blockwise step (h100_x1_fp8_blockwise_trace_layouts.json)
# Unpack "$OUT"/evidence.tgz into benchmarks/results/validation_h100_x1/fp8_blockwise.
OUT="${OUT:-$PWD/outputs/h100_x1_fp8_blockwise}"
source "$(dirname "$0")/common.sh"
EV="$OUT/evidence"
mkdir -p "$EV"
record_gpus
case "${1:-}" in
  testbench)
    $MAT profile --case-file "$HERE/../testbench/h100_x1_fp8_blockwise_cases.json" --repeats 10 --warmup 3 \
      --case-timeout 240 --output-dir "$OUT/testbench" --json > "$EV/testbench_summary.json"
    echo "testbench rc=$? ($(elapsed))"
    mkdir -p "$EV/testbench" && cp -r "$OUT/testbench/collect" "$EV/testbench/" 2>/dev/null
    timeout 300 $VALIDATE --layouts "$HERE/h100_x1_fp8_blockwise_layouts.json" --output-dir "$OUT/run" \
      --timeout-s 200 2>&1 | tee "$OUT/run.txt"
    ;;
  steps)
    validate_batch "$HERE/h100_x1_fp8_blockwise_layouts.json" run 200
    validate_batch "$HERE/h100_x1_fp8_blockwise_trace_layouts.json" trace 200
    copy_traces "$OUT/trace" "$EV/traces"
    ;;
  *) echo "usage: $0 testbench|steps"; exit 2 ;;
esac
collect_batch run "$EV"
finish "$EV"
