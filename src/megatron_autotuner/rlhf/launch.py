"""A verl launch (`verl_args.VerlLaunch`) as the step model's inputs: `StepSpec` (what the launch fixes), the
launch's own `StepChoice` (its layout, batching and offload) and `CostOptions` (what verl runs with)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

from ..costmodel.estimate import DEFAULT_MEMORY_MARGIN, CostOptions
from ..errors import ConfigError, SpecNotFoundError
from ..export.verl import VERL_KEYS
from ..specs.lengths import SequenceLengths
from ..specs.loader import load_model_spec
from ..specs.model import ModelSpec
from ..specs.parallel import MOE_DISPATCHERS, ParallelConfig, RecomputeConfig, moe_dispatcher_name
from ..specs.pipeline import PipelineLayout, even_layout
from ..specs.tokenizers import preset_named_by
from .phases import Batching
from .step import StepChoice, StepSpec
from .verl_args import DDP_READ, TRANSFORMER_READ, VerlLaunch

# The verl keys that size each phase's batch, by phase (`step.evaluate_step`'s names): (dynamic batching on?, the
# per-GPU token budget, the micro-batch size). `launch_inputs` reads a pass's batching through them, and a phase
# that does not fit names the one in force (`phase_keys`).
PHASE_BATCH_KEYS: dict[str, tuple[str, str, str]] = {
    "actor update": ("actor_dynamic_bsz", "actor_max_token_len", "actor_micro_batch"),
    "old log-prob": ("rollout_log_prob_dynamic_bsz", "rollout_log_prob_max_token_len", "rollout_log_prob_micro_batch"),
    "ref log-prob": ("ref_log_prob_dynamic_bsz", "ref_log_prob_max_token_len", "ref_log_prob_micro_batch"),
    "critic update": ("critic_dynamic_bsz", "critic_max_token_len", "critic_micro_batch"),
    "critic values": ("critic_dynamic_bsz", "critic_forward_max_token_len", "critic_forward_micro_batch"),
}
# the rollout's memory: the share of the GPU the rollout engine takes (the weight sync has no key of its own: the
# layout and the offload, which the search varies, set it)
PHASE_MEMORY_KEYS = {"rollout": "rollout_memory_utilization"}


@dataclass(frozen=True)
class LaunchInputs:
    spec: StepSpec
    choice: StepChoice
    options: CostOptions
    notes: tuple[str, ...]
    # phase -> the verl key that sets its memory as the launch has it (`phase_keys`)
    phase_keys: dict[str, str] = field(default_factory=dict)


def phase_keys(launch: VerlLaunch) -> dict[str, str]:
    """For each phase with one, the verl key that sets its memory, as `key=value, given` or, where the launch left
    it, `verl's default` or the key it follows (`critic.forward_max_token_len_per_gpu` follows
    `critic.ppo_max_token_len_per_gpu`): what a user changes when the phase does not fit."""
    names = dict(PHASE_MEMORY_KEYS)
    for phase, (dynamic, budget, micro) in PHASE_BATCH_KEYS.items():
        names[phase] = budget if launch.flag(dynamic) else micro
    return {phase: launch.said(name) for phase, name in names.items()}


def model_from_launch(launch: VerlLaunch, model_arg: str | None) -> tuple[ModelSpec, str | None]:
    """`--model` when given, else `actor_rollout_ref.model.path` (a preset, config path or HF id in the local
    cache; a path whose last part names a preset, e.g. ~/models/Qwen3-8B, uses that preset, with a note); its
    MTP layers as verl builds them (`verl_mtp`)."""
    model, note = _named_model(launch, model_arg)
    model, mtp_note = verl_mtp(launch, model)
    return model, "; ".join(n for n in (note, mtp_note) if n) or None


def verl_mtp(launch: VerlLaunch, model: ModelSpec) -> tuple[ModelSpec, str | None]:
    """verl builds a model's MTP layers only with `model.mtp.enable=true`: otherwise HFModelConfig zeroes
    num_nextn_predict_layers and check_mtp_config sets the provider's mtp_num_layers to None (verl 0.9.1
    verl/workers/config/model.py HFModelConfig.__post_init__, verl/utils/megatron_utils.py check_mtp_config).
    Enabled without `enable_train`, the layers are loaded but the training forward skips them
    (verl/models/mcore/model_forward.py): the prediction still counts their time, an upper bound, with a note."""
    if not model.mtp_num_layers:
        if launch.flag("mtp_enable"):
            raise ConfigError(VERL_KEYS["mtp_enable"], f"is true but {model.name} has no MTP layers (verl refuses it)")
        return model, None
    if not launch.flag("mtp_enable"):
        key = VERL_KEYS["mtp_enable"]
        note = f"{model.name}'s {model.mtp_num_layers} MTP layer(s) left out: verl builds them only with {key}=true"
        return model.replace(mtp_num_layers=0), note
    if not launch.flag("mtp_enable_train"):
        return model, (
            f"{VERL_KEYS['mtp_enable_train']} is false: the MTP layers are held but not trained; their time is "
            "counted (an upper bound)"
        )
    return model, None


def _named_model(launch: VerlLaunch, model_arg: str | None) -> tuple[ModelSpec, str | None]:
    if model_arg:
        return load_model_spec(model_arg), None
    path = launch.get("model_path")
    key = VERL_KEYS["model_path"]
    if not path:
        return _model_of_dist_checkpoint(launch)
    try:
        return load_model_spec(str(path)), None
    except SpecNotFoundError:
        preset = preset_named_by(str(path))
        if preset is None:
            raise ConfigError(key, f"{path!r} is not a preset, a config path or a cached HF id: give --model") from None
        return load_model_spec(
            preset
        ), f"{key}={path} read as the preset {preset}, which it names (no config.json there)"


def _model_of_dist_checkpoint(launch: VerlLaunch) -> tuple[ModelSpec, str]:
    """With `model.path` empty, the actor's Megatron checkpoint (`megatron.dist_checkpointing_path`, which verl
    loads with `use_dist_checkpointing`) when its folder names a preset: verl's Moonlight PPO example converts
    `/data/models/moonshotai/Moonlight-16B-A3B-Instruct` into `/data/mcore_ckpt/Moonlight-16B-A3B-Instruct` and passes
    only the latter (examples/ppo_trainer/run_moonlight16b_a3b_gsm8k_megatron.sh). Said in a note."""
    key = VERL_KEYS["model_path"]
    ckpt_key = f"{VERL_KEYS['actor_megatron']}.dist_checkpointing_path"
    ckpt = launch.values.get(ckpt_key)
    preset = preset_named_by(str(ckpt)) if ckpt else None
    if preset is None:
        raise ConfigError("model", f"give --model, or {key} in the launch")
    note = f"{key} is empty: the model is the preset {preset}, which the actor's checkpoint {ckpt_key}={ckpt} names"
    return load_model_spec(preset), note


def launch_lengths(
    launch: VerlLaunch, mean_prompt_len: float | None = None, mean_response_len: float | None = None
) -> tuple[SequenceLengths, str | None]:
    """Prompt and response lengths of a launch: data.max_prompt_length / data.max_response_length are the maxima
    (verl truncates or filters longer ones), the means are given (`mat rlhf --mean-prompt-len / --mean-response-len`)
    or, when not, assumed equal to the maxima -- every sequence at its longest, an upper bound on time and memory,
    the only mean the launch itself implies. Returns the lengths and a note naming the means assumed (None when
    both were given)."""
    maxima = {"prompt": launch.integer("max_prompt_length"), "response": launch.integer("max_response_length")}
    given = {"prompt": mean_prompt_len, "response": mean_response_len}
    assumed = [name for name, mean in given.items() if mean is None]
    means = {name: float(maxima[name]) if given[name] is None else float(given[name]) for name in maxima}
    try:
        lengths = SequenceLengths.from_mean_max(
            (means["prompt"], maxima["prompt"]), (means["response"], maxima["response"])
        )
    except ConfigError as exc:
        name = "prompt" if exc.field.startswith("prompt") else "response"
        raise ConfigError(f"mean_{name}_len", f"{exc.rule} ({VERL_KEYS[f'max_{name}_length']})") from None
    if not assumed:
        return lengths, None
    said = ", ".join(f"{name} {maxima[name]} ({VERL_KEYS[f'max_{name}_length']})" for name in assumed)
    flags = " / ".join(f"--mean-{name}-len" for name in assumed)
    return lengths, (
        f"mean {' and '.join(assumed)} length assumed = the maximum: {said} tokens, every sequence at its longest "
        f"(an upper bound on time); give {flags} for the real mean"
    )


def _with_images(
    model: ModelSpec, lengths: SequenceLengths, image_tokens: int | None
) -> tuple[SequenceLengths, str | None]:
    """The lengths with a vision-language model's image tokens per prompt: `image_tokens` (`mat rlhf --image-tokens`)
    or, when not given, the whole mean prompt -- an upper bound on the vision tower's work, as verl drops or refuses
    prompts longer than data.max_prompt_length, image tokens included (data.filter_overlong_prompts / truncation).
    Returns the lengths and a note naming an assumed count."""
    if model.vision is None:
        if image_tokens:
            raise ConfigError("image_tokens", f"{model.name} has no vision encoder")
        return lengths, None
    prompt = lengths.prompt if lengths.prompt is not None else lengths.sequence
    given = image_tokens is not None
    count = image_tokens if given else int(prompt.mean_tokens)
    lengths = replace(lengths, image_tokens=count)  # SequenceLengths refuses more than its longest prompt
    if given:
        return lengths, None
    patches = count * model.vision.patches_per_token
    return lengths, (
        f"image tokens per prompt assumed = the mean prompt, {count} ({patches} patches for the vision tower): an "
        "upper bound on its work; give --image-tokens for the real count"
    )


def _batching(launch: VerlLaunch, phase: str) -> Batching:
    dynamic_name, budget_name, micro_name = PHASE_BATCH_KEYS[phase]
    if launch.flag(dynamic_name):
        return Batching(max_token_len_per_gpu=launch.integer(budget_name), key=VERL_KEYS[budget_name])
    mbs = launch.integer(micro_name)
    if mbs is None:
        raise ConfigError(VERL_KEYS[micro_name], f"is required when {VERL_KEYS[dynamic_name]} is false")
    return Batching(micro_batch_size=mbs, key=VERL_KEYS[micro_name])


def _recompute(otc: dict[str, Any]) -> RecomputeConfig:
    gran = otc.get("recompute_granularity") or "none"
    if gran == "full":
        return RecomputeConfig(
            "full", otc.get("recompute_method") or "uniform", int(otc.get("recompute_num_layers") or 1)
        )
    if gran == "selective":
        return RecomputeConfig("selective", modules=tuple(otc.get("recompute_modules") or ("core_attn",)))
    return RecomputeConfig(gran)


def _pipeline(launch: VerlLaunch, role: str, model: ModelSpec, pp: int, vpp: int | None) -> PipelineLayout | None:
    """The uneven pipeline a role's override_transformer_config gives (megatron-core TransformerConfig fields):
    `pipeline_model_parallel_layout`, `num_layers_in_first/last_pipeline_stage`, or
    `account_for_embedding/loss_in_pipeline_split`; None for Megatron's even split."""
    name = f"{role}_transformer_overrides"
    otc = launch.pass_through(name) if name in VERL_KEYS else {}
    if otc.get("pipeline_model_parallel_layout"):
        return PipelineLayout.from_string(str(otc["pipeline_model_parallel_layout"]), pp)
    first, last = otc.get("num_layers_in_first_pipeline_stage"), otc.get("num_layers_in_last_pipeline_stage")
    if first is not None or last is not None:
        return PipelineLayout.first_last(
            model.num_layers, pp, vpp, None if first is None else int(first), None if last is None else int(last),
            model.mtp_num_layers,
        )  # fmt: skip
    emb, loss = (bool(otc.get(f"account_for_{k}_in_pipeline_split")) for k in ("embedding", "loss"))
    if emb or loss:
        return PipelineLayout.accounting(model.num_layers, pp, vpp, emb, loss, model.mtp_num_layers)
    return None


