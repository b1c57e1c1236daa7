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
# From the repository root on a 2-GPU host after ../shared/gpu's install (~8 min):
#     PART=run bash benchmarks/validation/x2_moe_graphs.sh
# Unpack "$OUT"/evidence.tgz in benchmarks/results/moe_graphs_h200_x2/run.
PART="${PART:-run}"
OUT="${OUT:-$PWD/outputs/x2_moe_graphs_$PART}"
source "$(dirname "$0")/common.sh"
record_gpus
case "$PART" in
  run) validate_part x2_moe_graphs_layouts.json ;;
  *) echo "PART must be run" >&2; exit 2 ;;
esac
