#!/bin/bash
# fp8 recipes / fp8 parameters and bf16 main grads on one H100 (nvidia-h100-x1), for sessions where no 2-GPU machine
# is lent: 11 layouts of 4-layer models, expandable segments on (h100_x1_fp8_grads_layouts.json):
# - Llama-3.1-8B s8192 fp8: delayed vs tensorwise (profiled both: the amax / cast kernels' time), each with and
#   without fp8 parameters (predicted peak 46.90 -> 45.28 GiB: 2 bytes per decoder parameter less), and forward-only
#   passes in fp8 (weights 4.39 GiB: bf16 + fp8 copy without transpose), fp8 with fp8 params (3.58) and bf16 (3.58);
# - Qwen3-8B s4096 bf16: fp32 vs bf16 main grads, with and without the distributed optimizer (predicted peak
#   42.07 -> 40.19 GiB).
# ~7 min. Run from the repository root on the GPU machine:
#     bash benchmarks/validation/h100_x1_fp8_grads.sh
# Copy "$OUT"/evidence (or unpack "$OUT"/evidence.tgz) to benchmarks/results/validation_h100_x1/fp8_grads.
OUT="${OUT:-$PWD/outputs/h100_x1_fp8_grads}"
source "$(dirname "$0")/common.sh"
record_gpus
validate_batch "$HERE/h100_x1_fp8_grads_layouts.json" run 150
collect_batch run "$OUT/evidence"
copy_traces "$OUT/run" "$OUT/evidence/traces"
finish "$OUT/evidence"
