#!/usr/bin/env bash
# TP-overlap tuning at TP=4 on one 4-GPU host (nvidia-h200-x4), ~2.5 min wall: the Qwen3-8B shape, seq 8192, TE
# userbuffers (TP=1 as the GEMM scaling baseline), then the whole-layer check: the real megatron-core TE layer at TP=4
# with NCCL / TE's default userbuffers / the tuned yaml, and the plain layer at TP=1 on one GPU (layer_check_tp1.json),
# which `mat overlap analyze` reads for its whole-layer TP verdict. Results under "$OUT/overlap".
# Usage, from the repo root on the GPU machine (TE + megatron-core installed, ../shared/gpu/README.md):
#   bash benchmarks/overlap/h200_x4.sh
source /root/gpu/env.sh
set -uo pipefail
OUT=${OUT:?OUT must be set (the device tool sets it)}
DIR="$OUT/overlap"
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" UB_SKIPMC=1
timeout 230 python3 -m megatron_autotuner.cli overlap --model Qwen3-8B --tp-sizes 4 --max-token-len 8192 \
    --operators qkv proj fc1 fc2 --backend te --min-num-sm 4 --max-num-sm 16 --num-splits 4 8 --cga-sizes 2 \
    --overlap-threshold 0.5 --warmup 2 --repeats 5 --verify-passes 1 --case-timeout 60 --output-dir "$DIR"
timeout 20 python3 -m megatron_autotuner.cli overlap analyze "$DIR" > "$DIR/summary_reanalyzed.txt"
timeout 100 python3 -m torch.distributed.run --standalone --nproc-per-node=4 -m megatron_autotuner.overlap.layer_check \
    --model Qwen3-8B --yaml "$DIR/optimal_tp_comm_overlap_cfg_tp4.yaml" --seq-len 8192 --warmup 3 --repeats 8 \
    --passes 2 --out "$DIR/layer_check.json"
timeout 120 python3 -m torch.distributed.run --standalone --nproc-per-node=1 -m megatron_autotuner.overlap.layer_check \
    --model Qwen3-8B --seq-len 8192 --warmup 3 --repeats 8 --passes 2 --out "$DIR/layer_check_tp1.json"
