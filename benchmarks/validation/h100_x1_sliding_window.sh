#!/bin/bash
# One H100 (nvidia-h100-x1), 4 layouts (h100_x1_sliding_window_layouts.json): a 2-layer gpt-oss-20b (layer 0 a
# 128-key sliding window, layer 1 full attention; learnable attention sinks; 32 experts top-4) at s8192 and s16384,
# beside the same model with its window switched off (models/gpt-oss-20b-full-attention.json: sliding_window null),
# every step profiled. It checks the cost model's one assumption about windows, a windowed kernel as efficient as a
# causal one over 2w tokens, and which TE attention backend runs sinks on this machine (cuDNN >= 9.13.1 fused,
# else unfused).
# The predictions were written first (`mat validate --layouts benchmarks/validation/h100_x1_sliding_window_layouts.json
# --gpu GPU --dry-run --json` > benchmarks/results/sliding_window_h100/predicted.json for H100-SXM,
# .../sliding_window_h200/predicted.json for H200). ~4 min. From the repository root on the GPU machine:
#     GPU=H200 bash benchmarks/validation/h100_x1_sliding_window.sh     (GPU: the preset of the machine; H100-SXM)
# Unpack "$OUT"/evidence.tgz to benchmarks/results/sliding_window_h100 (or _h200).
GPU="${GPU:-H100-SXM}"
OUT="${OUT:-$PWD/outputs/x1_sliding_window_$GPU}"
source "$(dirname "$0")/common.sh"
record_gpus
$PY -c "import torch; print('cudnn', torch.backends.cudnn.version())" > "$OUT/cudnn.txt" 2>&1
validate_batch "$HERE/h100_x1_sliding_window_layouts.json" swa 150 --gpu "$GPU"
EV="$OUT/evidence"
collect_batch swa "$EV"
copy_traces "$OUT/swa" "$EV/traces"
cp "$OUT/cudnn.txt" "$EV/" 2>/dev/null
finish "$EV"
