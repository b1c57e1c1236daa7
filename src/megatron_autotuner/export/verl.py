"""verl overrides for a Megatron-LM launch: `actor_rollout_ref.{actor,ref,rollout}` keys of verl's
`ppo_trainer.yaml` (model_engine=megatron), as a nested dict, a yaml file or `key=value` command-line lines.

The input is the same Megatron-LM argument dict as `export.bridge` (argparse dests; missing = Megatron's
default). Pure Python: no torch, no verl import.

Sources (each fact below cites one of these):
- verl: volcengine/verl@b178a3c (b178a3cd56f5, 0.8.0.dev), and the PyPI wheel verl==0.9.1, which has the same
  keys (the tests check the exports against the wheel's own config files and validation)
- Megatron-LM @ d98e8a6 (through `export.bridge.MegatronArgs`)

Colocated actor / ref / rollout share one GPU set, so the reference model runs with the actor's parallel layout:
the same sizes are written to `ref.megatron`, and `ref.megatron.override_transformer_config` is verl's
interpolation of the actor's (verl/trainer/config/ref/megatron_ref.yaml @ b178a3c), so never a different one.
"""

from __future__ import annotations

import re
from typing import Any

import yaml

from ..errors import ConfigError
from .bridge import MegatronArgs

VERL_REF = "volcengine/verl@b178a3c"
MODES = ("train", "forward")

ARR = "actor_rollout_ref"
# Every verl config key this module writes, and every key `rlhf.verl_args` reads from a launch: one table (verl's
# names, verl/trainer/config/_generated_ppo_megatron_trainer.yaml of verl 0.9.1; the same at b178a3c).
VERL_KEYS: dict[str, str] = {
    # layout: McoreEngineConfig (verl/workers/config/engine.py); the sizes are `MCORE_LAYOUT_KEYS` under these
    "actor_megatron": f"{ARR}.actor.megatron",
    "ref_megatron": f"{ARR}.ref.megatron",
    "critic_megatron": "critic.megatron",
    "actor_transformer_overrides": f"{ARR}.actor.megatron.override_transformer_config",
    "actor_ddp_overrides": f"{ARR}.actor.megatron.override_ddp_config",
    "actor_optimizer_overrides": f"{ARR}.actor.optim.override_optimizer_config",
    "actor_distributed_optimizer": f"{ARR}.actor.megatron.use_distributed_optimizer",
    "actor_dtype": f"{ARR}.actor.megatron.dtype",
    # offload (McoreEngineConfig.param_offload / optimizer_offload; grad_offload exists at b178a3c only and is
    # read by no code there, megatron_workers.py:363)
    "actor_param_offload": f"{ARR}.actor.megatron.param_offload",
    "actor_optimizer_offload": f"{ARR}.actor.megatron.optimizer_offload",
    "actor_grad_offload": f"{ARR}.actor.megatron.grad_offload",
    "ref_param_offload": f"{ARR}.ref.megatron.param_offload",
    "critic_param_offload": "critic.megatron.param_offload",
    "critic_optimizer_offload": "critic.megatron.optimizer_offload",
    # batches
    "train_batch_size": "data.train_batch_size",
    "max_prompt_length": "data.max_prompt_length",
    "max_response_length": "data.max_response_length",
    "rollout_n": f"{ARR}.rollout.n",
    "actor_mini_batch": f"{ARR}.actor.ppo_mini_batch_size",
    "actor_epochs": f"{ARR}.actor.ppo_epochs",
    "actor_dynamic_bsz": f"{ARR}.actor.use_dynamic_bsz",
    "actor_max_token_len": f"{ARR}.actor.ppo_max_token_len_per_gpu",
    "actor_micro_batch": f"{ARR}.actor.ppo_micro_batch_size_per_gpu",
    "rollout_log_prob_dynamic_bsz": f"{ARR}.rollout.log_prob_use_dynamic_bsz",
    "rollout_log_prob_max_token_len": f"{ARR}.rollout.log_prob_max_token_len_per_gpu",
    "rollout_log_prob_micro_batch": f"{ARR}.rollout.log_prob_micro_batch_size_per_gpu",
    "ref_log_prob_dynamic_bsz": f"{ARR}.ref.log_prob_use_dynamic_bsz",
    "ref_log_prob_max_token_len": f"{ARR}.ref.log_prob_max_token_len_per_gpu",
    "ref_log_prob_micro_batch": f"{ARR}.ref.log_prob_micro_batch_size_per_gpu",
    "critic_enable": "critic.enable",
    "critic_mini_batch": "critic.ppo_mini_batch_size",
    "critic_epochs": "critic.ppo_epochs",
    "critic_dynamic_bsz": "critic.use_dynamic_bsz",
    "critic_max_token_len": "critic.ppo_max_token_len_per_gpu",
    "critic_forward_max_token_len": "critic.forward_max_token_len_per_gpu",
    "critic_micro_batch": "critic.ppo_micro_batch_size_per_gpu",
    "critic_forward_micro_batch": "critic.forward_micro_batch_size_per_gpu",
    "critic_model_path": "critic.model.path",
    # rollout engine
    "rollout_name": f"{ARR}.rollout.name",
    "rollout_tp": f"{ARR}.rollout.tensor_model_parallel_size",
    "rollout_memory_utilization": f"{ARR}.rollout.gpu_memory_utilization",
    "rollout_free_cache_engine": f"{ARR}.rollout.free_cache_engine",
    # algorithm: which passes run (verl/trainer/ppo/utils.py need_reference_policy / need_critic)
    "adv_estimator": "algorithm.adv_estimator",
    "use_kl_in_reward": "algorithm.use_kl_in_reward",
    "use_kl_loss": f"{ARR}.actor.use_kl_loss",
    # model and cluster
    "model_path": f"{ARR}.model.path",
    "mtp_enable": f"{ARR}.model.mtp.enable",
    "mtp_enable_train": f"{ARR}.model.mtp.enable_train",
    "n_gpus_per_node": "trainer.n_gpus_per_node",
    "nnodes": "trainer.nnodes",
    "model_engine": "model_engine",
}
# McoreEngineConfig's parallel sizes: the keys `_layout` writes under `*.megatron` (megatron-core's names, from
# `MegatronArgs.parallel_sizes`), and those `rlhf.verl_args` reads there.
MCORE_LAYOUT_KEYS = (
    "tensor_model_parallel_size",
    "pipeline_model_parallel_size",
    "virtual_pipeline_model_parallel_size",
    "context_parallel_size",
    "sequence_parallel",
    "expert_model_parallel_size",
    "expert_tensor_parallel_size",
)


