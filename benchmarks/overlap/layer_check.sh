#!/usr/bin/env bash
# The tuned userbuffers yaml in a real megatron-core TE TransformerLayer (TP=2, SP, tp_comm_overlap=True):
# fwd+bwd ms of NCCL vs TE default vs tuned, 2 passes each; then the same layer at TP=1 on one GPU
# (OUT_JSON's name with _tp1), the baseline of the whole-layer TP scaling check that `mat overlap analyze` reads
# from layer_check*.json in the tuning folder. ~1 min on 2x H200.
# Usage: bash benchmarks/overlap/layer_check.sh TUNING_DIR [OUT_JSON]   (TUNING_DIR from h200_x2.sh)
source /root/gpu/env.sh
set -uo pipefail
DIR=${1:?usage: layer_check.sh TUNING_DIR [OUT_JSON]}
RESULT=${2:-${OUT:-.}/layer_check.json}
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" UB_SKIPMC=1
ARGS=()
for M in Qwen3-8B Llama-3.1-8B; do
  Y="$DIR/$M/optimal_tp_comm_overlap_cfg_tp2.yaml"
  [ -f "$Y" ] || Y="$DIR/optimal_tp_comm_overlap_cfg_tp2.yaml"
  if [ -f "$Y" ]; then ARGS+=(--model "$M" --yaml "$Y"); else echo "no tuned yaml for $M in $DIR"; fi
done
[ ${#ARGS[@]} -gt 0 ] || exit 1
python3 -m torch.distributed.run --standalone --nproc-per-node=2 -m megatron_autotuner.overlap.layer_check \
    "${ARGS[@]}" --seq-len 8192 --warmup 3 --repeats 8 --passes 2 --out "$RESULT"
python3 -m torch.distributed.run --standalone --nproc-per-node=1 -m megatron_autotuner.overlap.layer_check \
    $(printf -- '--model %s ' Qwen3-8B Llama-3.1-8B) --seq-len 8192 --warmup 3 --repeats 8 --passes 2 \
    --out "${RESULT%.json}_tp1.json"
