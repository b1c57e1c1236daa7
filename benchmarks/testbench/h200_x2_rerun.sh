#!/usr/bin/env bash
# Second H200 testbench pass (benchmarks/results/testbench_h200_x2/rerun/): dense MLP and decoder with
# bias_activation_fusion on (as Megatron-LM trains), the MoE block alone at EP=1/2, and attention with
# context parallelism (CP=2, p2p ring and all-to-all). Usage, from the repo root on a 2-GPU machine:
#   bash benchmarks/testbench/h200_x2_rerun.sh OUTDIR
set -uo pipefail
OUT_ROOT=${1:?usage: h200_x2_rerun.sh OUTDIR}
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
MAT="python3 -m megatron_autotuner.cli"
COMMON="--repeats 10 --warmup 3 --case-timeout 180"
$MAT profile --model Qwen3-8B,Llama-3.1-8B --ops mlp,decoder --tp 1,2 --seq-len 4096,8192 $COMMON \
    --output-dir "$OUT_ROOT/dense_fused" --json > "$OUT_ROOT/dense_fused_summary.json"; echo "dense_fused rc=$?"
$MAT profile --model Qwen3-30B-A3B --ops moe --ep 1,2 --seq-len 4096 $COMMON \
    --output-dir "$OUT_ROOT/moe_block" --json > "$OUT_ROOT/moe_block_summary.json"; echo "moe_block rc=$?"
$MAT profile --case-file benchmarks/testbench/cp_attention_cases.json $COMMON \
    --output-dir "$OUT_ROOT/cp_attention" --json > "$OUT_ROOT/cp_attention_summary.json"; echo "cp rc=$?"
python3 - "$OUT_ROOT" <<'PY'
import json, sys, pathlib
for f in sorted(pathlib.Path(sys.argv[1]).glob("*_summary.json")):
    try:
        rows = json.loads(f.read_text()).get("rows", [])
    except Exception as exc:
        print(f.name, "unreadable", exc); continue
    for r in rows:
        print(f"{r['status']:6s} {r['case_id'][:58]:58s} {r.get('fwd_bwd_ms') or 0:8.3f} ms "
              f"{r.get('fwd_bwd_tflops') or 0:7.1f} TF act {r.get('activation_ratio') or 0:5.2f} {(r.get('error') or '')[:90]}")
PY