def _layout(a: MegatronArgs) -> dict[str, Any]:
    """McoreEngineConfig parallel sizes (verl/workers/config/engine.py McoreEngineConfig @ b178a3c)."""
    out: dict[str, Any] = a.parallel_sizes()
    # McoreEngineConfig.__post_init__ accepts dtype bfloat16 / float16 only (verl/workers/config/engine.py).
    prec = a.precision
    if prec == "fp32":
        raise ValueError("verl's megatron engine trains in bf16 or fp16 (McoreEngineConfig dtype); the launch is fp32")
    out["dtype"] = "bfloat16" if prec == "bf16" else "float16"
    return out


def _transformer_overrides(a: MegatronArgs, training: bool) -> dict[str, Any]:
    """`megatron.override_transformer_config`: verl sets each key on the Megatron-Bridge model provider after
    its own defaults (`setattr(provider, key, value)` after moe_token_dispatcher_type="alltoall"; verl 0.9.1
    also defaults overlap_p2p_comm = vpp > 1 and batch_p2p_comm=False), or passes them to
    TransformerConfig(**kwargs) with the vanilla mbridge (_build_tf_config,
    verl/workers/engine/megatron/transformer_impl.py:119 and :154 @ b178a3c; the same in
    verl/workers/megatron_workers.py:189 and :222). So the keys are TransformerConfig field names."""
    # a hybrid model's '|' stages as megatron-core 0.16.1's MambaStack splits layers (first / last stage sizes)
    otc: dict[str, Any] = {**a.pipeline_layout_fields(), **a.hybrid_stage_fields()}
    otc["overlap_p2p_comm"] = a.overlap_p2p_comm
    otc["batch_p2p_comm"] = a.batch_p2p_comm
    if a.cp > 1:
        otc["cp_comm_type"] = a.cp_comm_type
    moe = a.moe_fields()
    for key in (
        "moe_token_dispatcher_type",
        "moe_grouped_gemm",
        "moe_permute_fusion",
        "moe_shared_expert_overlap",
        "moe_router_fusion",
        "moe_router_dtype",
        "moe_flex_dispatcher_backend",
        "overlap_moe_expert_parallel_comm",
        "delay_wgrad_compute",
    ):
        if key in moe:
            otc[key] = moe[key]
    otc["gradient_accumulation_fusion"] = bool(a["gradient_accumulation_fusion"])
    otc["cross_entropy_loss_fusion"] = bool(a["cross_entropy_loss_fusion"])
    if training:
        # verl's defaults carry recompute here (recompute_granularity / _modules / _method / _num_layers under
        # actor.megatron.override_transformer_config, verl/trainer/config/engine/megatron.yaml @ b178a3c).
        # A forward-only layout says nothing about the training recompute, so it is written in train mode only.
        otc.update(a.recompute_fields())
    # fp8 as the existing export/__init__.py verl snippet: fp8, fp8_recipe, fp8_param.
    otc.update(a.fp8_fields())
    return otc


