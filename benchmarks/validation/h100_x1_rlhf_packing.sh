#!/bin/bash
# RLHF building blocks on one H100 (nvidia-h100-x1), issue #26:
# 1. host <-> device copy bandwidth (`mat profile --mode copy-bandwidth`): H2D / D2H, pinned and pageable, 1 MiB to
#    16 GiB (bounded by free memory), alone and beside a second stream copying in HBM (one GPU: no NCCL rows), into a
#    calibration file's `host_copy` table;
# 2. packed THD micro-batches (verl's dynamic batching) in `mat validate`: Qwen3-0.6B (28 layers) and Llama-3.1-8B
#    reduced to 4 layers, 32 sequences of prompt mean 512 / max 1024 + response mean 1024 / max 3072 tokens (seed 0)
#    packed at max_token_len 8192 and 16384, training and forward-only (h100_x1_rlhf_packing_layouts.json; predictions written before the runs);
# 3. the offload round trip of a 4-layer Qwen3-8B's params, grads and optimizer state the way verl moves them
#    (offload_roundtrip.py), predicted from step 1's table before it is timed.
# ~6 min. Run from the repository root on the GPU machine:
#     bash benchmarks/validation/h100_x1_rlhf_packing.sh
# Copy "$OUT"/evidence (or unpack "$OUT"/evidence.tgz) to benchmarks/results/validation_h100_x1/rlhf_packing.
OUT="${OUT:-$PWD/outputs/h100_x1_rlhf_packing}"
source "$(dirname "$0")/common.sh"
record_gpus
EVIDENCE="$OUT/evidence"
mkdir -p "$EVIDENCE"

echo "== 1. copy bandwidth ($(elapsed))"
$MAT profile --mode copy-bandwidth --max-copy-gib 16 --repeats 3 --warmup 1 --copy-interference none,hbm_d2d \
  --case-timeout 240 --output-dir "$OUT/copy" --calibration-out "$OUT/copy_calibration.json" 2>&1 | tee "$OUT/copy.txt"
mkdir -p "$EVIDENCE/copy_bandwidth"
cp "$OUT/copy/copy_bandwidth/summary.json" "$OUT/copy/copy_bandwidth/rank_0.jsonl" "$EVIDENCE/copy_bandwidth/" 2>/dev/null
cp "$OUT/copy_calibration.json" "$OUT/copy.txt" "$EVIDENCE/copy_bandwidth/" 2>/dev/null

echo "== 2. packed validate runs ($(elapsed))"
validate_batch "$HERE/h100_x1_rlhf_packing_layouts.json" packing 180
collect_batch packing "$EVIDENCE/packing"

echo "== 3. offload round trip ($(elapsed))"
CAL_ARG=()
[ -f "$OUT/copy_calibration.json" ] && CAL_ARG=(--calibration "$OUT/copy_calibration.json")
timeout 300 $PY -m torch.distributed.run --standalone --nproc-per-node=1 "$HERE/offload_roundtrip.py" \
  --model Qwen3-8B --num-layers 4 --seq-length 4096 --repeats 4 "${CAL_ARG[@]}" \
  --out "$EVIDENCE/offload_roundtrip.json" 2>&1 | tee "$OUT/offload.txt"
cp "$OUT/offload.txt" "$EVIDENCE/offload_roundtrip.log"
finish "$EVIDENCE"
