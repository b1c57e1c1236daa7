#!/bin/bash
# Llama-3.1-405B pre-training, 1024x H100 (128 nodes x 8), FP8 current scaling (tensorwise),
# TP8 PP8 CP2 VPP8, seq 8192, MBS 1, GBS 1536: NVIDIA's Megatron-Bridge performance recipe
# translated into Megatron-LM (pretrain_gpt.py) flags.
#
# Sources (BR = NVIDIA-NeMo/Megatron-Bridge@067f987df03b8355b03192d88d70f1709fedf51a,
#          MLM = NVIDIA/Megatron-LM@d98e8a64ddf34856e74b24714e3bedb2f5a39553):
#  [R] BR: src/megatron/bridge/perf_recipes/llama/h100/llama31.py, llama31_405b_pretrain_1024gpu_h100_fp8cs_config
#      -> precision "fp8_cs"; vocab_size 128256; seq 8192; TP 8, PP 8, CP 2, VPP 8, sequence_parallel;
#         global_batch_size 1536 (the config's own GBS), micro_batch_size 1;
#         comm_overlap.tp_comm_overlap_cfg = userbuffers_fp8_h100_h16384_tp8_cp2_mbs1_seqlen8192;
#         _enable_overlap_param_gather_with_optimizer_step; env_vars (exported below).
#  [B] BR: src/megatron/bridge/recipes/llama/h100/llama3.py, llama31_405b_pretrain_256gpu_h100_bf16_config
#      (base of [R], imported as llama31_405b_pretrain_config via perf_recipes/llama/common.py)
#      -> model = AutoBridge("meta-llama/Meta-Llama-3.1-405B"); account_for_embedding_in_pipeline_split=True,
#         account_for_loss_in_pipeline_split=True; transformer_impl transformer_engine; cuda_graph_impl "none";
#         cross_entropy_loss_fusion True, cross_entropy_fusion_impl "te"; recompute_granularity None (no recompute);
#         use_precision_aware_optimizer False (fp32 main grads/params/moments);
#         ddp: overlap_grad_reduce, overlap_param_gather, use_distributed_optimizer, average_in_collective True;
#         CommOverlapConfig(tp_comm_overlap=True); dataset.num_workers 8.
#  [P] BR: src/megatron/bridge/perf_recipes/_common.py, _perf_precision("fp8_cs") -> mixed_precision.py
#      bf16_with_fp8_current_scaling_mixed: bf16, fp8 "hybrid", fp8_recipe "tensorwise", fp8_param_gather True;
#      _perf_precision sets first_last_layers_bf16=False and grad_reduce_in_fp32=False.
#      _benchmark_common: train_iters 50, eval_iters 0, manual_gc interval 100, no checkpoint save/load,
#      log_interval 1, check_for_nan_in_grad/loss False, lr_warmup_iters 10, lr_decay_iters 50,
#      apply_rope_fusion True, cross_entropy_fusion_impl "te", ddp.grad_reduce_in_fp32 False;
#      cuda_graph_impl "none" -> te_rng_tracker False, cuda_graph_scope [].
#  [C] BR: src/megatron/bridge/training/comm_overlap.py, CommOverlapConfig._get_model_comm_overlap_cfgs /
#      _get_optimizer_overlap_cfgs: PP>1 and VPP>1 -> overlap_p2p_comm True, batch_p2p_comm False;
#      DP = 1024/(8*8*2) = 8 > 1 -> bucket_size 128 MiB, overlap_grad_reduce, overlap_param_gather,
#      align_param_gather True; defer_embedding_wgrad_compute False.
#  [O] BR: src/megatron/bridge/recipes/common.py _pretrain_common + recipes/utils/optimizer_utils.py
#      distributed_fused_adam_with_cosine_annealing: adam, lr 3e-4, min_lr 3e-5, betas 0.9/0.95, eps 1e-8,
#      weight_decay 0.1 (its scheduler's start/end_weight_decay 0.033 'constant' has no MLM flag: MLM's
#      constant style uses --weight-decay), clip_grad 1.0, cosine decay; seed 1234;
#      split "99990,8,2" (scripts/performance/utils/datasets.py create_mock_dataset_config, --data mock default);
#      rerun_state_machine rerun_mode "disabled" (training/config.py RerunStateMachineConfig default).
#  [M] Model shape: HF meta-llama/Meta-Llama-3.1-405B config.json (126 layers, hidden 16384, intermediate 53248,
#      128 heads, 8 KV heads, vocab 128256, rope_theta 500000, rope_scaling llama3 factor 8, rms_norm_eps 1e-5,
#      untied, no biases, max_position_embeddings 131072), mapped by BR src/megatron/bridge/models/llama/
#      llama_bridge.py (RMSNorm, gated SiLU, rope, rope_scaling factor 8, hidden_dropout 0) and matching
#      Llama31ModelProvider405B in BR@dc805f5cf9e0001c1f7c860ebb8e42c580ef45b3 models/llama/llama_provider.py.
#  Published: BR docs/performance-summary-archive.md, 26.06 and 26.04.01 tables, DGX-H100 1024 FP8
#      GBS 1536 MBS 1 seq 8192 TP8 PP8 CP2 VP8 (326-328 tokens/s/GPU, 822-827 TFLOP/s/GPU).
#
# Inferred / translated (not literally in the recipe):
#  - --make-vocab-size-divisible-by 16: Bridge's training/setup.py _validate_and_set_vocab_size keeps the
#    preset model vocab 128256 UNPADDED (should_pad_vocab becomes False since model vocab >= tokenizer vocab);
#    16 x TP8 = 128 divides 128256, so MLM also pads nothing. (MLM's default 128 would pad to 129024.)
#  - --kv-channels 128 = 16384/128 (HF head_dim). --cp-comm-type p2p: recipe leaves cp_comm_type unset (MCore p2p).
#  - --grad-reduce-in-bf16 = ddp.grad_reduce_in_fp32 False ([P]); --ddp-average-in-collective ([B]).
#  - --ckpt-format torch: MLM's validate_args rejects --overlap-param-gather-with-optimizer-step with
#    distributed checkpoint formats; the recipe saves no checkpoint ([P]), so no --save/--load here.
#  - --tp-comm-overlap-cfg is NOT given: MLM wants a YAML path; the recipe's per-GEMM userbuffers table
#    userbuffers_fp8_h100_h16384_tp8_cp2_mbs1_seqlen8192 (BR training/comm_overlap.py) is:
#    qkv_dgrad bulk(num_sm 2,cga 2), qkv_wgrad bulk(24,2), fc1_dgrad bulk(2,2), fc1_wgrad bulk(2,2),
#    qkv_fprop/proj_dgrad/fc1_fprop/fc2_dgrad ring_exchange(aggregate False),
#    proj_fprop/fc2_fprop ring_exchange(num_sm 1, set_sm_margin True).
#  - CONFLICT WITH MLM VALIDATION: --cross-entropy-fusion-impl te (the recipe's value) together with
#    --cross-entropy-loss-fusion is rejected by MLM's validate_args (megatron/training/arguments.py ~l.1697,
#    "TE cross entropy loss fusion is disabled due to stability issues"); kept as the recipe has it. To run
#    under pretrain_gpt.py use --cross-entropy-fusion-impl native. Apart from this, MLM@d98e8a6 parse_args +
#    validate_args + core_transformer_config_from_args accept this file (checked on CPU with TE/CUDA stubbed).
#  - No Megatron-LM equivalent / omitted: model.moe_token_dispatcher_type "alltoall" (set by the recipe on a
#    dense model; no effect); train.manual_gc_eval; dataset pin_memory/persistent_workers; env-only settings.
#  - NullTokenizer + --mock-data follow the perf launcher's defaults (tokenizer NullTokenizer, --data mock).

