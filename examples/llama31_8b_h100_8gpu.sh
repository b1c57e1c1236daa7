#!/usr/bin/env bash
# Llama-3.1-8B pre-training on one 8x H100 node, as a Megatron-LM launch. An example input for
# `mat estimate / theory / plan --megatron-args examples/llama31_8b_h100_8gpu.sh`; the shape follows the HF
# config of meta-llama/Llama-3.1-8B (32 layers, hidden 4096, 32 heads / 8 KV heads, FFN 14336, vocab 128256).
export CUDA_DEVICE_MAX_CONNECTIONS=1

torchrun --nproc-per-node 8 --nnodes 1 pretrain_gpt.py \
    --num-layers 32 \
    --hidden-size 4096 \
    --ffn-hidden-size 14336 \
    --num-attention-heads 32 \
    --group-query-attention \
    --num-query-groups 8 \
    --kv-channels 128 \
    --seq-length 8192 \
    --max-position-embeddings 131072 \
    --position-embedding-type rope \
    --rotary-base 500000 \
    --normalization RMSNorm \
    --swiglu \
    --untie-embeddings-and-output-weights \
    --disable-bias-linear \
    --vocab-size 128256 \
    --tensor-model-parallel-size 2 \
    --pipeline-model-parallel-size 1 \
    --context-parallel-size 1 \
    --sequence-parallel \
    --use-distributed-optimizer \
    --overlap-grad-reduce \
    --overlap-param-gather \
    --micro-batch-size 1 \
    --global-batch-size 64 \
    --bf16 \
    --attention-backend fused \
    --cross-entropy-loss-fusion \
    --lr 3e-4 \
    --min-lr 3e-5 \
    --lr-decay-style cosine \
    --train-iters 1000 \
    --mock-data \
    --tokenizer-type NullTokenizer
