#!/bin/bash
# Peak memory with PyTorch's expandable segments on nvidia-h200-x2 (2x H200): the 15 Qwen3-8B / Qwen3-30B-A3B
# layouts of h200_x2_layouts.json ("dense", ~6 min) and the 8 GPU-bound MoE layouts of h200_x2_moe_gpu_layouts.json
# ("moe", ~4.5 min), run again with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True. With the default allocator the
# memory reserved but not allocated varied 0.05-18 GiB between layouts (and by 3 GiB between the two ranks of one
# layout), the part of the peak the cost model cannot predict to 5%.
# Run from the repository root on the GPU machine (after ../shared/gpu install), one part per call (< 10 min each):
#     bash benchmarks/validation/h200_x2_expandable.sh dense
#     bash benchmarks/validation/h200_x2_expandable.sh moe
# Copy "$OUT"/evidence/PART to benchmarks/results/validation_h200_x2/expandable/PART.
OUT="${OUT:-$PWD/outputs/h200_x2_expandable}"
source "$(dirname "$0")/common.sh"
PART="${1:?give the part: dense or moe}"
case "$PART" in
  dense) LAYOUTS="$HERE/h200_x2_layouts.json" ;;
  moe) LAYOUTS="$HERE/h200_x2_moe_gpu_layouts.json" ;;
  *) echo "unknown part $PART (dense or moe)"; exit 2 ;;
esac
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$OUT/gpus.txt"
$VALIDATE --layouts "$LAYOUTS" --expandable-segments --output-dir "$OUT/$PART" --timeout-s 120 \
  2>&1 | tee "$OUT/$PART.txt"
EV="$OUT/evidence/$PART"
copy_runs "$OUT/$PART" "$EV"
cp "$OUT/gpus.txt" "$EV/"
cp "$OUT/$PART.txt" "$EV/run.log"
du -sh "$EV"
echo "wall time: $(elapsed)"
