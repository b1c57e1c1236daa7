#!/bin/bash
# Validation evidence on nvidia-h200-x2 (2x H200): real megatron-core training runs vs the cost model.
# Run from the repository root on the GPU machine (after ../shared/gpu install):
#     bash benchmarks/validation/h200_x2.sh
# Writes under "$OUT" (default ./outputs/validation_h200_x2). Target wall time < 11 min:
#   job 1 (2 GPUs, a fresh torchrun job per layout (add --layouts-per-job 0 to share one: ~2.5 min, but then
#          only the first layout's memory is comparable), 15 layouts of h200_x2_layouts.json: Qwen3-8B 4 layers at seq 4096 / 8192
#          over DP/TP+SP/PP/VPP/CP, full + selective recompute, mbs 2, forward-only; Qwen3-30B-A3B 4 layers EP2 / DP2;
#          one torch-profiler trace)                                                    ~6 min
#   job 2 (1 GPU each, concurrently): Qwen3-8B at the predicted memory edge, seq 4096: the most layers predicted
#          to fit (max-fit) on GPU 0 and one step more (min-oom, predicted OOM) on GPU 1   ~1.5 min
#   job 3 (2 GPUs): 6 host-bound MoE layouts of h200_x2_moe_host_layouts.json (Qwen3-30B-A3B, 2 / 6 layers, seq 2048,
#          EP2 / EP1 training, EP2 forward-only) that test the cost model's MoE host floor   ~3 min
# Then: `mat trace summary --json` of each profiled layout's rank-0 trace, and a calibration file from the runs.
# Copy "$OUT"/evidence to benchmarks/results/validation_h200_x2/.
OUT="${OUT:-$PWD/outputs/validation_h200_x2}"
source "$(dirname "$0")/common.sh"
$PY -c "import yaml" 2>/dev/null || { echo "pyyaml missing on this machine: bring its wheel (.gpu/extra)"; exit 3; }
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$OUT/gpus.txt"

echo "== job 1: 2-GPU layouts"
$VALIDATE --layouts "$HERE/h200_x2_layouts.json" --output-dir "$OUT/x2" --timeout-s 90 \
  --write-calibration "$OUT/x2/calibration.json" 2>&1 | tee "$OUT/x2.txt"

echo "== job 2: memory edge on 1 GPU (both GPUs, concurrently)"
EDGE="--model Qwen3-8B --gpu H200 --num-gpus 1 --seq-len 4096 --global-batch-size 1 --warmup-steps 1 --steps 2 --timeout-s 90"
CUDA_VISIBLE_DEVICES=0 $VALIDATE $EDGE --num-layers max-fit --output-dir "$OUT/edge_fit" > "$OUT/edge_fit.txt" 2>&1 &
FIT=$!
CUDA_VISIBLE_DEVICES=1 $VALIDATE $EDGE --num-layers min-oom --output-dir "$OUT/edge_oom" > "$OUT/edge_oom.txt" 2>&1 &
OOM=$!
wait $FIT; wait $OOM
cat "$OUT/edge_fit.txt" "$OUT/edge_oom.txt"

echo "== job 3: host-bound MoE layouts"
$VALIDATE --layouts "$HERE/h200_x2_moe_host_layouts.json" --output-dir "$OUT/moe_host" --timeout-s 90 \
  2>&1 | tee "$OUT/moe_host.txt"

echo "== collect evidence (small files only) under $OUT/evidence"
EV="$OUT/evidence"
for d in x2 edge_fit edge_oom moe_host; do
  copy_runs "$OUT/$d" "$EV/$d"
done
copy_traces "$OUT/x2" "$EV/traces"
cp "$OUT/x2/calibration.json" "$OUT/gpus.txt" "$EV/" 2>/dev/null
du -sh "$EV"
echo "wall time: $(elapsed)"
