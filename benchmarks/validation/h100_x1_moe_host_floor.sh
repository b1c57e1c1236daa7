#!/bin/bash
# One H100 (nvidia-h100-x1): does the eager MoE block's host floor, measured on the machine itself, predict the
# machine's MoE training steps? (The default floor, measured on the 2x H200 host, put a 2-layer Qwen3-30B-A3B
# step on this kind at +37%: moe_holes/.)
# 1. testbench `moe` block of Qwen3-30B-A3B shapes at s4096, ep1, with 128 / 64 / 32 experts (models/: the preset
#    with num_experts changed), bf16 and fp8: `mat profile --calibration-out` writes this host's
#    `moe_host_floor`; fp8 in both recipes (delayed, tensorwise)                                        ~2 min
# 2. six 2-layer training steps (h100_x1_moe_host_floor_layouts.json) predicted with that calibration  ~4 min
# 3. the testbench cases again: did the host's pace drift while the steps ran?                            ~1.5 min
# Run from the repository root on the GPU machine:
#     bash benchmarks/validation/h100_x1_moe_host_floor.sh
# Unpack "$OUT"/evidence.tgz to benchmarks/results/validation_h100_x1/moe_host_floor.
OUT="${OUT:-$PWD/outputs/h100_x1_moe_host_floor}"
source "$(dirname "$0")/common.sh"
record_gpus
EV="$OUT/evidence"
mkdir -p "$EV/testbench"
profile_cases() {  # profile_cases NAME: the testbench cases into "$OUT/NAME", the calibration into "$EV/NAME.calibration.json"
  $MAT profile --case-file "$HERE/h100_x1_moe_host_floor_cases.json" --warmup 5 --repeats 20 --case-timeout 240 \
    --output-dir "$OUT/$1" --calibration-out "$EV/$1.calibration.json" --json > "$EV/testbench/$1.summary.json"
  echo "testbench $1 rc=$? ($(elapsed))"
  mkdir -p "$EV/testbench/$1/collect"
  cp "$OUT/$1"/cases.json "$EV/testbench/$1/" 2>/dev/null
  cp "$OUT/$1"/collect/*.jsonl "$EV/testbench/$1/collect/" 2>/dev/null
}
echo "== 1: testbench before"
profile_cases testbench_before
echo "== 2: training steps"
validate_batch "$HERE/h100_x1_moe_host_floor_layouts.json" run 180 --calibration "$EV/testbench_before.calibration.json"
collect_batch run "$EV"
echo "== 3: testbench after ($(elapsed))"
profile_cases testbench_after
finish "$EV"
