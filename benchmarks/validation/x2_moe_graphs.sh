#!/bin/bash
# #40 on 2 GPUs: what CUDA graphs of scope attn / moe_router / moe_preprocess take off an eager MoE layer's host.
# NVIDIA's B200 / GB200 Qwen3-30B-A3B recipes run them (`--cuda-graph-impl transformer_engine --cuda-graph-scope attn
# moe_router moe_preprocess`), and the model, which holds those rows 24-33% slow, credits the graphs with the router's
# and preprocess's measured shares of the block's forward host (`costmodel.layer.moe_block_host_s`), not checked on
# any training step before this. Qwen3-30B-A3B shapes at 32 experts (16 local at ep 2, 4 layers) and at its 128
# (64 local, 2 layers), alltoall with TE's fused permute, eager and graphed; the host's three-process MoE floors are
# measured first (`--measure-host-floor`), so results.jsonl holds the at-run prediction beside the default one.
# The predictions with the default floors were written first (`mat validate --layouts
# benchmarks/validation/x2_moe_graphs_layouts.json --dry-run --json` >
# benchmarks/results/moe_graphs_h200_x2/predicted_default.json).
# PART=profile: on a second host, the 32-expert layouts again with every rank profiled (eager, attn, attn+moe_router,
# attn+moe_router+moe_preprocess; predictions: predicted_default_profile.json), to see where the graphs' time came from.
# PART=timed: on a third host, eager / attn / all three scopes with every layer's forward and backward time recorded
# on both ranks, unprofiled (`host_timing`; predictions: predicted_default_timed.json).
# PART=ranks: eager and all three scopes profiled again, with host M's floors (CAL, no floor measurement: a short
# lease), keeping both ranks' raw traces: does the slower rank's pace (rank 0 waited 4.7 ms a forward span for rank 1
# on host M, eager) come from one rank's host throughout? Predictions: predicted_default_ranks.json.
# From the repository root on a 2-GPU host after ../shared/gpu's install (~6-8 min each):
#     PART=run bash benchmarks/validation/x2_moe_graphs.sh
#     PART=profile bash benchmarks/validation/x2_moe_graphs.sh
#     PART=timed bash benchmarks/validation/x2_moe_graphs.sh
#     PART=ranks CAL=benchmarks/results/moe_graphs_h200_x2/profile/host_floor/host_floor.calibration.json bash ...
# Unpack each part's "$OUT"/evidence.tgz in benchmarks/results/moe_graphs_h200_x2/PART; PART=profile leaves rank 0's
# raw traces in "$OUT"/raw_traces.
PART="${PART:-run}"
OUT="${OUT:-$PWD/outputs/x2_moe_graphs_$PART}"
source "$(dirname "$0")/common.sh"
record_gpus
case "$PART" in
  run) validate_part x2_moe_graphs_layouts.json ;;
  profile)
    validate_part x2_moe_graphs_profile_layouts.json
    copy_traces "$OUT/run" "$OUT/raw_traces"
    ;;
  timed) validate_part x2_moe_graphs_timed_layouts.json ;;
  ranks)
    validate_part x2_moe_graphs_ranks_layouts.json
    copy_rank_traces run "$OUT/raw_traces"
    ;;
  *) echo "PART must be run, profile, timed or ranks" >&2; exit 2 ;;
esac
