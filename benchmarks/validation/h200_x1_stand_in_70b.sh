#!/bin/bash
# Full-depth Llama-3.1-70B layouts for 64 GPUs, memory measured on ONE H200 (nvidia-h200): `mat validate
# --stand-in` runs the first rank of each of the 4 pipeline stages alone over torch's fake process group
# (layouts h200_x1_stand_in_70b_layouts.json: the NeMo 2.0 recipe of the published dgxc-benchmarking row, tp4 pp4
# vpp5 cp2, and tp8 pp4 vpp5; seq 8192, 16 micro-batches instead of the recipe's 64, which fills the
# interleaved pipeline as far; expandable segments). ~1 min per stand-in, 8 in all: the script stops itself
# after $BUDGET_S seconds (default 540) and a second call resumes where it stopped. From the repository root:
#     bash benchmarks/validation/h200_x1_stand_in_70b.sh
# Copy "$OUT"/evidence (or unpack "$OUT"/evidence.tgz) to benchmarks/results/validation_h200_x1/stand_in_70b.
OUT="${OUT:-$PWD/outputs/h200_x1_stand_in_70b}"
source "$(dirname "$0")/common.sh"
record_gpus
timeout "${BUDGET_S:-540}" $VALIDATE --layouts "$HERE/h200_x1_stand_in_70b_layouts.json" --stand-in \
  --output-dir "$OUT/run" --timeout-s 300 2>&1 | tee -a "$OUT/run.txt"
# the report of what has run so far (the timeout may have cut the run's own)
$VALIDATE --layouts "$HERE/h200_x1_stand_in_70b_layouts.json" --stand-in --output-dir "$OUT/run" --report-only \
  2>&1 | tail -8
EV="$OUT/evidence"
collect_batch run "$EV"
cp "$OUT"/run/jobs/*.log "$EV/runs/" 2>/dev/null
finish "$EV"
