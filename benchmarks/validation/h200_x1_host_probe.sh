#!/bin/bash
# One H200 (nvidia-h200), #27: the small-model host-floor check of h100_x1_host_probe.sh on another machine kind,
# and the single layers an H200 times from an empty queue.
# Part "run" (~14 min): h100_x1_host_probe.sh run on h200_x1_host_probe_layouts.json: the in-model probes, then the
#   18 eager layouts of the H100 leases (Qwen3-0.6B, 1.7B.L14, 4B.L8 at micro-batch 1 / 2 / 4, s4096, training and
#   forward-only) and six with TE's per-layer CUDA graphs (attn + mlp), each predicted before it runs.
# Part "layers" (~4 min): the testbench's single decoder layers at TP 1 (h200_x1_decoder_cases.json: the 8B shapes
#   of testbench_h200_x2 at s4096 / s8192 and two small ones), CUDA-event and host times of each phase, and the
#   floor they give; then benchmarks/overlap/layer_check.py's plain layer at TP 1 (the whole-layer baseline of the
#   overlap tuner's TP-scaling check) into layer_check_tp1.json.
# Part "issue" (~2 min): ten more single decoder layers at TP 1 (h200_x1_issue_order_cases.json: shapes the issue
#   fractions were not read from), each predicted before the lease (../results/validation_h200_x1/issue_order/
#   predicted_issue_order.json), for the empty-queue forward's issue order, and a torch-profiler trace of the
#   Qwen3-8B layer at s4096 (where a large TP 1 layer's host launches each op group); evidence in
#   "$OUT"/issue_order.tgz.
# Resumable: runs live in $RUNS, outside $OUT.
#     bash benchmarks/validation/h200_x1_host_probe.sh run|layers|issue
# Unpack "$OUT"/evidence.tgz to benchmarks/results/validation_h200_x1/host_probe.
OUT="${OUT:-$PWD/outputs/h200_x1_host_probe}"
RUNS="${RUNS:-/root/runs/h200_host_probe}"
HERE_H200="$(dirname "$0")"
# testbench CASES NAME EV [more mat profile options]: the single layers of CASES into $RUNS/NAME, then their cases,
# summary and per-rank records into EV/testbench.
testbench() {
  local cases=$1 name=$2 ev=$3
  shift 3
  mkdir -p "$ev/testbench/collect" "$RUNS"
  $MAT profile --case-file "$HERE/../testbench/$cases" --warmup 5 --repeats 20 --case-timeout 240 \
    --output-dir "$RUNS/$name" --json "$@" > "$ev/testbench/testbench-summary.json" 2>>"$RUNS/$name.log"
  echo "testbench rc=$? ($(elapsed))" | tee -a "$RUNS/$name.log"
  cp "$RUNS/$name"/cases.json "$ev/testbench/" 2>/dev/null
  cp "$RUNS/$name"/collect/*.jsonl "$ev/testbench/collect/" 2>/dev/null
}
case "${1:?run|layers|issue}" in
  run)
    OUT="$OUT" RUNS="$RUNS" LAYOUTS="$HERE_H200/h200_x1_host_probe_layouts.json" \
      exec bash "$HERE_H200/h100_x1_host_probe.sh" run
    ;;
  layers)
    source "$HERE_H200/common.sh"
    record_gpus
    EV="$OUT/evidence"
    testbench h200_x1_decoder_cases.json testbench "$EV" --calibration-out "$EV/testbench/host_floor.calibration.json"
    $PY -m torch.distributed.run --standalone --nproc-per-node=1 -m megatron_autotuner.overlap.layer_check \
      --model Qwen3-8B --model Llama-3.1-8B --seq-len 8192 --warmup 3 --repeats 8 --passes 2 \
      --out "$EV/layer_check_tp1.json" 2>&1 | tail -20 | tee -a "$RUNS/testbench.log"
    echo "layer_check rc=${PIPESTATUS[0]} ($(elapsed))" | tee -a "$RUNS/testbench.log"
    cp "$RUNS/testbench.log" "$EV/layers.log" 2>/dev/null
    finish "$EV"
    ;;
  issue)
    source "$HERE_H200/common.sh"
    record_gpus
    EV="$OUT/issue_order"
    testbench h200_x1_issue_order_cases.json issue "$EV"
    # where the host launches each op group of a large TP 1 layer (the committed fractions are a small layer's)
    $MAT profile --model Qwen3-8B --ops decoder --seq-len 4096 --mode torch-profile --warmup 5 --repeats 3 \
      --output-dir "$RUNS/issue_profile" --json > "$EV/profile_summary.json" 2>>"$RUNS/issue.log"
    echo "profile rc=$? ($(elapsed))" | tee -a "$RUNS/issue.log"
    for t in "$RUNS"/issue_profile/torch_profiler/*/rank_0.json.gz; do
      [ -f "$t" ] && cp "$t" "$EV/qwen3_8b_decoder.rank_0.json.gz"
    done
    cp "$RUNS/issue.log" "$OUT/gpus.txt" "$EV/" 2>/dev/null
    finish "$EV"
    ;;
esac
