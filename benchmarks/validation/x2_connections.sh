#!/bin/bash
# #40 on 2 GPUs: does TP / CP communication still hide behind the computation when a process runs with more than one
# hardware queue (CUDA_DEVICE_MAX_CONNECTIONS=8, what the EP all-to-all overlap sets on Hopper)? Megatron-LM asserts 1
# with TP or CP before Blackwell, and warns against the overlap beside them (megatron/training/arguments.py); the
# predictions held the backward's TP gathers / scatters and CP's ring exchange exposed there (the model now keeps the
# CP part only: `estimate.cp_ring_hides`). PART=dense: Llama-3.1-8B at 4 layers, TP 2 + SP at 8192 tokens and CP 2 at 32768, each at 1 and 8
# connections, timed and profiled (the trace summaries say how much of each collective ran beside computation).
# PART=moe: Mixtral-8x7B at 2 layers, CP 2 x EP 2, without and with the all-to-all overlap (which sets 8).
# PART=blind: after the model kept only CP's part, Qwen3-8B's CP 2 at 32k tokens at 1, 8, 8, 1 connections (twice
# each, in that order, for the noise between processes) on another host. PART=memory: the dense part's CP 2 and TP 2
# layouts with the allocator's history, whose reserve ran 6-16 GiB above the allocated peak (the model allows 2-4).
# PART=moe_floors: the moe part's layouts on another host, its MoE host floors measured first (three processes).
# The predictions with the default floors were written first (`mat validate --layouts
# benchmarks/validation/x2_connections[_moe|_blind|_memory]_layouts.json --dry-run --json` >
# benchmarks/results/connections_h200_x2/predicted_default[_moe|_blind|_memory].json).
# From the repository root on a 2-GPU host after ../shared/gpu's install (~5 min each):
#     PART=dense bash benchmarks/validation/x2_connections.sh
#     PART=moe bash benchmarks/validation/x2_connections.sh
# Unpack each part's "$OUT"/evidence.tgz in benchmarks/results/connections_h200_x2/PART.
PART="${PART:-dense}"
OUT="${OUT:-$PWD/outputs/x2_connections_$PART}"
source "$(dirname "$0")/common.sh"
record_gpus
case "$PART" in
  dense) LAYOUTS=x2_connections_layouts.json ;;
  moe) LAYOUTS=x2_connections_moe_layouts.json ;;
  blind) LAYOUTS=x2_connections_blind_layouts.json ;;
  memory) LAYOUTS=x2_connections_memory_layouts.json ;;
  moe_floors) validate_part x2_connections_moe_layouts.json; exit ;;
  *) echo "PART must be dense, moe, blind, memory or moe_floors" >&2; exit 2 ;;
esac
EV="$OUT/evidence"
validate_batch "$HERE/$LAYOUTS" run 240
collect_batch run "$EV"
copy_memory_histories run "$EV"
record_versions "$EV"
summarize_rank_traces run "$EV/traces"
rank_waits run "$EV/traces"
finish "$EV"
