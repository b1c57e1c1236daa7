#!/bin/bash
# Diagnosis of the misses of x2_moe_tp_host.sh (benchmarks/results/moe_tp_host_h200_x2): the three 128-expert
# Qwen3-30B-A3B layouts (dp2, tp2 etp1, tp2 etp2) profiled, both ranks' trace summaries kept (a collective waits for
# the later rank); two Qwen3-8B pipeline layouts (pp2, pp2 vpp4) with the allocator's history, both ranks replayed.
# From the repository root on a 2-GPU host after ../shared/gpu's install (~5 min):
#     bash benchmarks/validation/x2_moe_tp_diagnose.sh
# Unpack "$OUT"/evidence.tgz to benchmarks/results/moe_tp_host_h200_x2/diagnose.
OUT="${OUT:-$PWD/outputs/x2_moe_tp_diagnose}"
source "$(dirname "$0")/common.sh"
record_gpus
validate_batch "$HERE/x2_moe_tp_diagnose_layouts.json" diag 240
EV="$OUT/evidence"
collect_batch diag "$EV"
copy_memory_histories diag "$EV"
summarize_rank_traces diag "$EV/traces"
finish "$EV"
