#!/bin/bash
# #37: where Qwen3-32B's 13-19 GiB of reserved-but-unallocated memory comes from on 4 GPUs. From the repository root
# on a 4-GPU H200 host (the dp4 layout holds 116 GiB) after ../shared/gpu's install:
#     bash benchmarks/validation/x4_reserved_memory.sh          # history: ~3 min
#     bash benchmarks/validation/x4_reserved_memory.sh queue    # ~3 min
#     bash benchmarks/validation/x4_reserved_memory.sh blind    # ~4 min
# history: round 3's two Qwen3-32B layouts that missed their peak most (tp2 pp2 vpp8, dp4) with expandable segments,
#   and the dp4 one under the default allocator, each with the caching allocator's history recorded
#   (`memory_history`; validate predicts before it runs). "$OUT"/snapshots/ holds rank 0's raw snapshots.
# queue: CUDA's launch-queue depth (benchmarks/launch_queue.py, GPU 0), and the two expandable layouts again with a
#   torch-profiler step each (`profile`), whose kernels per layer and micro-batch the host's lead is counted in.
# blind: new shapes (`python benchmarks/reserved_memory.py predict` wrote them and their predictions first), to
#   check the model of frees awaiting the GPU.
# Unpack "$OUT"/evidence.tgz to benchmarks/results/reserved_memory_h200_x4/ (queue: .../queue/, blind: .../blind/).
OUT="${OUT:-$PWD/outputs/x4_reserved_memory}"
source "$(dirname "$0")/common.sh"
record_gpus
if [ "${1:-history}" = blind ]; then
  validate_batch "$HERE/x4_reserved_memory_blind_layouts.json" blind 300
  collect_batch blind "$OUT/evidence"
elif [ "${1:-history}" = queue ]; then
  mkdir -p "$OUT/evidence"
  CUDA_VISIBLE_DEVICES=0 timeout -k 10 120 $PY benchmarks/launch_queue.py --out "$OUT/evidence/launch_queue.json" | tail -5
  validate_batch "$HERE/x4_reserved_memory_profile_layouts.json" profiled 300
  collect_batch profiled "$OUT/evidence/profiled"
  copy_traces "$OUT/profiled" "$OUT/evidence/profiled/traces"
else
  validate_batch "$HERE/x4_reserved_memory_layouts.json" reserved 300
  collect_batch reserved "$OUT/evidence"
  copy_memory_histories reserved "$OUT/evidence"
  copy_memory_snapshots reserved "$OUT/snapshots" 0
fi
finish "$OUT/evidence"
