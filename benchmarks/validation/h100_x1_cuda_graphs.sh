#!/bin/bash
# CUDA graphs on one H100 (nvidia-h100-x1), issue #27 item 2: eager megatron-core vs Transformer Engine per-layer
# graphs over the whole dense layer (cuda_graph_impl transformer_engine, scope attn + mlp; TECudaGraphHelper
# captures after 2 eager steps, then 1 more untimed step replays before 5 timed ones), seq 4096, micro-batch 1 / 2 / 4,
# training and forward-only (h100_x1_cuda_graphs_layouts.json, 36 layouts in eager / graphed pairs):
#   Qwen3-0.6B at full depth (28 layers);
#   Qwen3-1.7B reduced to 14 of its 28 layers (full depth at micro-batch 4 is predicted to need 84 GiB eager);
#   Qwen3-4B reduced to 8 of its 36 layers (its fp32 optimizer state alone does not fit one H100 at full depth).
#   Shapes: benchmarks/validation/models/Qwen3-{1.7B,4B}.json, from Megatron-Bridge's Qwen3ModelProvider1P7B / 4B
#   (src/megatron/bridge/models/qwen/qwen_provider.py) and the Qwen3 base provider (8 KV heads of 128, vocab 151936,
#   q/k norms, tied embeddings).
# What to read from it: the graphed step time (the host-time term the cost model does not have yet) and the memory
# the graphs add: predicted before the run (`mat validate` writes the predictions next to the measurements) from
# theory/memory.py's CUDA-graph term: per graphed layer the static hidden state and the b*s*s-byte causal mask
# (0.66 GiB for Qwen3-0.6B at micro-batch 1), and in forward-only runs the captured layers' saved activations.
# ~6 min. Run from the repository root on the GPU machine:
#     bash benchmarks/validation/h100_x1_cuda_graphs.sh
# Copy "$OUT"/evidence (or unpack "$OUT"/evidence.tgz) to benchmarks/results/validation_h100_x1/cuda_graphs.
OUT="${OUT:-$PWD/outputs/h100_x1_cuda_graphs}"
source "$(dirname "$0")/common.sh"
record_gpus
EVIDENCE="$OUT/evidence"
mkdir -p "$EVIDENCE"

echo "== 1. graphed tests ($(elapsed))"
timeout 300 $PY -m pytest -q -x -m gpu tests/validate/test_cuda_graph_layout.py -p no:cacheprovider 2>&1 \
  | tee "$OUT/gpu_tests.txt"
cp "$OUT/gpu_tests.txt" "$EVIDENCE/"

echo "== 2. eager vs graphed validate runs ($(elapsed))"
validate_batch "$HERE/h100_x1_cuda_graphs_layouts.json" graphs 240
collect_batch graphs "$EVIDENCE/graphs"
finish "$EVIDENCE"
