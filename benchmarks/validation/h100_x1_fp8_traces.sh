#!/bin/bash
# Rank-0 torch-profiler traces of three fp8 layouts of h100_x1_fp8_grads (delayed, tensorwise, delayed with fp8
# parameters; h100_x1_fp8_traces_layouts.json) on nvidia-h100-x1: where the fp8-params run's extra ~6% goes, and the
# amax / cast kernels of tensorwise. ~2.5 min. Run from the repository root on the GPU machine:
#     bash benchmarks/validation/h100_x1_fp8_traces.sh
# Copy "$OUT"/evidence (or unpack "$OUT"/evidence.tgz) to benchmarks/results/validation_h100_x1/fp8_traces.
OUT="${OUT:-$PWD/outputs/h100_x1_fp8_traces}"
source "$(dirname "$0")/common.sh"
record_gpus
validate_batch "$HERE/h100_x1_fp8_traces_layouts.json" run 150
collect_batch run "$OUT/evidence"
copy_traces "$OUT/run" "$OUT/evidence/traces"
finish "$OUT/evidence"
