#!/bin/bash
# #40 on 2 GPUs: where the host's time goes under Megatron's all-to-all overlap. On four 2-GPU hosts gpt-oss-20b's
# eager (host-paced) ep 2 step ran 9-16% slower with `--overlap-moe-expert-parallel-comm` than without, the same
# kernels issued (moe_ep_overlap_h200_x2*, moe_r5_h200_x2), and `--delay-wgrad-compute` slower again; the model gives
# the overlap no gain there and prices no loss. PART=run measures this host's three-process MoE floors
# (`--measure-host-floor`), then runs gpt-oss-20b (4 layers) and Mixtral-8x7B (2 layers) at ep 2 serial, overlapped
# and overlapped with delayed wgrad, every layer's host time recorded: serial per layer pass, overlapped per combined
# layer step (`host_timing.CombinedLayerHostTimer`), each with the time blocked in event syncs. PART=profile
# (CAL=run's calibration) profiles gpt-oss-20b's serial and overlapped steps and keeps both ranks' raw traces.
# PART=blind, after the model learnt the output layer's drain from those (`moe_overlap.head_drain_s`): three shapes
# no run had, serial and overlapped (gpt-oss-20b at 8192 tokens and at 8 layers, Qwen3-30B-A3B at 4 layers), the
# default-floor predictions committed first (predicted_default_blind.json), this host's floors measured first.
# PART=s8192 (CAL=blind's calibration) profiles the blind 8192-token pair, whose overlapped step ran 1% slower than
# the serial one where the model said 24%, and keeps both ranks' raw traces as "$OUT"/raw.tar.
# The predictions with the default floors were written first (`mat validate --layouts
# benchmarks/validation/x2_moe_overlap_{host,profile,blind}_layouts.json --dry-run --json` >
# benchmarks/results/moe_overlap_host_h200_x2/predicted_default[_profile|_blind].json); those with this host's floors
# are in each results.jsonl, made after the floors and before the steps.
# From the repository root on a 2-GPU host after ../shared/gpu's install (~6 min, ~4 min):
#     PART=run bash benchmarks/validation/x2_moe_overlap_host.sh
#     PART=profile CAL=outputs/x2_moe_overlap_host_run/run/host_floor/host_floor.calibration.json bash ...
#     PART=blind bash benchmarks/validation/x2_moe_overlap_host.sh
#     PART=s8192 CAL=outputs/x2_moe_overlap_host_blind/run/host_floor/host_floor.calibration.json bash ...
# Unpack each part's "$OUT"/evidence.tgz in benchmarks/results/moe_overlap_host_h200_x2/PART.
PART="${PART:-run}"
OUT="${OUT:-$PWD/outputs/x2_moe_overlap_host_$PART}"
source "$(dirname "$0")/common.sh"
record_gpus
case "$PART" in
  run) validate_part x2_moe_overlap_host_layouts.json ;;
  profile)
    validate_part x2_moe_overlap_profile_layouts.json
    copy_rank_traces run "$OUT/raw"
    ;;
  blind) validate_part x2_moe_overlap_blind_layouts.json ;;
  s8192)
    validate_part x2_moe_overlap_s8192_layouts.json
    copy_rank_traces run "$OUT/raw"
    tar cf "$OUT/raw.tar" -C "$OUT" raw && rm -rf "$OUT/raw" "$OUT/run" "$OUT/evidence"
    ;;
  *) echo "PART must be run, profile, blind or s8192" >&2; exit 2 ;;
esac
