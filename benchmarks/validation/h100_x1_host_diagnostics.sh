#!/bin/bash
# One H100 (nvidia-h100-x1), #26 / #27: where the dense host floor misses.
# Part "testbench" (~2 min):
#   testbench decoder layers (h100_x1_host_no_grad_cases.json): Qwen3-0.6B at micro-batch 1/2/4 and packed (THD)
#   at 8k / 16k tokens, Qwen3-1.7B / 4B / Llama-3.1-8B at micro-batch 1: the host wall time of the forward call
#   with and without autograd (testbench.measure: host_fwd_ms, host_fwd_no_grad_ms), with CUDA-event times.
# Part "profile" (~2 min): torch-profiler traces of full-depth Qwen3-0.6B steps, eager, forward-only at micro-batch
#   1 and 4 and training at 4 (h100_x1_host_overlap_layouts.json): how host and GPU overlap where the model
#   takes max(host, GPU) and measured more.
# Part "graphs" (~4 min): CUDA-graphed (transformer_engine) training of a 4-layer Qwen3-0.6B, one process per
#   layout (h100_x1_graph_capture_layouts.json): default DDP + distributed optimizer, plain DDP, no param-gather
#   overlap, capture before the first step, and forward-only; each failure keeps its traceback and the job log.
# Every prediction is written by `mat validate` before its run (layouts.json).
#     bash benchmarks/validation/h100_x1_host_diagnostics.sh testbench|profile|graphs
# Unpack "$OUT"/evidence.tgz to benchmarks/results/validation_h100_x1/host_diagnostics.
OUT="${OUT:-$PWD/outputs/h100_x1_host_diagnostics}"
source "$(dirname "$0")/common.sh"
RUNS="${RUNS:-/root/runs/host_diagnostics}"  # outside $OUT: a second call resumes there
record_gpus
EV="$OUT/evidence"
mkdir -p "$EV" "$RUNS"
case "${1:?testbench|profile|graphs}" in
  testbench)
    mkdir -p "$EV/testbench/collect"
    $MAT profile --case-file "$HERE/../testbench/h100_x1_host_no_grad_cases.json" --warmup 5 --repeats 20 \
      --case-timeout 240 --output-dir "$RUNS/testbench" --calibration-out "$EV/testbench/host_floor.calibration.json" \
      --json > "$EV/testbench/summary.json"
    echo "testbench rc=$? ($(elapsed))"
    cp "$RUNS/testbench"/cases.json "$EV/testbench/" 2>/dev/null
    cp "$RUNS/testbench"/collect/*.jsonl "$EV/testbench/collect/" 2>/dev/null
    ;;
  profile)
    $VALIDATE --layouts "$HERE/h100_x1_host_overlap_layouts.json" --output-dir "$RUNS/profile" --timeout-s 240 \
      2>&1 | tee "$RUNS/profile.txt"
    copy_runs "$RUNS/profile" "$EV/profile"
    cp "$RUNS/profile.txt" "$EV/profile/run.log"
    copy_traces "$RUNS/profile" "$EV/profile/traces"
    ;;
  graphs)
    $VALIDATE --layouts "$HERE/h100_x1_graph_capture_layouts.json" --output-dir "$RUNS/graphs" --timeout-s 240 \
      --layouts-per-job 1 2>&1 | tee "$RUNS/graphs.txt"
    copy_runs "$RUNS/graphs" "$EV/graphs"
    cp "$RUNS/graphs.txt" "$EV/graphs/run.log"
    mkdir -p "$EV/graphs/jobs"
    for log in "$RUNS/graphs"/jobs/*.log; do [ -f "$log" ] && tail -c 20000 "$log" > "$EV/graphs/jobs/$(basename "$log")"; done
    ;;
esac
cp "$OUT/gpus.txt" "$EV/" 2>/dev/null
finish "$EV"
