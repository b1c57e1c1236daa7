#!/bin/bash
# #40 on one H200, blind: padded gpt-oss layouts on a host none of the rounds had, after the model learned that
# gpt-oss's experts stop the host in their activation (`costmodel.layer.experts_activation_syncs_host`,
# benchmarks/results/moe_timeline_h200). Two of the three shapes no run had (capacity 1.5; 8192 tokens). The host's
# three-process MoE floors are measured first (`--measure-host-floor`) and the layouts predicted with them before they
# run (results.jsonl); the predictions with the default floors were written before the lease (`mat validate --layouts
# benchmarks/validation/h200_x1_padded_blind_layouts.json --dry-run --json` >
# benchmarks/results/padded_blind_h200/predicted_default.json).
# From the repository root on a 1-GPU host after ../shared/gpu's install (~4 min):
#     bash benchmarks/validation/h200_x1_padded_blind.sh
# Unpack "$OUT"/evidence.tgz in benchmarks/results/padded_blind_h200.
OUT="${OUT:-$PWD/outputs/h200_x1_padded_blind}"
source "$(dirname "$0")/common.sh"
record_gpus
validate_part h200_x1_padded_blind_layouts.json
