#!/bin/bash
# #37's multi-GPU memory bar, blind, on a 4-GPU H100 host under the default allocator setting (expandable segments):
# ten layouts no run had, covering TP 4, PP with VPP, uneven PP (pp4, and pp2 with two virtual stages), CP, DP, EP,
# TP x EP, TP x PP x VPP and a non-interleaved pipeline (x4_memory_blind_layouts.json).
# From the repository root on a 4-GPU host after ../shared/gpu's install (~8 min):
#     bash benchmarks/validation/x4_memory_blind.sh
# The predictions were written first (`mat validate --layouts benchmarks/validation/x4_memory_blind_layouts.json
# --dry-run --json` > benchmarks/results/memory_blind_h100_x4/predicted.json). Unpack "$OUT"/evidence.tgz there.
OUT="${OUT:-$PWD/outputs/x4_memory_blind}"
source "$(dirname "$0")/common.sh"
record_gpus
validate_batch "$HERE/x4_memory_blind_layouts.json" mem 150
collect_batch mem "$OUT/evidence"
finish "$OUT/evidence"
