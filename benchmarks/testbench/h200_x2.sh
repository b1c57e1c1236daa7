#!/usr/bin/env bash
# Reproduces the committed testbench evidence (benchmarks/results/testbench_h200_x2/) on a 2x H200 machine
# with megatron-core + TE installed (../shared/gpu/README.md). Usage, from the repo root:
#   bash benchmarks/testbench/h200_x2.sh OUTDIR
# Runs: dense layer ops of Qwen3-8B and Llama-3.1-8B at seq 4096/8192, TP=1 and TP=2+SP; GEMM / head / norm
# ops for calibration; Qwen3-30B-A3B MoE layer at EP=1/2; one torch-profile run and one memory snapshot.
set -uo pipefail
OUT_ROOT=${1:?usage: h200_x2.sh OUTDIR}
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
MAT="python3 -m megatron_autotuner.cli"
COMMON="--repeats 10 --warmup 3 --case-timeout 240"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
$MAT profile --model Qwen3-8B,Llama-3.1-8B --ops attention,mlp,decoder --tp 1,2 --seq-len 4096,8192 \
    $COMMON --output-dir "$OUT_ROOT/dense" --json > "$OUT_ROOT/dense_summary.json"; echo "dense rc=$?"
$MAT profile --model Qwen3-8B,Llama-3.1-8B --ops column_linear,row_linear,lm_head,norm,embedding --tp 1,2 \
    --seq-len 4096,8192 $COMMON --output-dir "$OUT_ROOT/pieces" --json > "$OUT_ROOT/pieces_summary.json"; echo "pieces rc=$?"
$MAT profile --model Qwen3-30B-A3B --ops moe,decoder --ep 1,2 --seq-len 4096 $COMMON \
    --output-dir "$OUT_ROOT/moe" --json > "$OUT_ROOT/moe_summary.json"; echo "moe rc=$?"
$MAT profile --model Llama-3.1-8B --ops decoder --tp 2 --seq-len 8192 --mode torch-profile $COMMON \
    --output-dir "$OUT_ROOT/profile" --json > "$OUT_ROOT/profile_summary.json"; echo "profile rc=$?"
$MAT profile --model Qwen3-8B --ops decoder --tp 1 --seq-len 4096 --mode memory-snapshot $COMMON \
    --output-dir "$OUT_ROOT/snapshot" --json > "$OUT_ROOT/snapshot_summary.json"; echo "snapshot rc=$?"
$MAT profile --model Qwen3-8B --ops gpt_chunk --num-layers 2 --tp 1,2 --seq-len 4096 $COMMON \
    --output-dir "$OUT_ROOT/chunk" --json > "$OUT_ROOT/chunk_summary.json"; echo "chunk rc=$?"
timeout 200 python3 -m megatron_autotuner.costmodel.measure_defaults "$OUT_ROOT/defaults_h200.json"; echo "defaults rc=$?"
python3 - "$OUT_ROOT" <<'PY'
import json, sys, pathlib
root = pathlib.Path(sys.argv[1])
for f in sorted(root.glob("*_summary.json")):
    try:
        data = json.loads(f.read_text())
    except Exception as exc:
        print(f.name, "unreadable", exc); continue
    for r in data.get("rows", []):
        print(f"{r['status']:6s} {r['case_id'][:58]:58s} {r.get('fwd_bwd_ms', 0) or 0:8.3f} ms "
              f"{r.get('fwd_bwd_tflops') or 0:7.1f} TF act {r.get('activation_ratio') or 0:5.2f} {(r.get('error') or '')[:70]}")
PY