def _token_budget(max_token_len: int, cp: int) -> int:
    # verl multiplies the per-GPU token budget by the CP size before packing micro-batches:
    # verl/workers/actor/megatron_actor.py:223 and :806 @ b178a3c
    # (`max_token_len * self.config.megatron.context_parallel_size`), and in the engine workers
    # verl/workers/engine/utils.py:76 (`max_token_len_per_gpu * sp_size`) with
    # verl/workers/engine/megatron/transformer_impl.py:460 (`sp_size=self.engine_config.context_parallel_size`).
    # So the value written is the micro-batch's token budget divided by CP.
    if max_token_len < cp:
        raise ValueError(f"max_token_len {max_token_len} is smaller than the CP size {cp}")
    return max_token_len // cp


def _put(tree: dict[str, Any], dotted: str, value: Any) -> None:
    """Set `value` at the dotted verl path in a nested dict (creating the levels)."""
    *parents, leaf = dotted.split(".")
    node = tree
    for key in parents:
        node = node.setdefault(key, {})
    node[leaf] = value


def verl_overrides(args: dict[str, Any], *, mode: str, max_token_len: int | None) -> dict[str, Any]:
    """Nested verl overrides under `actor_rollout_ref` for a Megatron-LM layout.

    mode "train" (the actor update): `actor.megatron` layout, transformer overrides (incl. recompute), DDP /
    optimizer overrides, and the actor's micro-batch (`ppo_micro_batch_size_per_gpu`, or dynamic batching with
    `ppo_max_token_len_per_gpu`). The log-prob passes get the same micro-batch (a forward pass needs less
    memory than the training step at the same micro-batch), so verl's validate_config accepts the result alone.

    mode "forward" (old / ref log-prob): the shared layout and the log-prob micro-batch keys only: the actor's
    old-log-prob pass reads `rollout.log_prob_*`, the reference `ref.log_prob_*` (verl/workers/engine_workers.py
    init_model @ b178a3c:428-433 and :472-493). The actor's training micro-batch is left to the caller.

    `max_token_len`: the token budget of one micro-batch (all its sequences, before the CP split); None means
    a fixed micro-batch of `micro_batch_size` sequences.

    Every key is spelled once, in `VERL_KEYS` (which `rlhf.verl_args` reads launches with).
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, not {mode!r}")
    a = MegatronArgs(args)
    training = mode == "train"
    dynamic = max_token_len is not None
    if not dynamic and a["micro_batch_size"] is None:
        raise ValueError("micro_batch_size is required without max_token_len")
    K = VERL_KEYS
    out: dict[str, Any] = {}
    layout = _layout(a)
    for key, value in layout.items():
        _put(out, f"{K['actor_megatron']}.{key}", value)
    _put(out, K["actor_transformer_overrides"], _transformer_overrides(a, training))
    if training:
        _put(out, K["actor_distributed_optimizer"], bool(a["use_distributed_optimizer"]))
        # override_ddp_config updates verl's DistributedDataParallelConfig dict (verl/utils/megatron_utils.py
        # @ b178a3c:139-145, defaults grad_reduce_in_fp32=True, overlap_grad_reduce=False). verl wires grad-reduce
        # overlap like Megatron-LM's training loop (no_sync_func / grad_sync_func, megatron_utils.py:1233-1247).
        # With overlap_param_gather, megatron-core's DDP defers the parameter all-gather to the next forward's
        # pre-hooks (distributed_data_parallel.py:352, 0.16.1) and Megatron-LM forces it with
        # disable_forward_pre_hook() before it reads weights; verl has no such call (none in verl @ b178a3c or
        # 0.9.1) before it sends weights to the rollout, so overlap_param_gather is not exported to verl.
        ddp: dict[str, Any] = {
            "grad_reduce_in_fp32": a.grad_reduce_in_fp32,
            "overlap_grad_reduce": bool(a["overlap_grad_reduce"]),
        }
        if a["ddp_bucket_size"] is not None:
            ddp["bucket_size"] = int(a["ddp_bucket_size"])
        fp8_optim = None
        if a["fp8"] is not None and a["fp8_param_gather"]:
            ddp["fp8_param_gather"] = True
            # As the existing export: with fp8 parameters the distributed optimizer casts master weights by
            # recipe (optim.override_optimizer_config.fp8_recipe).
            fp8_optim = {"fp8_recipe": a["fp8_recipe"]}
        _put(out, K["actor_ddp_overrides"], ddp)
        if fp8_optim is not None:
            _put(out, K["actor_optimizer_overrides"], fp8_optim)

    # verl asserts actor.use_dynamic_bsz == rollout.log_prob_use_dynamic_bsz
    # (verl/workers/engine_workers.py:472 @ b178a3c), so both are always written.
    _put(out, K["actor_dynamic_bsz"], dynamic)
    if dynamic:
        budget = _token_budget(int(max_token_len), a.cp)
        if training:
            _put(out, K["actor_max_token_len"], budget)
        log_prob = {"dynamic_bsz": dynamic, "max_token_len": budget}
    else:
        mbs = int(a["micro_batch_size"])
        # validate_config requires ref.log_prob_micro_batch_size_per_gpu (with a reference policy) and
        # rollout.log_prob_micro_batch_size_per_gpu when actor.use_dynamic_bsz is off
        # (verl/utils/config.py:154-168 @ b178a3c).
        if training:
            _put(out, K["actor_micro_batch"], mbs)
        log_prob = {"dynamic_bsz": dynamic, "micro_batch": mbs}

    # The reference model's key is log_prob_use_dynamic_bsz (verl/trainer/config/ref/ref.yaml @ b178a3c; the
    # engine worker pops it into ref.use_dynamic_bsz itself, engine_workers.py:433).
    for key, value in layout.items():
        _put(out, f"{K['ref_megatron']}.{key}", value)
    for role in ("ref", "rollout"):
        for name, value in log_prob.items():
            _put(out, K[f"{role}_log_prob_{name}"], value)
    return out


def verl_nodes(num_gpus: int, gpus_per_node: int) -> tuple[int, int]:
    """(trainer.n_gpus_per_node, trainer.nnodes) for `num_gpus` GPUs on machines of `gpus_per_node`: verl's resource
    pool is `[n_gpus_per_node] * nnodes` (verl/trainer/main_ppo.py), so the GPUs fill whole machines, or part of one
    (`specs.hardware.ClusterSpec`'s nodes, which the cost model prices the collectives over)."""
    per_node = min(num_gpus, gpus_per_node)
    if num_gpus % per_node:
        raise ConfigError(
            "num_gpus",
            f"{num_gpus} GPUs are not whole machines of {gpus_per_node}: verl runs trainer.n_gpus_per_node x "
            "trainer.nnodes GPUs",
        )
    return per_node, num_gpus // per_node


def verl_step_overrides(
    args: dict[str, Any],
    *,
    max_token_len: int | None,
    log_prob_max_token_len: int | None = None,
    log_prob_micro_batch_sizes: tuple[int, int] | None = None,
    param_offload: bool | None = None,
    optimizer_offload: bool | None = None,
    ref_param_offload: bool | None = None,
    nodes: tuple[int, int] | None = None,
) -> dict[str, Any]:
    """`verl_overrides(mode="train")` for a whole colocated verl step: the actor's layout and training micro-batch,
    the log-prob passes' own token budget (`log_prob_max_token_len`, one micro-batch before the CP split; a
    forward pass holds no activations for a backward, so it may pack more than the training micro-batch) or, with
    fixed-size micro-batches, their own micro-batch sizes (`log_prob_micro_batch_sizes`: old / ref log-prob, sequences
    per GPU), the
    offload switches `mat rlhf` chose (None: not written, verl's default stays) and `nodes`, the GPUs the step was
    planned for as (trainer.n_gpus_per_node, trainer.nnodes) (`verl_nodes`; None: the launch's own stay)."""
    out = verl_overrides(args, mode="train", max_token_len=max_token_len)
    K = VERL_KEYS
    if log_prob_max_token_len is not None:
        if max_token_len is None:
            raise ValueError("log_prob_max_token_len needs dynamic batching (max_token_len)")
        budget = _token_budget(int(log_prob_max_token_len), MegatronArgs(args).cp)
        _put(out, K["ref_log_prob_max_token_len"], budget)
        _put(out, K["rollout_log_prob_max_token_len"], budget)
    if log_prob_micro_batch_sizes is not None:
        if max_token_len is not None:
            raise ValueError("log_prob_micro_batch_sizes are for fixed-size micro-batches (no max_token_len)")
        old, ref = log_prob_micro_batch_sizes
        _put(out, K["rollout_log_prob_micro_batch"], int(old))
        _put(out, K["ref_log_prob_micro_batch"], int(ref))
    for key, value in (
        ("actor_param_offload", param_offload),
        ("actor_optimizer_offload", optimizer_offload),
        ("ref_param_offload", ref_param_offload),
    ):
        if value is not None:
            _put(out, K[key], bool(value))
    if nodes is not None:
        _put(out, K["n_gpus_per_node"], int(nodes[0]))
        _put(out, K["nnodes"], int(nodes[1]))
    return out


# A Hydra primary config on top of verl's ppo_trainer.yaml with the megatron engine, as verl's own
# verl/trainer/config/ppo_megatron_trainer.yaml @ b178a3c composes it; verl's config folder is found through
# Hydra's search path (the `verl.trainer.config` package).
VERL_HYDRA_HEAD: dict[str, Any] = {
    "hydra": {"searchpath": ["pkg://verl.trainer.config"]},
    "defaults": ["ppo_trainer", {"override model_engine": "megatron"}, "_self_"],
}


def verl_overrides_yaml(args: dict[str, Any], *, mode: str, max_token_len: int | None) -> str:
    """`verl_overrides` as a Hydra config file: `python -m verl.trainer.main_ppo --config-path DIR
    --config-name NAME` (NAME.yaml in DIR) composes verl's defaults with it. The keys after `defaults` are the
    nested overrides; keep only those to paste them into a config of your own."""
    header = (
        "# verl config (model_engine=megatron) written by megatron-autotuner:\n"
        "#   python -m verl.trainer.main_ppo --config-path <this folder> --config-name <this file, no .yaml> ...\n"
    )
    body = {**VERL_HYDRA_HEAD, **verl_overrides(args, mode=mode, max_token_len=max_token_len)}
    return header + yaml.safe_dump(body, sort_keys=False)


_PLAIN = re.compile(r"[A-Za-z_][A-Za-z0-9_./-]*")


def _hydra_value(value: Any) -> str:
    """A value in Hydra's command-line override grammar."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(_hydra_value(v) for v in value) + "]"
    text = str(value)
    if _PLAIN.fullmatch(text) and text.lower() not in ("null", "true", "false", "nan", "inf"):
        return text
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _flatten(prefix: str, node: dict[str, Any]) -> list[tuple[str, Any]]:
    items: list[tuple[str, Any]] = []
    for key, value in node.items():
        path = f"{prefix}.{key}" if prefix else key
        if isinstance(value, dict) and value:
            items += _flatten(path, value)
        else:
            items.append((path, value))
    return items


# Pass-through dicts of verl's schema: their keys are not in verl's yaml, so Hydra needs `++` (add or override).
_PASS_THROUGH = ("override_transformer_config", "override_ddp_config", "override_optimizer_config")


def override_lines(tree: dict[str, Any]) -> list[str]:
    """`key=value` Hydra arguments of a nested override dict (keys inside verl's pass-through dicts get `++`)."""
    lines = []
    for path, value in _flatten("", tree):
        prefix = "++" if any(f".{name}." in path for name in _PASS_THROUGH) else ""
        lines.append(f"{prefix}{path}={_hydra_value(value)}")
    return lines


def verl_override_lines(args: dict[str, Any], *, mode: str, max_token_len: int | None) -> list[str]:
    """`key=value` arguments for `python -m verl.trainer.main_ppo model_engine=megatron ...` (Hydra syntax; keys
    inside verl's pass-through dicts get `++`). Each item is one argv entry: quote it for a shell
    (`shlex.join`)."""
    return override_lines(verl_overrides(args, mode=mode, max_token_len=max_token_len))


__all__ = [
    "MCORE_LAYOUT_KEYS",
    "VERL_KEYS",
    "override_lines",
    "verl_override_lines",
    "verl_overrides",
    "verl_overrides_yaml",
    "verl_nodes",
    "verl_step_overrides",
]
