# GRPO on Qwen3-8B, 8 x H100 80GB, one node, verl's Megatron engine with a colocated vLLM rollout.
# Written like verl's own Megatron GRPO examples (volcengine/verl@b178a3c
# examples/grpo_trainer/run_qwen2-7b_math_megatron.sh and run_qwen3moe-30b_megatron_96gb.sh: main_ppo with
# ppo_megatron_trainer, KL loss so the reference model runs, vLLM rollout), with literal values in place of
# their shell variables (mat reads this file and runs no shell):
#   prompts of up to 1k tokens, responses of up to 4k, 8 responses per prompt, 256 prompts per step,
#   dynamic batching with 10k tokens per GPU, TP2 x PP1 actor / ref, rollout TP2.
#   mat rlhf --verl-args examples/verl_grpo_qwen3_8b_h100_8gpu.sh --gpu H100-SXM --num-gpus 8
python3 -m verl.trainer.main_ppo --config-path=config \
    --config-name='ppo_megatron_trainer.yaml' \
    algorithm.adv_estimator=grpo \
    data.train_files=/data/math/train.parquet \
    data.val_files=/data/math/test.parquet \
    data.train_batch_size=256 \
    data.max_prompt_length=1024 \
    data.max_response_length=4096 \
    data.filter_overlong_prompts=True \
    data.truncation='error' \
    actor_rollout_ref.model.path=Qwen/Qwen3-8B \
    actor_rollout_ref.actor.optim.lr=1e-6 \
    actor_rollout_ref.actor.ppo_mini_batch_size=64 \
    actor_rollout_ref.actor.use_dynamic_bsz=True \
    actor_rollout_ref.actor.ppo_max_token_len_per_gpu=10240 \
    actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2 \
    actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=1 \
    actor_rollout_ref.actor.megatron.param_offload=True \
    actor_rollout_ref.actor.megatron.optimizer_offload=True \
    actor_rollout_ref.actor.use_kl_loss=True \
    actor_rollout_ref.actor.kl_loss_coef=0.001 \
    actor_rollout_ref.actor.kl_loss_type=low_var_kl \
    actor_rollout_ref.actor.entropy_coeff=0 \
    actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=20480 \
    actor_rollout_ref.rollout.tensor_model_parallel_size=2 \
    actor_rollout_ref.rollout.name=vllm \
    actor_rollout_ref.rollout.gpu_memory_utilization=0.6 \
    actor_rollout_ref.rollout.n=8 \
    actor_rollout_ref.ref.log_prob_max_token_len_per_gpu=20480 \
    actor_rollout_ref.ref.megatron.param_offload=True \
    algorithm.use_kl_in_reward=False \
    trainer.critic_warmup=0 \
    trainer.logger='["console"]' \
    trainer.project_name='verl_grpo_qwen3_8b' \
    trainer.experiment_name='qwen3_8b_megatron_h100x8' \
    trainer.n_gpus_per_node=8 \
    trainer.nnodes=1 \
    trainer.save_freq=20 \
    trainer.test_freq=5 \
    trainer.total_epochs=15
