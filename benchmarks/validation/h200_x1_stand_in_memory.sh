#!/bin/bash
# The allocator histories that h200_x2_memory_holes.sh would record on 2 GPUs, recorded on ONE H200
# (nvidia-h200): every rank of each 2-GPU dense layout of h200_x2_memory_holes_layouts.json runs as a memory
# stand-in (`validate.worker --stand-in-rank R --stand-in-world-size 2`: torch's fake process group, so the
# rank builds, allocates and frees exactly what it would in the 2-GPU job while collectives and p2p move no
# bytes). Is the 2.3 GiB reserved-but-unallocated memory of the last stage of pp2 vpp2 (2x H200, expandable
# segments) there without NCCL, and which requests make it? The MoE layouts are left out: their dispatcher
# sizes buffers from token counts that a fake all-to-all does not deliver.
# Three stand-ins share the GPU at a time (allocator figures are per process; the device-wide "used" figure
# is not, so memory outside the allocator is not compared). ~6 min. From the repository root on the machine:
#     bash benchmarks/validation/h200_x1_stand_in_memory.sh
# Copy "$OUT"/evidence (or unpack "$OUT"/evidence.tgz) to benchmarks/results/validation_h200_x1/stand_in_memory.
OUT="${OUT:-$PWD/outputs/h200_x1_stand_in_memory}"
source "$(dirname "$0")/common.sh"
record_gpus
JOBS="$OUT/jobs"
mkdir -p "$JOBS"
# one job file per dense layout (defaults applied), and one line "JOB RANK" per stand-in
$PY - "$HERE/h200_x2_memory_holes_layouts.json" "$JOBS" > "$OUT/stand_ins.txt" <<'PYEOF'
import json, sys
from pathlib import Path
from megatron_autotuner.validate.layout import Layout
spec = json.loads(Path(sys.argv[1]).read_text())
for i, raw in enumerate(spec["layouts"]):
    lay = Layout.from_dict({**spec["defaults"], **raw})
    if lay.model_spec().num_moe_experts:
        continue
    job = Path(sys.argv[2]) / f"layout{i}.json"
    job.write_text(json.dumps([lay.to_dict()]))
    for rank in range(lay.world_size):
        print(job, rank)
PYEOF
cat "$OUT/stand_ins.txt"
stand_in() {  # JOB RANK: one stand-in process, its own output folder
  local out="$OUT/run/$(basename "$1" .json)_rank$2"
  $PY -m megatron_autotuner.validate.worker --layouts "$1" --out-dir "$out" --stand-in-rank "$2" \
    --stand-in-world-size 2 > "$out.log" 2>&1
  echo "$(basename "$1") rank $2: exit $? ($(elapsed)) $(grep -h '^\[' "$out.log" | tail -1)"
}
export -f stand_in elapsed
export OUT PY START
mkdir -p "$OUT/run"
timeout 500 xargs -P 3 -L 1 bash -c 'stand_in "$0" "$1"' < "$OUT/stand_ins.txt"
EV="$OUT/evidence"
mkdir -p "$EV/runs"
cp "$OUT/gpus.txt" "$OUT/stand_ins.txt" "$EV/"
cp -r "$JOBS" "$EV/"
for d in "$OUT"/run/*_rank*/; do
  name=$(basename "$d")
  for f in "$d"runs/rank_*.jsonl; do [ -f "$f" ] && cat "$f" >> "$EV/runs/$(basename "$f")"; done
  cp "$OUT/run/$name.log" "$EV/runs/$name.log" 2>/dev/null
  for hist in "$d"memory/*/rank_*.history.json; do
    [ -f "$hist" ] || continue
    layout=$(basename "$(dirname "$hist")")
    mkdir -p "$EV/memory/$layout"
    cp "$hist" "$EV/memory/$layout/"
  done
done
# the raw snapshot of the 2.3 GiB miss (last stage of pp2 vpp2, s4096), for pytorch.org/memory_viz
cp "$OUT"/run/layout0_rank1/memory/*/rank_1.pickle.gz "$EV/memory/" 2>/dev/null
finish "$EV"
