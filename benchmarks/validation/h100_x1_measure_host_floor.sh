#!/bin/bash
# One H100 (nvidia-h100-x1): `mat validate --measure-host-floor` end to end: the testbench times this host's eager MoE
# block (one case per precision / fp8 recipe the layouts use), then two 2-layer Qwen3-30B-A3B steps are run and
# predicted with that floor (h100_x1_measure_host_floor_layouts.json).                                    ~3 min
# Run from the repository root on the GPU machine:
#     bash benchmarks/validation/h100_x1_measure_host_floor.sh
# Unpack "$OUT"/evidence.tgz to benchmarks/results/validation_h100_x1/measure_host_floor.
OUT="${OUT:-$PWD/outputs/h100_x1_measure_host_floor}"
source "$(dirname "$0")/common.sh"
record_gpus
validate_batch "$HERE/h100_x1_measure_host_floor_layouts.json" run 180 --measure-host-floor
EV="$OUT/evidence"
collect_batch run "$EV"
copy_host_floor run "$EV"
finish "$EV"
