#!/bin/bash
# H100 evidence on nvidia-h100-x1 (1x H100 SXM): is the cost model, whose GEMM / attention / HBM defaults were
# measured on H200, right on H100 (the GPU of the published NeMo / Megatron-Bridge rows), in bf16 and fp8?
# Run from the repository root on the GPU machine (after ../shared/gpu install):
#     bash benchmarks/validation/h100_x1.sh
# Writes under "$OUT" (default ./outputs/h100_x1); target wall time < 9 min:
#   1. `costmodel.measure_defaults` on H100: the GEMM (bf16, fp8) / attention / HBM sweep of defaults_h200.json ~2 min
#   2. testbench (`mat profile`) of megatron-core TE column / row linear, attention and decoder layer of
#      Llama-2-7b (seq 4096) and Llama-3.1-8B (seq 8192), bf16 and fp8 (h100_x1_cases.json)              ~2 min
#   3. real training steps on 1 GPU (h100_x1_layouts.json): Llama-2-7b / Llama-3.1-8B / Qwen3-8B, 4 layers,
#      bf16 and fp8, one forward-only; two torch-profiler traces                                          ~4 min
# Copy "$OUT"/evidence to benchmarks/results/validation_h100_x1/.
OUT="${OUT:-$PWD/outputs/h100_x1}"
source "$(dirname "$0")/common.sh"
nvidia-smi --query-gpu=name,memory.total,power.limit,clocks.max.sm,driver_version --format=csv | tee "$OUT/gpus.txt"

echo "== 1: GEMM / attention / HBM sweep"
timeout 300 $PY -m megatron_autotuner.costmodel.measure_defaults "$OUT/defaults_h100.json" 2>"$OUT/defaults.err"
echo "defaults rc=$? ($(elapsed))"

echo "== 2: testbench cases"
$MAT profile --case-file "$HERE/../testbench/h100_x1_cases.json" --repeats 10 --warmup 3 --case-timeout 240 \
  --output-dir "$OUT/testbench" --json > "$OUT/testbench_summary.json"
echo "testbench rc=$? ($(elapsed))"

echo "== 3: training steps"
$VALIDATE --layouts "$HERE/h100_x1_layouts.json" --output-dir "$OUT/x1" --timeout-s 120 \
  2>&1 | tee "$OUT/x1.txt"
echo "validate ($(elapsed))"

EV="$OUT/evidence"
mkdir -p "$EV"
cp "$OUT/gpus.txt" "$OUT/defaults_h100.json" "$OUT/testbench_summary.json" "$EV/" 2>/dev/null
copy_runs "$OUT/x1" "$EV/x1"
copy_traces "$OUT/x1" "$EV/traces"
du -sh "$EV"
echo "wall time: $(elapsed)"
