#!/bin/bash
# #40 on 2 GPUs: is `--delay-wgrad-compute`'s slowdown of the EP all-to-all overlap real? On host D (x2_moe_r5.sh
# PART=more) Mixtral L2 ep 2 with the overlap took 259.8 ms with delayed wgrad against 230.8 without (+12.6%), one
# process each, unprofiled, but +2.7% profiled; fresh processes of one host were since seen to stray 0.76x-1.51x in
# their host's pace (rank_pace_h200_x2). Three fresh-process repeats of each, interleaved, unprofiled, with host D's
# floors (CAL; Mixtral's blocks are GPU-paced). Predictions written first: `mat validate --layouts
# benchmarks/validation/x2_delay_wgrad_layouts.json --calibration
# benchmarks/results/moe_r5_h200_x2/more/host_floor/host_floor.calibration.json --dry-run --json`
# > benchmarks/results/delay_wgrad_h200_x2/predicted.json.
# From the repository root on a 2-GPU host after ../shared/gpu's install (~5 min):
#     CAL=benchmarks/results/moe_r5_h200_x2/more/host_floor/host_floor.calibration.json \
#         bash benchmarks/validation/x2_delay_wgrad.sh
# Unpack "$OUT"/evidence.tgz in benchmarks/results/delay_wgrad_h200_x2.
OUT="${OUT:-$PWD/outputs/x2_delay_wgrad}"
source "$(dirname "$0")/common.sh"
record_gpus
validate_part x2_delay_wgrad_layouts.json
