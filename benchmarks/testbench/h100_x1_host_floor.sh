#!/bin/bash
# One H100 (nvidia-h100-x1): the host side of eager megatron-core layers (#27) and host copies beside NCCL (#26).
# 1. testbench decoder layers of Qwen3-0.6B / 1.7B / 4B and Llama-3.1-8B at s4096 (micro-batch 1/2/4), bf16 and
#    fp8 (delayed, tensorwise), and Qwen3-0.6B gpt_chunks of 4 and 8 layers: CUDA-event GPU time and the wall
#    time of the forward / backward calls (host_fwd_ms / host_bwd_ms, testbench.measure)                ~4 min
# 2. a torch-profiler trace of the Qwen3-0.6B decoder at micro-batch 1 (where its host time goes)         ~30 s
# 3. copy bandwidth, pinned and pageable, up to 1 GiB, alone and beside HBM copies, a one-rank NCCL
#    loop-back (all-reduce AVG) and bf16 GEMMs                                                            ~1 min
# 4. host time of a CUDA-graphed TE layer's forward / backward calls vs eager (graph_replay_host.py)      ~20 s
# The testbench builds its layers with Megatron-LM's fusions (testbench.operators.megatron_lm_fusions); the first
# lease's run of this script predates that (unfused RoPE): testbench_h100_x1/host_floor_unfused_rope.
# Run from the repository root on the GPU machine:
#     bash benchmarks/testbench/h100_x1_host_floor.sh
# Unpack "$OUT"/evidence.tgz to benchmarks/results/testbench_h100_x1/host_floor. The dense floor alone (no GPU
# times of cold single layers) is also left in $FLOOR_OUT for the validate runs that follow.
OUT="${OUT:-$PWD/outputs/h100_x1_host_floor}"
source "$(dirname "$0")/../validation/common.sh"
HERE="$(dirname "$0")"
record_gpus
EV="$OUT/evidence"
mkdir -p "$EV/collect"
echo "== 1: testbench host and GPU time"
$MAT profile --case-file "$HERE/h100_x1_host_floor_cases.json" --warmup 5 --repeats 20 --case-timeout 240 \
  --output-dir "$OUT/testbench" --calibration-out "$EV/host_floor.calibration.json" --json > "$EV/summary.json"
echo "testbench rc=$? ($(elapsed))"
cp "$OUT/testbench"/cases.json "$EV/" 2>/dev/null
$PY - "$EV/host_floor.calibration.json" "${FLOOR_OUT:-/root/dense_host_floor.calibration.json}" <<'PYEOF'
import json, sys
doc = json.load(open(sys.argv[1]))
keep = {k: doc[k] for k in ("schema_version", "tool_version", "kind", "gpu", "device_name", "date", "versions")}
json.dump(keep | {"ops": [], "dense_host_floor": doc["dense_host_floor"]}, open(sys.argv[2], "w"), indent=1)
PYEOF
cp "${FLOOR_OUT:-/root/dense_host_floor.calibration.json}" "$EV/dense_host_floor.calibration.json"
cp "$OUT/testbench"/collect/*.jsonl "$EV/collect/" 2>/dev/null
echo "== 2: profile ($(elapsed))"
$MAT profile --model Qwen3-0.6B --ops decoder --seq-len 4096 --mode torch-profile --warmup 5 --repeats 3 \
  --output-dir "$OUT/profile" --json > "$EV/profile_summary.json"
echo "profile rc=$? ($(elapsed))"
for t in "$OUT"/profile/torch_profiler/*/rank_0.json.gz; do [ -f "$t" ] && cp "$t" "$EV/qwen3_0.6b_decoder.rank_0.json.gz"; done
echo "== 3: copy bandwidth ($(elapsed))"
$MAT profile --mode copy-bandwidth --max-copy-gib 1 --copy-interference none,hbm_d2d,nccl_loopback,gemm \
  --output-dir "$OUT/copy" --calibration-out "$EV/copy.calibration.json" --json > "$EV/copy_summary.json"
echo "copy rc=$? ($(elapsed))"
cp "$OUT"/copy/copy_bandwidth/summary.json "$EV/copy_bandwidth_summary.json" 2>/dev/null
cp "$OUT"/copy/copy_bandwidth/rank_0.jsonl "$EV/copy_bandwidth_rank_0.jsonl" 2>/dev/null
echo "== 4: graph replay host time ($(elapsed))"
$PY "$HERE/graph_replay_host.py" --out "$EV/graph_replay_host.json"
echo "graph replay rc=$? ($(elapsed))"
cp "$OUT/gpus.txt" "$EV/" 2>/dev/null
finish "$EV"