def _moe_options(launch: VerlLaunch, role: str, model: ModelSpec) -> dict[str, Any]:
    """The EP all-to-all overlap and the token dispatcher a role's override_transformer_config sets
    (TransformerConfig fields; verl's own default dispatcher is alltoall: transformer_impl.py @ b178a3c sets it
    before the overrides), read as the Megatron-LM flags are (`specs.parallel.moe_dispatcher_name`): allgather, or flex
    over DeepEP unless moe_flex_dispatcher_backend says hybridep (moe_enable_deepep sets deepep, refused without flex
    as megatron-core refuses it); another dispatcher is predicted as alltoall."""
    name = f"{role}_transformer_overrides"
    otc = launch.pass_through(name) if name in VERL_KEYS else {}
    dispatcher = "alltoall"
    if model.is_moe:
        kind = str(otc.get("moe_token_dispatcher_type") or "alltoall")
        backend = otc.get("moe_flex_dispatcher_backend")
        named = moe_dispatcher_name(kind, None if backend is None else str(backend), bool(otc.get("moe_enable_deepep")))
        dispatcher = named if named in MOE_DISPATCHERS else "alltoall"
    return {
        "moe_a2a_overlap": bool(otc.get("overlap_moe_expert_parallel_comm")),
        "delay_wgrad_compute": bool(otc.get("delay_wgrad_compute")),
        "moe_dispatcher": dispatcher,
    }


