#!/usr/bin/env bash
# TP-overlap tuning on 2x H200 (nvidia-h200-x2), < 5 min wall: Qwen3-8B and Llama-3.1-8B shapes, seq 8192,
# TP=1 (scaling baseline) and TP=2, TE userbuffers + torch symm-mem, then the layer check (layer_check.sh)
# if time is left. Everything goes to "$OUT/overlap" (report, yaml, traces) and "$OUT/layer_check.json".
# Usage, from the repo root on the GPU machine (TE + megatron-core installed, ../shared/gpu/README.md):
#   bash benchmarks/overlap/h200_x2.sh
source /root/gpu/env.sh
set -uo pipefail
OUT=${OUT:?OUT must be set (the device tool sets it)}
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" UB_SKIPMC=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
timeout 215 python3 -m megatron_autotuner.cli overlap --model Qwen3-8B --model Llama-3.1-8B \
    --tp-sizes 2 --max-token-len 8192 --operators qkv proj fc1 fc2 --backend both \
    --min-num-sm 4 --max-num-sm 16 --num-splits 4 8 --cga-sizes 2 --overlap-threshold 0.5 \
    --warmup 2 --repeats 5 --profile key --verify-passes 1 --case-timeout 60 --output-dir "$OUT/overlap"
echo "tune rc=$?  elapsed ${SECONDS}s"
# redo the analysis alone (no GPU) in case the tuning was cut off by the timeout
timeout 30 python3 -m megatron_autotuner.cli overlap analyze "$OUT/overlap" > "$OUT/overlap/summary_reanalyzed.txt"
echo "analyze rc=$?"
if [ "$SECONDS" -lt 235 ]; then
  LEFT=$((285 - SECONDS))
  timeout "$LEFT" bash benchmarks/overlap/layer_check.sh "$OUT/overlap" "$OUT/layer_check.json"
  echo "layer check rc=$?  elapsed ${SECONDS}s"
else
  echo "no time left for the layer check: run benchmarks/overlap/layer_check.sh separately"
fi
cat "$OUT/overlap/summary.txt" 2>/dev/null
