#!/bin/bash
# #37: a blind check of the expert-tensor-parallel token movement (`costmodel.layer.expert_tp_comm_s`), measured on
# one profiled Qwen3-235B layout before it was modelled: four MoE layouts with etp 2 / 4 / 1 on 4 GPUs, each profiled.
# From the repository root on a 4-GPU host after ../shared/gpu's install (~5 min):
#     bash benchmarks/validation/x4_etp_holdout.sh
# Runs x4_etp_holdout_layouts.json; the predictions were written first (`mat validate --layouts
# benchmarks/validation/x4_etp_holdout_layouts.json --dry-run --json` > benchmarks/results/etp_holdout_h200_x4/
# predicted.json). Unpack "$OUT"/evidence.tgz to benchmarks/results/etp_holdout_h200_x4/.
OUT="${OUT:-$PWD/outputs/x4_etp_holdout}"
source "$(dirname "$0")/common.sh"
record_gpus
validate_batch "$HERE/x4_etp_holdout_layouts.json" etp 240 --profile
collect_batch etp "$OUT/evidence"
copy_traces "$OUT/etp" "$OUT/evidence/traces"
# the summaries (time per category and collective) stay with the evidence; the 2 MB traces stay on the machine
mkdir -p "$OUT/traces" && mv "$OUT"/evidence/traces/*.json.gz "$OUT/traces/" 2>/dev/null
finish "$OUT/evidence"
