#!/bin/bash
# #40 on 2 GPUs, third round: gpt-oss-20b at ep 2 with the all-to-all overlap without --delay-wgrad-compute (host
# timed), and profiled with and without --delay-wgrad-compute (the second round, x2_moe_ep_overlap_r2.sh, ran the
# overlap with delayed wgrad 25% slower than no overlap). Predicted with the host floors the second round measured on
# the same machine (CAL, its host_floor.calibration.json; without it they are measured again). The predictions with
# the default floors were written first (`mat validate --layouts benchmarks/validation/x2_moe_ep_overlap_r3_layouts.json
# --dry-run --json` > benchmarks/results/moe_ep_overlap_h200_x2_r3/predicted_default.json).
# From the repository root on a 2-GPU host after ../shared/gpu's install (~3 min):
#     CAL=/root/x2r2/run/host_floor/host_floor.calibration.json bash benchmarks/validation/x2_moe_ep_overlap_r3.sh
# Unpack "$OUT"/evidence.tgz in benchmarks/results/moe_ep_overlap_h200_x2_r3. The first layout's host timing records
# nothing: the overlap's combined step never runs the timed layer hooks.
OUT="${OUT:-$PWD/outputs/x2_moe_ep_overlap_r3}"
source "$(dirname "$0")/common.sh"
record_gpus
if [ -f "${CAL:-}" ]; then floors=(--calibration "$CAL"); else floors=(--measure-host-floor); fi
validate_batch "$HERE/x2_moe_ep_overlap_r3_layouts.json" run 300 "${floors[@]}"
EV="$OUT/evidence"
collect_batch run "$EV"
summarize_rank_traces run "$EV/traces"
rank_waits run "$EV/traces"
[ -f "${CAL:-}" ] && cp "$CAL" "$EV/calibration.json"
finish "$EV"
