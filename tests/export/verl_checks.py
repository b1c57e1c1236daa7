"""verl's own config code as the export checks use it: Hydra composition of verl's ppo_trainer.yaml with override
lines, `validate_config` as verl.trainer.main_ppo calls it, and the actor / ref engine configs its workers build.
`verl_env` is a fixture (tests/export/conftest.py); it skips without verl."""

from __future__ import annotations

import copy
import os

import pytest

# A GRPO run with a KL loss (so the reference policy is used) on 32 nodes of 8 GPUs (TP8 x PP8 x CP2 -> DP 2).
VERL_BASE = [
    "model_engine=megatron",
    "algorithm.adv_estimator=grpo",
    "critic.enable=false",
    "actor_rollout_ref.actor.use_kl_loss=true",
    "actor_rollout_ref.rollout.name=vllm",
    "trainer.n_gpus_per_node=8",
    "trainer.nnodes=32",
    "data.train_batch_size=512",
    "actor_rollout_ref.actor.ppo_mini_batch_size=128",
]


@pytest.fixture(scope="module")
def verl_env():
    verl_config = pytest.importorskip("verl.utils.config", exc_type=ImportError)
    hydra = pytest.importorskip("hydra")
    import verl
    from verl.trainer.ppo.utils import need_critic, need_reference_policy

    config_dir = os.path.join(os.path.dirname(verl.__file__), "trainer", "config")

    def compose(overrides, base=VERL_BASE):
        with hydra.initialize_config_dir(config_dir=config_dir, version_base=None):
            return hydra.compose("ppo_trainer", overrides=[*base, *overrides])

    def validate(cfg):
        # as verl.trainer.main_ppo.main does
        verl_config.validate_config(cfg, use_reference_policy=need_reference_policy(cfg), use_critic=need_critic(cfg))

    return compose, validate, verl_config.omega_conf_to_dataclass


def engine_worker_configs(cfg, omega_conf_to_dataclass):
    """Instantiate actor and ref as verl/workers/engine_workers.py init_model does (verl 0.9.1)."""
    from omegaconf import open_dict

    arr = copy.deepcopy(cfg.actor_rollout_ref)
    actor = omega_conf_to_dataclass(arr.actor)
    with open_dict(arr.ref):
        arr.ref.ppo_mini_batch_size = arr.actor.ppo_mini_batch_size
        arr.ref.ppo_micro_batch_size = arr.ref.pop("log_prob_micro_batch_size", None)
        arr.ref.ppo_micro_batch_size_per_gpu = arr.ref.pop("log_prob_micro_batch_size_per_gpu", None)
        arr.ref.use_dynamic_bsz = arr.ref.pop("log_prob_use_dynamic_bsz", False)
        arr.ref.ppo_max_token_len_per_gpu = arr.ref.pop("log_prob_max_token_len_per_gpu", None)
    ref = omega_conf_to_dataclass(arr.ref)
    # engine_workers.py asserts these before building the actor
    assert arr.actor.use_dynamic_bsz == arr.rollout.log_prob_use_dynamic_bsz
    if arr.actor.use_dynamic_bsz:
        assert arr.rollout.log_prob_max_token_len_per_gpu is not None
        assert arr.actor.ppo_max_token_len_per_gpu is not None
    else:
        assert arr.rollout.log_prob_micro_batch_size_per_gpu is not None
        assert arr.actor.ppo_micro_batch_size_per_gpu is not None
    return actor, ref
