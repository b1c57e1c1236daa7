#!/bin/bash
# Round 3's three layouts that missed their peak most, again with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
# (benchmarks/expandable_segments.py predict wrote the layouts and the predictions first). From the repository root on a
# 4-GPU host after ../shared/gpu's install:
#     bash benchmarks/validation/x4_expandable_segments.sh        # ~4 min
# Copy "$OUT"/evidence.tgz's folder to benchmarks/results/expandable_segments_h200_x4/runs and run
# `python benchmarks/expandable_segments.py report`.
OUT="${OUT:-$PWD/outputs/x4_expandable_segments}"
source "$(dirname "$0")/common.sh"
record_gpus
validate_batch "$HERE/x4_expandable_segments_layouts.json" expandable 120
collect_batch expandable "$OUT/evidence"
finish "$OUT/evidence"