export TORCH_NCCL_HIGH_PRIORITY=1
export CUDA_DEVICE_MAX_CONNECTIONS=1
export NCCL_GRAPH_REGISTER=0
export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
export TORCH_NCCL_AVOID_RECORD_STREAMS=1
export NCCL_NVLS_ENABLE=0
export NVTE_BWD_LAYERNORM_SM_MARGIN=20
export NVTE_FWD_LAYERNORM_SM_MARGIN=20
export NCCL_P2P_NET_CHUNKSIZE=2097152

torchrun --nproc_per_node 8 --nnodes 128 --node_rank ${NODE_RANK} --master_addr ${MASTER_ADDR} --master_port 6000 \
    pretrain_gpt.py \
    --num-layers 126 \
    --hidden-size 16384 \
    --ffn-hidden-size 53248 \
    --num-attention-heads 128 \
    --group-query-attention \
    --num-query-groups 8 \
    --kv-channels 128 \
    --swiglu \
    --normalization RMSNorm \
    --norm-epsilon 1e-5 \
    --disable-bias-linear \
    --untie-embeddings-and-output-weights \
    --position-embedding-type rope \
    --rotary-base 500000 \
    --rotary-percent 1.0 \
    --use-rope-scaling \
    --rope-scaling-factor 8 \
    --max-position-embeddings 131072 \
    --attention-dropout 0.0 \
    --hidden-dropout 0.0 \
    --init-method-std 0.02 \
    --transformer-impl transformer_engine \
    --tensor-model-parallel-size 8 \
    --pipeline-model-parallel-size 8 \
    --num-virtual-stages-per-pipeline-rank 8 \
    --account-for-embedding-in-pipeline-split \
    --account-for-loss-in-pipeline-split \
    --context-parallel-size 2 \
    --cp-comm-type p2p \
    --sequence-parallel \
    --tp-comm-overlap \
    --use-distributed-optimizer \
    --overlap-grad-reduce \
    --overlap-param-gather \
    --overlap-param-gather-with-optimizer-step \
    --ddp-bucket-size 134217728 \
    --ddp-average-in-collective \
    --grad-reduce-in-bf16 \
    --micro-batch-size 1 \
    --global-batch-size 1536 \
    --seq-length 8192 \
    --bf16 \
    --fp8-format hybrid \
    --fp8-recipe tensorwise \
    --fp8-param-gather \
    --cross-entropy-loss-fusion \
    --cross-entropy-fusion-impl te \
    --manual-gc \
    --manual-gc-interval 100 \
    --no-check-for-nan-in-loss-and-grad \
    --rerun-mode disabled \
    --optimizer adam \
    --lr 3e-4 \
    --min-lr 3e-5 \
    --lr-decay-style cosine \
    --lr-warmup-iters 10 \
    --lr-decay-iters 50 \
    --adam-beta1 0.9 \
    --adam-beta2 0.95 \
    --adam-eps 1e-8 \
    --weight-decay 0.1 \
    --clip-grad 1.0 \
    --seed 1234 \
    --train-iters 50 \
    --eval-iters 0 \
    --mock-data \
    --split 99990,8,2 \
    --num-workers 8 \
    --tokenizer-type NullTokenizer \
    --vocab-size 128256 \
    --make-vocab-size-divisible-by 16 \
    --ckpt-format torch \
    --log-interval 1
