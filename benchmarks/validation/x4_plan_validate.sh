#!/bin/bash
# `mat plan --validate` end to end on one 4-GPU host, and TE userbuffers TP overlap in the validate runner
# (~4 min). From the repository root on the GPU machine, after ../shared/gpu's install:
#     bash benchmarks/validation/x4_plan_validate.sh
# 1. mat plan --validate 2 for Qwen3-1.7B (full depth, seq 4096, global batch 16): the plan's predictions (plan.json,
#    written before the runs), what ran, the measured winner and the regret (plan.json "validation", --json).
# 2. x4_tp_overlap_layouts.json: Qwen3-8B at 16 layers, TP 4 + SP, seq 8192, without TP overlap, with TE's default
#    userbuffers and with the TP 4 yaml the tuner wrote (benchmarks/results/overlap_h200_x4), predicted before.
# Evidence: "$OUT"/evidence.tgz -> benchmarks/results/plan_validate_<h100|h200>_x4/ (the kind lent).
OUT="${OUT:-$PWD/outputs/x4_plan_validate}"
source "$(dirname "$0")/common.sh"
record_gpus
case "$(head -1 "$OUT/gpus.txt")" in *H100*) GPU=H100-SXM ;; *) GPU=H200 ;; esac
echo "== plan --validate 2 ($GPU)"
timeout 150 $MAT plan --model Qwen3-1.7B --gpu $GPU --num-gpus 4 --seq-len 4096 --global-batch-size 16 \
  --validate 2 --no-chart --output-dir "$OUT/plan" --json > "$OUT/plan.stdout.json" 2> "$OUT/plan.stderr.txt"
echo "plan rc=$?"
tail -5 "$OUT/plan.stderr.txt"
echo "== TP overlap in the runner"
timeout 150 $VALIDATE --layouts "$HERE/x4_tp_overlap_layouts.json" --gpu $GPU --output-dir "$OUT/tp_overlap" --timeout-s 100 \
  2>&1 | tee "$OUT/tp_overlap.txt"
EV="$OUT/evidence"
mkdir -p "$EV/plan"
cp "$OUT/plan/plan.json" "$OUT/plan.stdout.json" "$OUT/plan.stderr.txt" "$EV/plan/" 2>/dev/null
copy_runs "$OUT/plan/validate" "$EV/plan/validate"
collect_batch tp_overlap "$EV/tp_overlap"
finish "$EV"
