#!/bin/bash
# #40 on 2 GPUs: is the slower rank's host pace the CPUs it runs on? On host O (x2_moe_graphs.sh PART=ranks) one
# rank issued every forward span of an eager Qwen3-30B-A3B-E32 ep 2 step 28-47% slower than the other, steadily, and
# the other waited for it at each all-to-all; the runner leaves each rank's process on the launcher's CPUs (both
# sockets), as Megatron-LM's pretrain does outside fine-grained offloading. The MoE host floor is measured in one
# process on GPU 0 only.
# PART=run: the same layouts eager and graphed (attn + moe_router + moe_preprocess), each unbound and bound to its
# GPU's NUMA node (`cpu_affinity: gpu_numa`), every rank profiled and its raw trace kept, with host M's floors (CAL).
# Predictions written first: `mat validate --layouts benchmarks/validation/x2_rank_pace_layouts.json --calibration
# benchmarks/results/moe_graphs_h200_x2/profile/host_floor/host_floor.calibration.json --dry-run --json`
# > benchmarks/results/rank_pace_h200_x2/predicted.json.
# PART=floors: the MoE host floor of the same layouts measured on GPU 0 and GPU 1 at once, unbound, then bound
# (`moe_floor_on_gpu.py`), and the host's CPU / NUMA / GPU topology.
# PART=repeats: in fresh processes, six eager and four graphed repeats of those layouts (each its own timed step count, so
# each its own id), every rank profiled, with host M's floors: how often one rank issues slower, and whether the step
# follows the slower rank. Each rank's spans are read from its trace there (`forward_spans.py`: spans.json), the raw
# traces stay. Predictions: `mat validate --layouts benchmarks/validation/x2_rank_repeats_layouts.json --calibration ...
# --dry-run --json` > benchmarks/results/rank_pace_h200_x2/predicted_repeats.json.
# From the repository root on a 2-GPU host after ../shared/gpu's install (~6, ~5 and ~8 min):
#     PART=run CAL=benchmarks/results/moe_graphs_h200_x2/profile/host_floor/host_floor.calibration.json \
#         bash benchmarks/validation/x2_rank_pace.sh
#     PART=floors bash benchmarks/validation/x2_rank_pace.sh
#     PART=repeats CAL=... bash benchmarks/validation/x2_rank_pace.sh
# Unpack "$OUT"/evidence.tgz in benchmarks/results/rank_pace_h200_x2/PART.
PART="${PART:-run}"
OUT="${OUT:-$PWD/outputs/x2_rank_pace_$PART}"
source "$(dirname "$0")/common.sh"
record_gpus
case "$PART" in
  run)
    validate_part x2_rank_pace_layouts.json
    copy_rank_traces run "$OUT/evidence/raw_traces"
    finish "$OUT/evidence"
    ;;
  floors)
    ev="$OUT/evidence"
    mkdir -p "$ev"
    { nvidia-smi topo -m; lscpu; } > "$ev/topology.txt" 2>&1
    for binding in unbound bound; do
      flag=(); [ "$binding" = bound ] && flag=(--bind)
      for gpu in 0 1; do
        CUDA_VISIBLE_DEVICES=$gpu $PY "$HERE/moe_floor_on_gpu.py" "$HERE/x2_rank_pace_layouts.json" \
          "$OUT/$binding/gpu$gpu" "${flag[@]}" > "$OUT/$binding.gpu$gpu.txt" 2>&1 &
      done
      wait
      for gpu in 0 1; do
        mkdir -p "$ev/$binding/gpu$gpu"
        cp "$OUT/$binding/gpu$gpu"/{placement.json,host_floor.calibration.json} "$ev/$binding/gpu$gpu/"
        cp "$OUT/$binding.gpu$gpu.txt" "$ev/$binding/gpu$gpu/run.log"
        tail -2 "$OUT/$binding.gpu$gpu.txt"
      done
      echo "$binding done: $(elapsed)"
    done
    finish "$ev"
    ;;
  repeats)
    validate_batch "$HERE/x2_rank_repeats_layouts.json" run 300 --calibration "$CAL"
    ev="$OUT/evidence"
    collect_batch run "$ev"
    cp "$CAL" "$ev/calibration.json"
    $PY "$HERE/forward_spans.py" "$OUT/run" "$ev/spans.json"
    finish "$ev"
    ;;
  *) echo "PART must be run, floors or repeats" >&2; exit 2 ;;
esac