def _parallel(
    launch: VerlLaunch, role: str, num_gpus: int, dist_opt: bool, fp32_grads: bool, model: ModelSpec
) -> ParallelConfig:
    lay = dict(launch.layout(role))
    if not model.is_moe and lay["expert_tensor_parallel_size"] is not None:
        lay["expert_tensor_parallel_size"] = None  # Megatron ignores it for a dense model
    sp = bool(lay["sequence_parallel"]) and int(lay["tensor_model_parallel_size"]) > 1
    pp, vpp = int(lay["pipeline_model_parallel_size"]), lay["virtual_pipeline_model_parallel_size"]
    try:
        layout = _pipeline(launch, role, model, pp, vpp) if pp > 1 else None
        if layout is None and role == "ref" and pp > 1:
            layout = _pipeline(launch, "actor", model, pp, vpp)
        if layout is None and pp > 1:
            # a role's own override_transformer_config decides its split (verl's critic does not follow the
            # actor's): an even split must divide, as Megatron-LM checks (megatron-core alone would floor it and
            # build fewer layers than the model has, transformer_block.get_num_layers_to_build)
            even_layout(model.num_layers, pp, vpp, model.mtp_num_layers)
        return ParallelConfig(
            num_gpus,
            int(lay["tensor_model_parallel_size"]),
            int(lay["pipeline_model_parallel_size"]),
            int(lay["context_parallel_size"]),
            int(lay["expert_model_parallel_size"]),
            lay["expert_tensor_parallel_size"],
            lay["virtual_pipeline_model_parallel_size"],
            sp,
            dist_opt,
            fp32_grads,
            False,  # verl does not turn TE userbuffers TP overlap on
            pipeline_layout=layout,
            **_moe_options(launch, role, model),
        )
    except ConfigError as exc:
        raise ConfigError(f"{VERL_KEYS[role + '_megatron']} ({exc.field})", exc.rule) from None


