#!/bin/bash
# Where the host-bound Qwen3-0.6B step's time goes with megatron-core's fine-grained activation offloading
# (core_attn + attn_proj) against the same layout without it: both layouts of
# benchmarks/results/validation_h100_x1/activation_offload (Qwen3-0.6B, seq 4096, micro-batch 1, 4 micro-batches)
# again with 8 timed steps and one torch-profiler step each, NVTE_CPU_OFFLOAD_V1=1 for both (as in the first run),
# and the host's CPU / NUMA layout (the fine-grained layout binds the process to the GPU's NUMA node's CPUs, the
# baseline does not: if that node holds every CPU the binding changes nothing).
#     bash benchmarks/validation/h100_x1_activation_offload_profile.sh          (~3 min of GPU time)
# What comes back: $OUT/activation_offload_profile.tgz (unpack into benchmarks/results/validation_h100_x1/).
RESULT="${OUT:-$PWD/outputs/h100_x1_activation_offload_profile}"
OUT="${RUN_DIR:-/tmp/h100_x1_activation_offload_profile}"
source "$(dirname "$0")/common.sh"
mkdir -p "$RESULT"
EVIDENCE="$OUT/activation_offload_profile"
mkdir -p "$EVIDENCE"
record_gpus
{ nproc; lscpu | grep -Ei "numa|model name|^cpu\(s\)"; nvidia-smi topo -m; } > "$EVIDENCE/host.txt" 2>&1
cat "$EVIDENCE/host.txt"
COPY_CAL="${COPY_CAL:-$HERE/../results/testbench_h100_x1/host_floor/copy.calibration.json}"
( export NVTE_CPU_OFFLOAD_V1=1; validate_batch "$HERE/h100_x1_activation_offload_profile_layouts.json" profile 300 \
  --calibration "$COPY_CAL" "$@" )
collect_batch profile "$EVIDENCE"
copy_traces "$OUT/profile" "$EVIDENCE/traces"
finish "$EVIDENCE"
cp "$EVIDENCE.tgz" "$RESULT/"
