#!/bin/bash
# Out-of-sample check of the packed forward-pass memory model on one H100 (issue #26): the allocator replay
# (theory/allocator.py) was built from benchmarks/results/validation_h100_x1/rlhf_packing; these layouts use other
# models, another length distribution (prompt mean 256 / max 2048, response mean 2048 / max 6144, seed 1, 48
# sequences) and other token budgets, predicted by `mat validate` before they run. ~5 min:
#     bash benchmarks/validation/h100_x1_rlhf_forward_check.sh
# Copy "$OUT"/evidence to benchmarks/results/validation_h100_x1/rlhf_forward_check. The rest of the train /
# forward x two budgets matrix: LAYOUTS=benchmarks/validation/h100_x1_rlhf_matrix_layouts.json (-> rlhf_matrix).
OUT="${OUT:-$PWD/outputs/h100_x1_rlhf_forward_check}"
source "$(dirname "$0")/common.sh"
record_gpus
validate_batch "${LAYOUTS:-$HERE/h100_x1_rlhf_forward_check_layouts.json}" forward_check 240
collect_batch forward_check "$OUT/evidence"
finish "$OUT/evidence"
