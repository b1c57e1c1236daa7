#!/bin/bash
# #40 on one H200: padded (token-dropping) MoE steps whose default-floor predictions missed (Qwen3-30B-A3B-E16 at
# micro-batch 1 paced by the default host floor, Mixtral's lead over the GPU), with this host's floors measured first
# (`--measure-host-floor`) so that each run also predicts with its own host's pace (results.jsonl), every layer's host
# issue timed. The default-floor predictions were written before the lease (`mat validate --layouts
# benchmarks/validation/h200_x1_padded_floor_layouts.json --dry-run --json` >
# benchmarks/results/padded_floor_h200/predicted_default.json).                                     ~6 min
#     bash benchmarks/validation/h200_x1_padded_floor.sh
# Unpack "$OUT"/evidence.tgz in benchmarks/results/padded_floor_h200.
OUT="${OUT:-$PWD/outputs/h200_x1_padded_floor}"
source "$(dirname "$0")/common.sh"
record_gpus
validate_part h200_x1_padded_floor_layouts.json
