#!/bin/bash
# Full-depth Llama-3.1-405B in NVIDIA's 1024-GPU H100 FP8-CS recipe (tests/fixtures/launches/llama31_405b_h100_1024gpu_fp8cs.sh:
# tp8 pp8 vpp8 cp2, --account-for-embedding-in-pipeline-split --account-for-loss-in-pipeline-split, written as
# the equivalent layout string "Et|(tt|)*62tL"; fp8 tensorwise with fp8 parameters, bf16 main grads, seq 8192),
# memory measured on ONE H200 (nvidia-h200): `mat validate --stand-in` runs the first rank of each of the 8
# pipeline stages alone over torch's fake process group (layouts h200_x1_stand_in_405b_layouts.json: 16
# micro-batches instead of the recipe's 192, which fills the interleaved pipeline as far: 2(pp-1) + (vpp-1)pp + 1
# = 71 chunk-micro-batches in flight on the first stage; expandable segments). The predictions are written to
# layouts.json before anything runs. The script stops itself after $BUDGET_S seconds (default 540) and a second
# call resumes where it stopped. From the repository root:
#     bash benchmarks/validation/h200_x1_stand_in_405b.sh
# Copy "$OUT"/evidence (or unpack "$OUT"/evidence.tgz) to benchmarks/results/validation_h200_x1/stand_in_405b.
# LAYOUTS=benchmarks/validation/h200_x1_stand_in_405b_bf16_layouts.json: the same layout in bf16 (-> stand_in_405b_bf16)
OUT="${OUT:-$PWD/outputs/h200_x1_stand_in_405b}"
source "$(dirname "$0")/common.sh"
LAYOUTS="${LAYOUTS:-$HERE/h200_x1_stand_in_405b_layouts.json}"
record_gpus
timeout "${BUDGET_S:-540}" $VALIDATE --layouts "$LAYOUTS" --stand-in \
  --output-dir "$OUT/run" --timeout-s 300 2>&1 | tee -a "$OUT/run.txt"
# the report of what has run so far (the timeout may have cut the run's own)
$VALIDATE --layouts "$LAYOUTS" --stand-in --output-dir "$OUT/run" --report-only \
  2>&1 | tail -8
EV="$OUT/evidence"
collect_batch run "$EV"
cp "$OUT"/run/jobs/*.log "$EV/runs/" 2>/dev/null
finish "$EV"
