"""A whole colocated verl step: the phases of `phases` with offload around them (`offload`), their sum, and the
search for the layout that makes the whole step fastest.

verl's rule: colocated actor and reference model run with one parallel layout (the ref's sizes interpolate the
actor's, `export.verl`), so a layout is chosen once for actor update, old log-prob and ref log-prob. The search
ranks actor-update layouts with `search.plan` (memory-pruned, fastest first; with dynamic batching over the step's
`specs.lengths.SequenceLengths`, each layout with the token budget `search.plan` chose for it), evaluates the whole
step for the best `top_k` and each offload choice, and keeps the fastest step whose every phase fits. The log-prob
passes have their own budget in verl (log_prob_max_token_len_per_gpu): with dynamic batching it is chosen per
layout from the same candidates (`search.space.token_budget_choices`), the fastest whose phases fit.
The critic (PPO) keeps the launch's own layout: it is a separate engine and is not searched.

Time of the step = sum of the phases' times (they run one after another on the same GPUs); the rollout's
generation time is an input (`rollout_s`) -- when it is not given the total leaves it out and says so.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from .. import SCHEMA_VERSION, __version__
from ..costmodel.estimate import CostOptions
from ..errors import ConfigError
from ..search.plan import plan
from ..search.progress import QUIET, Progress
from ..search.space import token_budget_choices
from ..specs.hardware import MIB, GPUSpec
from ..specs.lengths import MAX_SAMPLED_SEQUENCES, SequenceLengths
from ..specs.model import ModelSpec
from ..specs.parallel import ParallelConfig, RecomputeConfig
from ..theory.memory import GIB, default_non_torch_gib
from .offload import (
    ModelStateBytes,
    during_rollout,
    load_state,
    model_state_bytes,
    offload_state,
    ref_transitions,
    ref_weights_bytes,
)
from .phases import Batching, Phase, pass_cost, pass_workload, transition_phase, weight_sync


@dataclass(frozen=True)
class StepSpec:
    """What a verl launch fixes, independent of the actor's layout."""

    model: ModelSpec
    num_gpus: int
    lengths: SequenceLengths
    train_batch_size: int  # prompts per step
    rollout_n: int  # responses per prompt
    mini_batch_size: int  # prompts per actor optimizer step
    ppo_epochs: int
    use_reference: bool
    rollout_tp: int
    rollout_memory_utilization: float
    free_cache_engine: bool = True
    update_weights_bucket_bytes: float = 2048 * MIB  # rollout.checkpoint_engine.update_weights_bucket_megabytes
    rollout_s: float | None = None
    use_critic: bool = False
    critic_parallel: ParallelConfig | None = None
    critic_batching: Batching | None = None
    critic_forward_batching: Batching | None = None
    critic_mini_batch_size: int = 0
    critic_epochs: int = 1
    critic_param_offload: bool = False
    critic_optimizer_offload: bool = False
    critic_recompute: RecomputeConfig = field(default_factory=RecomputeConfig)
    # (precision, fp8 recipe) of the actor's and the reference's Megatron passes (override_transformer_config fp8 /
    # fp8_recipe; the ref's interpolates the actor's); their weights stay bf16 (no fp8 parameters)
    actor_numerics: tuple[str, str] = ("bf16", "delayed")

    def __post_init__(self) -> None:
        if self.sequences > MAX_SAMPLED_SEQUENCES:
            raise ConfigError(
                "data.train_batch_size x actor_rollout_ref.rollout.n",
                f"{self.train_batch_size} x {self.rollout_n} = {self.sequences} sequences per step; at most "
                f"{MAX_SAMPLED_SEQUENCES} are modelled",
            )
        if self.train_batch_size % self.mini_batch_size:
            raise ConfigError(
                "actor_rollout_ref.actor.ppo_mini_batch_size",
                f"{self.mini_batch_size} does not divide data.train_batch_size {self.train_batch_size}",
            )
        if self.num_gpus % self.rollout_tp:
            # verl's rollout workers: world size = rollout TP x rollout DP (verl/workers/rollout, its config checks)
            raise ConfigError(
                "actor_rollout_ref.rollout.tensor_model_parallel_size",
                f"{self.rollout_tp} does not divide the {self.num_gpus} GPUs (verl splits them into rollout TP groups)",
            )
        if self.rollout_s is not None and self.rollout_s < 0:
            raise ConfigError("rollout_s", f"must be >= 0, got {self.rollout_s}")
        if not 0 < self.rollout_memory_utilization < 1:
            raise ConfigError(
                "actor_rollout_ref.rollout.gpu_memory_utilization",
                f"must be in (0, 1), got {self.rollout_memory_utilization}",
            )
        if self.use_critic and (self.critic_parallel is None or self.critic_batching is None):
            raise ConfigError("critic", "a PPO step with a critic needs its layout and batching")

    @property
    def sequences(self) -> int:
        """train_batch_size x rollout.n sequences per step."""
        return self.train_batch_size * self.rollout_n

    @property
    def mini_batch_sequences(self) -> int:
        return self.mini_batch_size * self.rollout_n

    @property
    def optimizer_steps(self) -> int:
        """ppo_epochs x train_batch_size / ppo_mini_batch_size actor optimizer steps per verl step."""
        return self.ppo_epochs * (self.train_batch_size // self.mini_batch_size)

    @property
    def tokens_per_step(self) -> float:
        """Global tokens: prompts x n x the mean sequence length (prompt + response)."""
        return self.sequences * self.lengths.mean_tokens


@dataclass(frozen=True)
class StepChoice:
    """What the search varies: the shared actor / ref layout, the actor's recompute and batching, the log-prob
    passes' batching, and which state is offloaded around the rollout."""

    parallel: ParallelConfig
    recompute: RecomputeConfig
    actor_batching: Batching
    old_log_prob_batching: Batching
    ref_log_prob_batching: Batching
    param_offload: bool
    optimizer_offload: bool
    ref_param_offload: bool

    def label(self) -> str:
        p = self.parallel
        parts = [f"tp{p.tp}", f"pp{p.pp}"] + ([f"vpp{p.vpp}"] if p.vpp else []) + [f"cp{p.cp}", f"dp{p.dp}"]
        if p.ep > 1:
            parts.append(f"ep{p.ep}")
        b = self.actor_batching
        parts.append(f"tok{b.max_token_len_per_gpu}/gpu" if b.dynamic else f"mbs{b.micro_batch_size}")
        parts.append(f"rc-{self.recompute.granularity}")
        if not p.use_distributed_optimizer:
            parts.append("no-distopt")
        offl = [n for n, on in (("param", self.param_offload), ("optim", self.optimizer_offload)) if on]
        parts.append("offload:" + ("+".join(offl) if offl else "none"))
        return " ".join(parts)


@dataclass(frozen=True)
class StepResult:
    """The phases of one step for one choice; total_s = the sum of the phases' times (rollout when given)."""

    spec: StepSpec
    choice: StepChoice
    phases: tuple[Phase, ...]
    actor_state: ModelStateBytes
    notes: tuple[str, ...] = ()

    @property
    def total_s(self) -> float:
        return sum(p.time_s for p in self.phases if p.time_s is not None)

    @property
    def includes_rollout(self) -> bool:
        return self.spec.rollout_s is not None

    @property
    def fits(self) -> bool:
        return all(p.fits for p in self.phases)

    @property
    def peak_memory_gib(self) -> float:
        return max(p.peak_memory_gib for p in self.phases)

    def to_dict(self) -> dict[str, Any]:
        p = self.choice.parallel
        return {
            "label": self.choice.label(),
            "parallel": p.to_dict(),
            "recompute": self.choice.recompute.granularity,
            "param_offload": self.choice.param_offload,
            "optimizer_offload": self.choice.optimizer_offload,
            "ref_param_offload": self.choice.ref_param_offload,
            "total_s": self.total_s,
            "includes_rollout": self.includes_rollout,
            "tokens_per_s_per_gpu": self.spec.tokens_per_step / self.total_s / self.spec.num_gpus,
            "fits": self.fits,
            "peak_memory_gib": self.peak_memory_gib,
            "actor_state_per_rank": self.actor_state.to_dict(),
            "phases": [ph.to_dict() for ph in self.phases],
            "notes": list(self.notes),
        }


def evaluate_step(
    spec: StepSpec, choice: StepChoice, gpu: GPUSpec, options: CostOptions, calibration: Any = None
) -> StepResult:
    """Every phase of the step for `choice`: time (s) and peak memory (GiB per GPU) with what the other engines
    keep resident. See `phases` for the formulas and `offload` for what moves."""
    p, model = choice.parallel, spec.model
    usable = gpu.hbm_gib * (1.0 - options.memory_margin)
    cal = calibration if calibration is not None else options.calibration

    # the actor update: one estimate per optimizer step (a mini-batch), x ppo_epochs x mini-batches
    train_t, train_m = pass_cost(
        model,
        p,
        choice.actor_batching,
        spec.lengths,
        spec.mini_batch_sequences,
        "train",
        choice.recompute,
        gpu,
        options,
        spec.actor_numerics,
    )
    mem_w = pass_workload(
        choice.actor_batching, p, spec.lengths, spec.mini_batch_sequences, "train", choice.recompute, True
    )
    actor = model_state_bytes(model, p, mem_w)
    P, O = choice.param_offload, choice.optimizer_offload
    actor_rollout = during_rollout(actor, param_offload=P, optimizer_offload=O)
    opt_resident = actor.optimizer_bytes - (actor.optimizer_moved_bytes if O else 0.0)
    grads_resident = 0.0 if P else actor.grads_bytes

    ref_w = ref_weights_bytes(model, p) if spec.use_reference else 0.0
    R = choice.ref_param_offload and spec.use_reference
    ref_resident = 0.0 if R else ref_w

    critic_state = None
    critic_rollout_resident = 0.0
    if spec.use_critic:
        cw = pass_workload(
            spec.critic_batching, spec.critic_parallel, spec.lengths, spec.critic_mini_batch_size * spec.rollout_n,
            "train", spec.critic_recompute, True,
        )  # fmt: skip
        critic_state = model_state_bytes(model, spec.critic_parallel, cw)
        critic_rollout_resident = during_rollout(
            critic_state, param_offload=spec.critic_param_offload, optimizer_offload=spec.critic_optimizer_offload
        ).resident_bytes
    vllm_awake = spec.rollout_memory_utilization * gpu.hbm_bytes
    vllm_sleeping = 0.0 if spec.free_cache_engine else vllm_awake
    non_torch = default_non_torch_gib(p, True) * GIB

    phases: list[Phase] = []
    # 1. weight sync (before the rollout)
    ws = weight_sync(model, p, spec.rollout_tp, gpu)
    load_p = load_state("load actor params", actor, gpu, cal, params=P, grads=False, optimizer=False)
    off_p = offload_state("offload actor params", actor, gpu, cal, params=P, optimizer=False)
    sync_peak = (
        actor.params_bytes + grads_resident + opt_resident + ref_resident + critic_rollout_resident
        + ws.rollout_weights_bytes + spec.update_weights_bucket_bytes + non_torch
    )  # fmt: skip
    phases.append(
        Phase(
            "weight sync",
            load_p.time_s + ws.time_s + off_p.time_s,
            sync_peak / GIB,
            usable,
            {"sync": ws.to_dict(), "transfers": [t.to_dict() for t in (load_p, off_p) if t.copies]},
        )
    )
    # 2. rollout
    rollout_peak = actor_rollout.resident_bytes + ref_resident + critic_rollout_resident + vllm_awake + non_torch
    phases.append(
        Phase(
            "rollout",
            spec.rollout_s,
            rollout_peak / GIB,
            gpu.hbm_gib,  # vLLM's gpu_memory_utilization is a share of the whole GPU
            {
                "rollout_engine_gib": vllm_awake / GIB,
                "actor_resident_gib": actor_rollout.resident_bytes / GIB,
                "actor_freed_by_offload_gib": actor_rollout.freed_bytes / GIB,
                "ref_resident_gib": ref_resident / GIB,
                "time": "given (--rollout-s)" if spec.rollout_s is not None else "not modelled: give --rollout-s",
            },
        )
    )
    # 3. old log-prob (actor forward over every sequence)
    old_t, old_m = pass_cost(
        model, p, choice.old_log_prob_batching, spec.lengths, spec.sequences, "forward", RecomputeConfig(), gpu,
        options, spec.actor_numerics,
    )  # fmt: skip
    load_e = load_state("load actor params", actor, gpu, cal, params=P, grads=False, optimizer=False)
    others = grads_resident + opt_resident + ref_resident + critic_rollout_resident + vllm_sleeping
    phases.append(
        Phase(
            "old log-prob",
            load_e.time_s + old_t.step_time_s + off_p.time_s,
            old_m.peak_memory_gib + others / GIB,
            usable,
            {"compute_s": old_t.step_time_s, "transfers": [t.to_dict() for t in (load_e, off_p) if t.copies]},
        )
    )
    # 4. ref log-prob
    if spec.use_reference:
        ref_t, ref_m = pass_cost(
            model, p, choice.ref_log_prob_batching, spec.lengths, spec.sequences, "forward", RecomputeConfig(), gpu,
            options, spec.actor_numerics,
        )  # fmt: skip
        load_r, off_r = ref_transitions(ref_w, gpu, cal)
        moves = (load_r, off_r) if R else ()
        others = actor_rollout.resident_bytes + critic_rollout_resident + vllm_sleeping
        phases.append(
            Phase(
                "ref log-prob",
                sum(t.time_s for t in moves) + ref_t.step_time_s,
                ref_m.peak_memory_gib + others / GIB,
                usable,
                {"compute_s": ref_t.step_time_s, "transfers": [t.to_dict() for t in moves]},
            )
        )
    # 5-6. critic values and critic update (PPO)
    if spec.use_critic and critic_state is not None:
        cp_, CP, CO = spec.critic_parallel, spec.critic_param_offload, spec.critic_optimizer_offload
        fwd_b = spec.critic_forward_batching or spec.critic_batching
        val_t, val_m = pass_cost(
            model, cp_, fwd_b, spec.lengths, spec.sequences, "forward", RecomputeConfig(), gpu, options
        )
        c_load_e = load_state("load critic params", critic_state, gpu, cal, params=CP, grads=False, optimizer=False)
        c_off_e = offload_state("offload critic params", critic_state, gpu, cal, params=CP, optimizer=False)
        c_grads = 0.0 if CP else critic_state.grads_bytes
        c_opt = critic_state.optimizer_bytes - (critic_state.optimizer_moved_bytes if CO else 0.0)
        others = actor_rollout.resident_bytes + ref_resident + vllm_sleeping + c_grads + c_opt
        phases.append(
            Phase(
                "critic values",
                c_load_e.time_s + val_t.step_time_s + c_off_e.time_s,
                val_m.peak_memory_gib + others / GIB,
                usable,
                {"compute_s": val_t.step_time_s, "note": "critic costed as the actor model (value head ~ LM head)"},
            )
        )
        c_steps = spec.critic_epochs * (spec.train_batch_size // spec.critic_mini_batch_size)
        ct_t, ct_m = pass_cost(
            model, cp_, spec.critic_batching, spec.lengths, spec.critic_mini_batch_size * spec.rollout_n, "train",
            spec.critic_recompute, gpu, options,
        )  # fmt: skip
        c_load = load_state("load critic", critic_state, gpu, cal, params=CP, grads=True, optimizer=CO)
        c_off = offload_state("offload critic", critic_state, gpu, cal, params=CP, optimizer=CO)
        others = actor_rollout.resident_bytes + ref_resident + vllm_sleeping
        phases.append(
            Phase(
                "critic update",
                c_load.time_s + c_steps * ct_t.step_time_s + c_off.time_s,
                ct_m.peak_memory_gib + others / GIB,
                usable,
                {"compute_s": c_steps * ct_t.step_time_s, "optimizer_steps": c_steps},
            )
        )
    # 7. actor update
    load_t = load_state("load actor", actor, gpu, cal, params=P, grads=True, optimizer=O)
    off_t = offload_state("offload actor", actor, gpu, cal, params=P, optimizer=O)
    others = ref_resident + critic_rollout_resident + vllm_sleeping
    compute = spec.optimizer_steps * train_t.step_time_s
    phases.append(transition_phase("actor update", [load_t, off_t], train_m.peak_memory_gib + others / GIB, usable))
    last = phases[-1]
    phases[-1] = replace(
        last,
        time_s=last.time_s + compute,
        detail={
            **last.detail,
            "compute_s": compute,
            "optimizer_steps": spec.optimizer_steps,
            "per_optimizer_step_s": train_t.step_time_s,
            "micro_batches_per_optimizer_step": train_t.time.num_microbatches,
            "mfu": train_t.mfu,
        },
    )
    notes = []
    if spec.rollout_s is None:
        notes.append("rollout generation time not included (give --rollout-s); the total is the training side")
    return StepResult(spec, choice, tuple(phases), actor, tuple(notes))


OFFLOAD_CHOICES = ((False, False), (False, True), (True, True))


def with_offload(choice: StepChoice, param: bool, optimizer: bool) -> StepChoice:
    return replace(choice, param_offload=param, optimizer_offload=optimizer, ref_param_offload=param)


def with_log_prob_budget(choice: StepChoice, max_token_len: int) -> StepChoice:
    """`choice` with the dynamic log-prob passes packing `max_token_len` tokens per micro-batch (before the CP
    split; verl's per-GPU value is that / CP, as `export.verl` writes it)."""
    per_gpu = max_token_len // choice.parallel.cp

    def budget(b: Batching) -> Batching:
        return Batching(max_token_len_per_gpu=per_gpu, key=b.key) if b.dynamic else b

    return replace(
        choice,
        old_log_prob_batching=budget(choice.old_log_prob_batching),
        ref_log_prob_batching=budget(choice.ref_log_prob_batching),
    )


def fastest_log_prob_budget(
    spec: StepSpec, choice: StepChoice, gpu: GPUSpec, options: CostOptions, budgets: list[int]
) -> int | None:
    """The log-prob token budget of `budgets` (before the CP split) whose step with `choice` is fastest with every
    phase fitting, or None. Largest first: a forward pass gets faster with fewer, larger micro-batches until memory
    stops it (or the pipeline bubble of fewer micro-batches outweighs that), so the walk down stops at the first
    fitting budget that is slower than a larger one -- packing the thousands of small micro-batches of the smallest
    budgets only when nothing larger fits."""
    best: StepResult | None = None
    best_budget = None
    for budget in sorted(budgets, reverse=True):
        try:
            r = evaluate_step(spec, with_log_prob_budget(choice, budget), gpu, options)
        except ConfigError:  # e.g. more micro-batches than a data-parallel rank has sequences
            continue
        if not r.fits:
            continue
        if best is not None and r.total_s >= best.total_s:
            break
        best, best_budget = r, budget
    return best_budget


def best_offload(
    spec: StepSpec, choice: StepChoice, gpu: GPUSpec, options: CostOptions, log_prob_budgets: list[int] | None = None
) -> StepResult | None:
    """The fastest offload setting (none; optimizer only; params + optimizer, ref params with the actor's) under
    which every phase fits, or None. `log_prob_budgets`: the log-prob passes' budget is first chosen from these
    (`fastest_log_prob_budget`) under the offload that leaves the log-prob passes the most memory (the last of
    `OFFLOAD_CHOICES`), then kept for every offload setting; None keeps the choice's."""
    if log_prob_budgets is not None:
        most = with_offload(choice, *OFFLOAD_CHOICES[-1])
        budget = fastest_log_prob_budget(spec, most, gpu, options, log_prob_budgets)
        if budget is None:
            return None
        choice = with_log_prob_budget(choice, budget)
    best = None
    for param, optimizer in OFFLOAD_CHOICES:
        try:
            r = evaluate_step(spec, with_offload(choice, param, optimizer), gpu, options)
        except ConfigError:
            return None
        if r.fits and (best is None or r.total_s < best.total_s):
            best = r
    return best


def verl_builds(model: ModelSpec, parallel: ParallelConfig) -> bool:
    """Whether verl's megatron engine builds the layout: a hybrid (Mamba) model's stack, megatron-core 0.16.1's
    MambaStack (ssm/mamba_block.py `_select_layers_for_pipeline_parallel`), splits its layers over pp evenly or by
    first / last stage sizes and builds no virtual stages (layout strings and embedding / loss accounting unread)."""
    if not model.hybrid_layer_pattern:
        return True
    layout = parallel.pipeline_layout
    return parallel.vpp is None and (layout is None or layout.form == "first_last")


def search_step(
    spec: StepSpec, user: StepChoice, gpu: GPUSpec, options: CostOptions, top_k: int = 6, progress: Progress = QUIET
) -> tuple[StepResult, ...]:
    """Whole-step results of the best `top_k` actor layouts of `search.plan` whose whole step fits, each with its best
    offload setting, fastest first. With dynamic batching `search.plan` packs the step's lengths and chooses each
    layout's training token budget (`Candidate.max_token_len_reason`), and the log-prob passes' budget is chosen
    per layout from `token_budget_choices` (`best_offload`); with fixed micro-batches `search.plan` chooses the
    micro-batch at the longest sequence and the log-prob passes keep the launch's micro-batch. `progress` hears
    of the search's phases, then of each whole step that fits."""
    dynamic = user.actor_batching.dynamic
    res = plan(
        spec.model, gpu, spec.num_gpus, spec.lengths.max_tokens, spec.mini_batch_sequences,
        mode="train", options=options, memory_margin=options.memory_margin, explain_impossible=False,
        grad_reduce_in_fp32=user.parallel.grad_reduce_in_fp32, lengths=spec.lengths if dynamic else None,
        progress=progress, image_tokens=spec.lengths.image_tokens,
    )  # fmt: skip
    log_prob_dynamic = user.old_log_prob_batching.dynamic or user.ref_log_prob_batching.dynamic
    log_prob_budgets = token_budget_choices(spec.lengths.max_tokens) if log_prob_dynamic else None
    results: list[StepResult] = []
    seen: set[str] = set()
    progress.start("pricing whole RLHF steps of the fastest layouts", min(top_k, len(res.candidates)))
    for cand in res.candidates:  # down the ranking until top_k whole steps fit (a layout's log-prob passes may not)
        if len(results) >= top_k:
            break
        parallel = cand.parallel.replace(tp_comm_overlap=False)  # verl does not enable TE userbuffers
        if not verl_builds(spec.model, parallel):
            continue
        key = user.actor_batching.key
        if dynamic:
            actor_b = Batching(max_token_len_per_gpu=cand.workload.max_token_len // parallel.cp, key=key)
        else:
            actor_b = Batching(micro_batch_size=cand.workload.micro_batch_size, key=key)
        choice = replace(user, parallel=parallel, recompute=cand.workload.recompute, actor_batching=actor_b)
        if choice.label() in seen:
            continue
        seen.add(choice.label())
        r = best_offload(spec, choice, gpu, options, log_prob_budgets)
        if r is not None:
            if cand.max_token_len_reason:
                r = replace(r, notes=r.notes + (f"actor max_token_len {cand.max_token_len_reason}",))
            results.append(r)
            progress.advance()
    results.sort(key=lambda r: (r.total_s, r.peak_memory_gib))
    return tuple(results)


def step_report(user: StepResult, ranked: tuple[StepResult, ...], overrides: list[str] | None) -> dict[str, Any]:
    """The JSON of `mat rlhf`: the launch's own step, the ranked alternatives, the overrides of the best."""
    best = ranked[0] if ranked else None
    gain = None
    if best is not None and user.fits and best.total_s > 0:
        gain = user.total_s / best.total_s - 1.0
    s = user.spec
    return {
        "schema_version": SCHEMA_VERSION,
        "tool_version": __version__,
        "inputs": {
            "model": s.model.name,
            "num_gpus": s.num_gpus,
            "train_batch_size": s.train_batch_size,
            "rollout_n": s.rollout_n,
            "sequences_per_step": s.sequences,
            "tokens_per_step": s.tokens_per_step,
            "lengths": s.lengths.to_dict(),
            "ppo_mini_batch_size": s.mini_batch_size,
            "ppo_epochs": s.ppo_epochs,
            "use_reference": s.use_reference,
            "use_critic": s.use_critic,
            "rollout_tp": s.rollout_tp,
            "rollout_s": s.rollout_s,
        },
        "launch": user.to_dict(),
        "best": best.to_dict() if best else None,
        "predicted_gain": gain,
        "ranked": [r.to_dict() for r in ranked],
        "verl_overrides": overrides,
    }


__all__ = [
    "OFFLOAD_CHOICES",
    "StepChoice",
    "StepResult",
    "StepSpec",
    "best_offload",
    "evaluate_step",
    "fastest_log_prob_budget",
    "search_step",
    "step_report",
    "with_log_prob_budget",
    "with_offload",
]