def launch_inputs(
    launch: VerlLaunch,
    model: ModelSpec,
    num_gpus: int | None,
    rollout_s: float | None,
    lengths: SequenceLengths | None = None,
    calibration: Any = None,
    memory_margin: float = DEFAULT_MEMORY_MARGIN,
    *,
    mean_prompt_len: float | None = None,
    mean_response_len: float | None = None,
    image_tokens: int | None = None,
) -> LaunchInputs:
    """The step model's inputs from a launch. `lengths`: token lengths (`specs.lengths.SequenceLengths`; default
    `launch_lengths` of the launch's maxima and `mean_prompt_len` / `mean_response_len`); `num_gpus`: the GPUs
    (default trainer.n_gpus_per_node x trainer.nnodes; a different value given on the command line is an error)."""
    launch.check_engine()
    notes: list[str] = []
    launch_gpus = launch.num_gpus
    if num_gpus is None:
        num_gpus = launch_gpus
        lay = launch.layout("actor")
        model_ranks = math.prod(int(lay[k]) for k in ("tensor_model_parallel_size", "pipeline_model_parallel_size",
                                                      "context_parallel_size"))  # fmt: skip
        if num_gpus % model_ranks:
            fitted = math.lcm(num_gpus, model_ranks)
            notes.append(
                f"num_gpus: the launch's {num_gpus} GPUs (trainer.n_gpus_per_node x trainer.nnodes) cannot hold its "
                f"tp x pp x cp = {model_ranks}: read with {fitted} (its node count is set outside the script?)"
            )
            num_gpus = fitted
    elif (launch.given("n_gpus_per_node") or launch.given("nnodes")) and num_gpus != launch_gpus:
        notes.append(f"num_gpus: {num_gpus} (--num-gpus) in place of the launch's {launch_gpus}")
    if lengths is None:
        lengths, note = launch_lengths(launch, mean_prompt_len, mean_response_len)
        if note:
            notes.append(note)
    lengths, note = _with_images(model, lengths, image_tokens)
    if note:
        notes.append(note)
    ddp = launch.pass_through("actor_ddp_overrides")
    otc = launch.pass_through("actor_transformer_overrides")
    unknown_ddp = sorted(k for k in ddp if k not in DDP_READ and k != "bucket_size")
    if unknown_ddp:
        notes.append(f"override_ddp_config keys not modelled: {', '.join(unknown_ddp)}")
    fp32_grads = bool(ddp.get("grad_reduce_in_fp32", True))  # verl's default (verl/utils/megatron_utils.py)
    dist_opt = launch.flag("actor_distributed_optimizer")
    parallel = _parallel(launch, "actor", num_gpus, dist_opt, fp32_grads, model)
    actor_b = _batching(launch, "actor update")
    old_b = _batching(launch, "old log-prob")
    # the reference pass runs only with a KL term (verl need_reference_policy); its batch keys matter only then
    ref_b = _batching(launch, "ref log-prob") if launch.use_reference else old_b
    if launch.flag("actor_grad_offload"):
        notes.append(
            "grad_offload is read by no verl code (b178a3c megatron_workers.py:363; gone in 0.9.1): grads follow "
            "param_offload"
        )
    use_critic = launch.use_critic
    critic_kw: dict[str, Any] = {}
    if use_critic:
        critic_kw = dict(
            critic_parallel=_parallel(launch, "critic", num_gpus, True, True, model),
            critic_batching=_batching(launch, "critic update"),
            critic_forward_batching=_batching(launch, "critic values"),
            critic_mini_batch_size=launch.integer("critic_mini_batch"),
            critic_epochs=launch.integer("critic_epochs"),
            critic_param_offload=launch.flag("critic_param_offload"),
            critic_optimizer_offload=launch.flag("critic_optimizer_offload"),
        )
        if str(launch.get("critic_model_path")) != str(launch.get("model_path")):
            notes.append("the critic is costed with the actor's model shape")
    spec = StepSpec(
        model=model,
        num_gpus=num_gpus,
        lengths=lengths,
        train_batch_size=launch.integer("train_batch_size"),
        rollout_n=launch.integer("rollout_n"),
        mini_batch_size=launch.integer("actor_mini_batch"),
        ppo_epochs=launch.integer("actor_epochs"),
        use_reference=launch.use_reference,
        rollout_tp=launch.integer("rollout_tp"),
        rollout_memory_utilization=launch.number("rollout_memory_utilization"),
        free_cache_engine=launch.flag("rollout_free_cache_engine"),
        rollout_s=rollout_s,
        use_critic=use_critic,
        actor_numerics=launch.actor_numerics(),
        **critic_kw,
    )
    choice = StepChoice(
        parallel=parallel,
        recompute=_recompute(otc),
        actor_batching=actor_b,
        old_log_prob_batching=old_b,
        ref_log_prob_batching=ref_b,
        param_offload=launch.flag("actor_param_offload"),
        optimizer_offload=launch.flag("actor_optimizer_offload"),
        ref_param_offload=bool(launch.get("ref_param_offload")),
    )
    # verl's DDP defaults: overlap_grad_reduce False unless overridden; overlap_param_gather is never exported to
    # verl (see export.verl); TE userbuffers off. The loss is verl's own vocab-parallel log-prob kernel, priced as
    # the fused loss, and MoE blocks are not held to the eager host floor: both as mat rlhf has predicted them (the
    # validate runner's eager MoE and unfused loss are Megatron-LM pre-training's defaults, not verl's). The allocator
    # keeps the default, expandable segments, as verl's engine workers switch them back on once the weights are synced
    # to the rollout (`set_expandable_segments(True)`, verl/workers/engine_workers.py @ verl-project/verl 1dda039).
    options = CostOptions(
        overlap_grad_reduce=bool(ddp.get("overlap_grad_reduce", False)),
        overlap_param_gather=False,
        fused_cross_entropy=True,
        moe_host_bound=False,
        # TE's fused token permute only where the actor's overrides ask for it (megatron-core's default is off)
        moe_permute_fusion=bool(otc.get("moe_permute_fusion")),
        calibration=calibration,
        memory_margin=memory_margin,
    )
    return LaunchInputs(spec, choice, options, tuple(notes), phase_keys(launch))


__all__ = [
    "PHASE_BATCH_KEYS",
    "LaunchInputs",
    "TRANSFORMER_READ",
    "launch_inputs",
    "launch_lengths",
    "model_from_launch",
    "phase_keys",
]
