#!/bin/bash
# #37 item 3 (the host at TP > 1) and the expert-TP misses of benchmarks/results/etp_holdout_h200_x4: is an eager MoE
# block's host time at TP 2 / expert-TP 2 the one-GPU floor of its local-expert count, or more?
# From the repository root on a 2-GPU host after ../shared/gpu's install (~8 min):
#     bash benchmarks/validation/x2_moe_tp_host.sh
# job 1: `--measure-host-floor` times this host's eager MoE block on one GPU (Qwen3-30B-A3B at 128 and 64 local
#        experts), then five 4-layer Qwen3-30B-A3B layouts on 2 GPUs (dp2, ep2, tp2 etp1, tp2 etp2, tp2 etp1 ep2) are
#        predicted with that floor and run, each layer's host issue time recorded (x2_moe_tp_host_layouts.json).
# job 2: three dense pipeline layouts (pp2 vpp4, pp2, an uneven pp2 vpp2 layout string) under expandable segments,
#        for their peak memory (x2_pipeline_memory_layouts.json).
# The CPU predictions with the default floor were written first (`mat validate --layouts FILE --dry-run --json` >
# benchmarks/results/moe_tp_host_h200_x2/predicted*.json). Unpack "$OUT"/evidence.tgz there.
OUT="${OUT:-$PWD/outputs/x2_moe_tp_host}"
source "$(dirname "$0")/common.sh"
record_gpus
validate_batch "$HERE/x2_moe_tp_host_layouts.json" moe 240 --measure-host-floor
validate_batch "$HERE/x2_pipeline_memory_layouts.json" pipe 240
EV="$OUT/evidence"
collect_batch moe "$EV/moe"
collect_batch pipe "$EV/pipe"
mkdir -p "$EV/moe/host_floor"
cp "$OUT"/moe/host_floor/host_floor.calibration.json "$EV/moe/host_floor/" 2>/dev/null
finish "$EV"
