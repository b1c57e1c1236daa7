"""Search the layout space: enumerate, reject what megatron-core refuses or what does not fit
memory (with a safety margin), rank the rest by predicted step time, and say why each rejected
layout was rejected.

Order of work (what keeps a 1024-GPU search in seconds): for each (tp, pp, cp, ep, etp, vpp, sp,
distributed optimizer, recompute) the micro-batch sizes are tried smallest first; memory grows
with the micro-batch, so the first size that does not fit rejects the larger ones without
computing them. Memory (`theory.memory`) is computed before time; only layouts that fit are
timed (`costmodel.time_model`, cached per layer shape).

Variable lengths (`lengths`, verl's dynamic batching) without a given `max_token_len`: the token budget per
micro-batch is searched like the micro-batch size (`space.token_budget_choices`, smallest first; a budget that
does not fit rejects the larger ones), and each layout keeps its fastest budget that fits, with the reason
(`Candidate.max_token_len_reason`).

CUDA graphs (`plan_with_graphs`): eager layouts first; where the fastest one's predicted step includes time the
GPU waits on the host (`Estimate.time.breakdown["host_bound"]`), the search runs again with Transformer Engine's
per-layer graphs as a choice for every layout (`space.cuda_graph_choices`), since that is where they pay.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, replace
from typing import Any

from .. import SCHEMA_VERSION, __version__
from ..costmodel.estimate import (
    DEFAULT_MEMORY_MARGIN,
    CostOptions,
    Estimate,
    device_allowance,
    estimate,
    padded_vocab,
    time_model,
)
from ..costmodel.tp_scaling import TPScaling, predicted_tp_scaling
from ..errors import ConfigError
from ..specs.hardware import ClusterSpec, GPUSpec
from ..specs.lengths import SequenceLengths
from ..specs.model import ModelSpec
from ..specs.parallel import (
    FLEX_DISPATCHER_BACKENDS,
    CudaGraphConfig,
    MoeRouting,
    ParallelConfig,
    RecomputeConfig,
    Workload,
    cp_comm_type_for,
    validate_layout,
)
from ..theory.memory import GIB, ActivationOptions, memory_parallel, memory_per_stage
from .host_pace import PaceSpread, rank_with_host_pace
from .progress import QUIET, Progress
from .space import (
    RECOMPUTE_CHOICES,
    SearchSpace,
    a2a_overlap_choices,
    cp_choices,
    cuda_graph_choices,
    iter_model_parallel,
    layout_choices,
    micro_batch_choices,
    pp_choices,
    token_budget_choices,
    tp_choices,
)


@dataclass(frozen=True)
class Candidate:
    """A feasible layout with its prediction. `rank` starts at 1 (fastest)."""

    rank: int
    parallel: ParallelConfig
    workload: Workload
    estimate: Estimate
    # with variable lengths and the budget searched: why this max_token_len ("16384: the largest budget that
    # fits; 32768 needs 81.2 GiB > 75.7 GiB usable")
    max_token_len_reason: str | None = None
    # the step on the fastest and slowest hosts measured and the worst regret over them (`search.host_pace`); None
    # with a calibration's own host floors
    host_pace: PaceSpread | None = None

    @property
    def label(self) -> str:
        return layout_label(self.parallel, self.workload)

    def to_dict(self) -> dict[str, Any]:
        e = self.estimate
        return {
            "rank": self.rank,
            "label": self.label,
            "parallel": self.parallel.to_dict(),
            "micro_batch_size": self.workload.micro_batch_size,
            "max_token_len": self.workload.max_token_len,
            "max_token_len_reason": self.max_token_len_reason,
            "num_microbatches": e.time.num_microbatches,
            "recompute": self.workload.recompute.granularity,
            "step_time_s": e.step_time_s,
            "tokens_per_s_per_gpu": e.tokens_per_s_per_gpu,
            "model_tflops_per_gpu": e.model_tflops_per_gpu,
            "hardware_tflops_per_gpu": e.hardware_tflops_per_gpu,
            **e.mfu_fields(),
            "peak_memory_gib": e.peak_memory_gib,
            "memory_breakdown_gib": e.memory_breakdown_gib,
            "time_breakdown_s": e.time.breakdown,
            "step_time_on_hosts_measured_s": None if self.host_pace is None else list(self.host_pace.steps_s),
            "worst_regret_on_hosts_measured": None if self.host_pace is None else self.host_pace.worst_regret,
        }


@dataclass(frozen=True)
class Rejection:
    label: str
    reason: str
    peak_memory_gib: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"label": self.label, "reason": self.reason, "peak_memory_gib": self.peak_memory_gib}


@dataclass(frozen=True)
class PlanResult:
    """Ranked feasible layouts (fastest first) and every rejection with its reason."""

    model: ModelSpec
    gpu: GPUSpec
    num_gpus: int
    base_workload: Workload
    options: CostOptions
    candidates: tuple[Candidate, ...]
    rejections: tuple[Rejection, ...]
    considered: int
    elapsed_s: float
    notes: tuple[str, ...] = field(default_factory=tuple)
    # ranks of the best layouts on the fastest and slowest hosts measured, where not #1 (`search.host_pace`)
    pace_alternatives: tuple[int, ...] = ()
    # token budgets that fit but lose to a faster budget of the same layout (verl dynamic batching): considered =
    # candidates + rejections + superseded
    superseded: int = 0

    @property
    def best(self) -> Candidate:
        return self.candidates[0]

    def top(self, k: int) -> tuple[Candidate, ...]:
        return self.candidates[:k]

    def rank_of(self, **match: Any) -> Candidate | None:
        """The best-ranked candidate whose ParallelConfig / workload fields equal `match`."""
        for c in self.candidates:
            fields = {
                **c.parallel.to_dict(),
                "micro_batch_size": c.workload.micro_batch_size,
                "max_token_len": c.workload.max_token_len,
                "recompute": c.workload.recompute.granularity,
            }
            if all(fields.get(k) == v for k, v in match.items()):
                return c
        return None

    def rejection_counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for r in self.rejections:
            key = r.reason.split(":")[0]
            counts[key] = counts.get(key, 0) + 1
        return counts

    def tp_scaling(self) -> TPScaling:
        """The overlap tuner's TP scaling check for this model, GPU and sequence, on the cost model's times
        (`costmodel.tp_scaling`). It asks whether TP=n makes a layer's GEMMs n times faster; the ranking asks which
        whole step is fastest on `num_gpus` GPUs, so a TP that fails the check can still rank first (when the
        layouts without it do not fit or need recompute)."""
        w = self.base_workload
        tps = tuple(t for t in (2, 4, 8) if t <= min(self.num_gpus, self.gpu.gpus_per_node))
        return predicted_tp_scaling(self.model, self.gpu, w.seq_length, w.seq_length, tps, w.precision)

    def to_dict(self, top_k: int | None = None, max_rejections: int | None = None) -> dict[str, Any]:
        cands = self.candidates if top_k is None else self.candidates[:top_k]
        return {
            "schema_version": SCHEMA_VERSION,
            "tool_version": __version__,
            "inputs": {
                "model": self.model.name,
                "gpu": self.gpu.name,
                "num_gpus": self.num_gpus,
                "workload": self.base_workload.to_dict(),
                "flops_convention": self.options.flops_convention,
                "memory_margin": self.options.memory_margin,
            },
            "considered": self.considered,
            "feasible": len(self.candidates),
            "rejected": len(self.rejections),
            "superseded": self.superseded,
            "rejection_counts": self.rejection_counts(),
            "elapsed_s": self.elapsed_s,
            "candidates": [c.to_dict() for c in cands],
            "rejections": [r.to_dict() for r in self.rejections[:max_rejections]],
            "notes": list(self.notes),
            "pace_alternatives": list(self.pace_alternatives),
            "tp_scaling": self.tp_scaling().to_dict(),
        }


def _optimizer_sharded(model: ModelSpec, parallel: ParallelConfig) -> bool:
    """Whether megatron-core's distributed optimizer splits anything: the dense parameters over dp x cp ranks, the
    experts' over the expert data-parallel ranks (`ParallelConfig.edp`)."""
    return parallel.dp * parallel.cp > 1 or (model.is_moe and parallel.edp > 1)


def layout_label(p: ParallelConfig, w: Workload) -> str:
    parts = [f"tp{p.tp}", f"pp{p.pp}"]
    if p.vpp:
        parts.append(f"vpp{p.vpp}")
    if p.pipeline_layout is not None:
        parts.append(f"({p.pipeline_layout.describe()})")
    parts += [f"cp{p.cp}", f"dp{p.dp}"]
    if p.ep > 1 or p.etp != p.tp:
        parts += [f"ep{p.ep}", f"etp{p.etp}"]
    if p.moe_dispatcher != "alltoall":
        parts.append(f"flex-{p.moe_dispatcher}" if p.moe_dispatcher in FLEX_DISPATCHER_BACKENDS else p.moe_dispatcher)
    if p.moe_a2a_overlap:
        parts.append("a2a-overlap" + ("+delay-wgrad" if p.delay_wgrad_compute else ""))
    parts.append("sp" if p.sequence_parallel else "nosp")
    parts.append(f"mbs{w.micro_batch_size}" if w.max_token_len is None else f"tok{w.max_token_len}")
    parts.append(f"rc-{w.recompute.granularity}")
    if not p.use_distributed_optimizer:
        parts.append("no-distopt")
    if w.cuda_graph.enabled:
        parts.append("graphs-" + "+".join((w.cuda_graph.impl, *w.cuda_graph.scope)))
    return " ".join(parts)


def plan(
    model: ModelSpec,
    gpu: GPUSpec,
    num_gpus: int,
    seq_length: int,
    global_batch_size: int,
    *,
    mode: str = "train",
    precision: str = "bf16",
    max_token_len: int | None = None,
    memory_margin: float = DEFAULT_MEMORY_MARGIN,
    space: SearchSpace | None = None,
    options: CostOptions | None = None,
    explain_impossible: bool = True,
    grad_reduce_in_fp32: bool = True,
    fp8_recipe: str = "delayed",
    fp8_param: bool = False,
    lengths: SequenceLengths | None = None,
    cuda_graph: CudaGraphConfig | None = None,
    tp_comm_overlap: bool = False,
    progress: Progress = QUIET,
    image_tokens: int = 0,
    moe_routing: MoeRouting | None = None,
) -> PlanResult:
    """Rank every valid layout of `model` on `num_gpus` x `gpu` by predicted step time.

    `lengths`: variable prompt + response lengths (verl RLHF), packed into micro-batches of `max_token_len`
    tokens; without `max_token_len` the budget is chosen per layout (module docstring). `seq_length` is then the
    longest sequence (>= `lengths.max_tokens`).

    `grad_reduce_in_fp32=False` (Megatron-LM's --grad-reduce-in-bf16), `fp8_recipe` and `fp8_param`
    (--fp8-recipe, --fp8-param-gather) are numerics choices the user makes, so they are applied to every layout
    rather than searched (fp8 parameters rule out layouts without the distributed optimizer). `tp_comm_overlap`:
    every sequence-parallel layout overlaps its TP collectives with TE userbuffers (--tp-comm-overlap; off by
    default, as in Megatron-LM). `progress` hears of each phase (screening, the full search, the estimates).
    `image_tokens`: a vision-language model's image tokens per sequence (`Workload.image_tokens_per_sequence`);
    `moe_routing`: how the router spreads a MoE model's tokens (`Workload.moe_routing`; balanced by default).

    Raises `ConfigError` with the nearest workable alternative when no layout divides the GPU
    count or none fits in memory.
    """
    started = time.perf_counter()
    space = space or SearchSpace()
    if options is None:
        options = CostOptions(memory_margin=memory_margin)
    elif options.memory_margin != memory_margin:
        options = CostOptions(**{**options.__dict__, "memory_margin": memory_margin})
    budgets = token_budget_choices(seq_length) if lengths is not None and max_token_len is None else None
    base = Workload(
        seq_length,
        1,
        global_batch_size,
        RecomputeConfig(),
        precision,
        mode,
        budgets[0] if budgets else max_token_len,
        fp8_recipe,
        fp8_param,
        lengths,
        cuda_graph or CudaGraphConfig(),
        image_tokens_per_sequence=image_tokens,
        moe_routing=moe_routing or MoeRouting(),
    )
    graph_choices = space.cuda_graphs or (base.cuda_graph,)
    # screening times structures eagerly: per-layer graphs refuse full recompute, which screening probes
    eager = CudaGraphConfig()
    packed = lengths is not None
    if precision == "fp8":
        gpu.peak_tflops("fp8")
    forward = mode == "forward"
    usable = gpu.hbm_gib * (1.0 - memory_margin) * GIB
    act_options = ActivationOptions(flash_attention=options.flash_attention, loss_kernel=options.loss_kernel)
    allowance = device_allowance(options, gpu)
    recomputes = ("none",) if forward else space.recompute
    dist_opts = (True,) if forward else space.distributed_optimizer
    feasible: list[tuple[ParallelConfig, Workload, list]] = []
    layouts_by_pp: dict[int, list] = {}
    rejections: list[Rejection] = []
    considered = 0
    structural = 0
    # Structures: everything but the distributed optimizer, recompute and micro-batch.
    structures: list[tuple] = []
    for tp, pp, cp, ep, etp in iter_model_parallel(model, num_gpus, seq_length, gpu.gpus_per_node, space, packed):
        dp = num_gpus // (tp * pp * cp)
        sps = [tp > 1] if (tp == 1 or (model.is_moe and ep > 1)) else [s for s in space.sequence_parallel]
        if packed and global_batch_size % dp:
            considered += 1
            structural += 1
            rejections.append(
                Rejection(
                    f"tp{tp} pp{pp} cp{cp} dp{dp} ep{ep}",
                    f"batch: global batch {global_batch_size} not divisible by dp={dp} (verl splits it equally)",
                )
            )
            continue
        if budgets is not None:
            mbs_list = budgets  # token budgets, smallest first
        elif max_token_len is None:
            if global_batch_size % dp:
                considered += 1
                structural += 1
                rejections.append(
                    Rejection(
                        f"tp{tp} pp{pp} cp{cp} dp{dp} ep{ep}",
                        f"batch: global batch {global_batch_size} not divisible by dp={dp}",
                    )
                )
                continue
            mbs_list = micro_batch_choices(global_batch_size // dp, space, forward)
        else:
            mbs_list = [1]
        if pp not in layouts_by_pp:
            layouts_by_pp[pp] = layout_choices(model, pp, space, seq_length)
        for vpp, pipeline_layout in layouts_by_pp[pp]:
            for sp in sps:
                for a2a in a2a_overlap_choices(model, ep, pp, vpp, space, training=not forward):
                    structures.append((tp, pp, cp, ep, etp, vpp, pipeline_layout, sp, a2a, mbs_list))

    def config(
        st: tuple, dist: bool, rc_name: str, mbs: int, graphs: CudaGraphConfig | None = None
    ) -> tuple[ParallelConfig, Workload]:
        tp, pp, cp, ep, etp, vpp, pipeline_layout, sp, (a2a_overlap, delay_wgrad), _ = st
        work = base if graphs is None else base.replace(cuda_graph=graphs)
        parallel = ParallelConfig(
            num_gpus, tp, pp, cp, ep, etp, vpp, sp, dist, grad_reduce_in_fp32, tp_comm_overlap and sp and tp > 1,
            pipeline_layout=pipeline_layout, cp_comm_type=cp_comm_type_for(model, cp),
            moe_a2a_overlap=a2a_overlap, delay_wgrad_compute=delay_wgrad,
        )  # fmt: skip
        if budgets is not None:
            return parallel, work.replace(max_token_len=mbs, recompute=RECOMPUTE_CHOICES[rc_name])
        return parallel, work.replace(micro_batch_size=mbs, recompute=RECOMPUTE_CHOICES[rc_name])

    memory: dict[tuple[ParallelConfig, Workload], tuple[bool, float, list]] = {}

    def fits(parallel: ParallelConfig, workload: Workload) -> tuple[bool, float, list]:
        """(fits, peak bytes, stages); each configuration computed once (screening and the full search share)."""
        key = (memory_parallel(parallel), workload)
        if key not in memory:
            padded = padded_vocab(model, parallel.tp)
            stages = memory_per_stage(model, parallel, workload, act_options, allowance, padded)
            peak = max(st.total_bytes for st in stages)
            memory[key] = (peak <= usable, peak, stages)
        return memory[key]

    def too_large(peak: float) -> str:
        return (
            f"memory: {peak / GIB:.1f} GiB > {usable / GIB:.1f} GiB usable "
            f"({gpu.hbm_gib:.1f} GiB x (1 - margin {memory_margin:g}))"
        )

    # Screening: each structure at its smallest micro-batch with the distributed optimizer, with the least
    # recompute that fits; a structure that fits with none of them is rejected whole, and only structures within
    # `space.screen_slack` of the fastest (or the `space.screen_keep` fastest) are searched in full.
    lightest_first = [r for r in ("none", "selective", "full") if r in recomputes]

    def recomputes_of(st: tuple, names: list[str]) -> list[str]:
        # megatron-core refuses full recompute beside the EP all-to-all overlap (`specs.check_moe_a2a_overlap`)
        return [r for r in names if not (st[8][0] and r == "full")] or names

    dist_probe = True in dist_opts
    screened: list[tuple[float, tuple]] = []
    progress.start("screening layouts", len(structures))
    for st in structures:  # counted as considered when rejected here; a kept one counts each of its variants
        progress.advance()
        lightest = recomputes_of(st, lightest_first)
        try:
            parallel, workload = config(st, dist_probe, lightest[-1], st[-1][0], eager)
            validate_layout(model, parallel, workload)
        except ConfigError as exc:
            considered += 1
            structural += 1
            rejections.append(Rejection(f"tp{st[0]} pp{st[1]} cp{st[2]} ep{st[3]} vpp{st[5]}", f"invalid: {exc}"))
            continue
        # the most recompute first: if that does not fit, nothing of this structure does
        ok, peak, _ = fits(parallel, workload)
        found = None
        if ok:
            for rc_name in lightest:
                parallel, workload = config(st, dist_probe, rc_name, st[-1][0], eager)
                ok, _, _ = fits(parallel, workload)
                if ok:
                    found = (parallel, workload)
                    break
        if found is None:
            considered += 1
            rejections.append(
                Rejection(
                    layout_label(parallel, workload),
                    f"{too_large(peak)} with {lightest[-1]} recompute at the smallest micro-batch",
                    peak / GIB,
                )
            )
            continue
        step = time_model(model, found[0], found[1], ClusterSpec(gpu, num_gpus), options).step_time_s
        screened.append((step, st))
    screened.sort(key=lambda x: x[0])
    kept = []
    for i, (step, st) in enumerate(screened):
        if i < space.screen_keep or step <= screened[0][0] * (1 + space.screen_slack):
            kept.append(st)
            continue
        parallel, workload = config(st, dist_probe, "none", st[-1][0])
        considered += 1
        rejections.append(
            Rejection(
                layout_label(parallel, workload),
                f"screened: {step / screened[0][0] - 1:.0%} slower than the fastest layout at its smallest "
                "micro-batch (its recompute / micro-batch variants were not searched)",
            )
        )

    # (layout, recompute) -> (the smallest token budget that failed, why): the reason a larger one was not chosen
    budget_limits: dict[tuple[ParallelConfig, str], tuple[int, str]] = {}
    progress.start("searching micro-batches, recompute and optimizer sharding", len(kept) * len(graph_choices))
    for st, graphs in ((st, g) for st in kept for g in graph_choices):
        progress.advance()
        mbs_list = st[-1]
        any_fit = False  # with the distributed optimizer (tried first): without it needs more memory
        sharded = _optimizer_sharded(model, config(st, True, recomputes[0], mbs_list[0], graphs)[0])
        for dist in sorted(dist_opts, reverse=True):
            if not dist and True in dist_opts and not sharded:
                continue  # one optimizer shard: without the distributed optimizer it is the same layout
            for rc_name in recomputes_of(st, list(recomputes)):
                too_big = not dist and True in dist_opts and not any_fit
                for mbs in mbs_list:
                    considered += 1
                    parallel, workload = config(st, dist, rc_name, mbs, graphs)
                    label = layout_label(parallel, workload)
                    if too_big:
                        smaller = "a smaller token budget" if budgets is not None else "a smaller micro-batch"
                        why = smaller if dist or any_fit else "the distributed optimizer"
                        rejections.append(Rejection(label, f"memory: {why} already does not fit"))
                        continue
                    try:
                        validate_layout(model, parallel, workload)
                    except ConfigError as exc:
                        structural += 1
                        rejections.append(Rejection(label, f"invalid: {exc}"))
                        budget_limits.setdefault((parallel, rc_name), (mbs, f"is invalid ({exc})"))
                        continue
                    ok, peak, stages = fits(parallel, workload)
                    if not ok:
                        too_big = True
                        rejections.append(Rejection(label, too_large(peak), peak / GIB))
                        budget_limits.setdefault(
                            (parallel, rc_name), (mbs, f"needs {peak / GIB:.1f} GiB > {usable / GIB:.1f} GiB usable")
                        )
                        continue
                    feasible.append((parallel, workload, stages))
                    any_fit = True
    if considered == structural:
        raise ConfigError(
            "num_gpus", _nearest_gpu_count_message(model, gpu, num_gpus, seq_length, global_batch_size, space)
        )
    estimates = []
    progress.start("estimating the layouts that fit", len(feasible))
    for parallel, workload, stages in feasible:
        progress.advance()
        est = estimate(model, parallel, workload, gpu, options, memory_stages=stages)
        if est.fits:
            estimates.append(est)
        else:  # the stages fit; the frees still awaiting the GPU at the peak (`costmodel.queued_frees`) do not
            waiting = est.memory_breakdown_gib.get("queued_frees", 0.0)
            reason = f"{too_large(est.peak_memory_gib * GIB)} with {waiting:.1f} GiB of frees awaiting the GPU"
            rejections.append(Rejection(layout_label(parallel, workload), reason, est.peak_memory_gib))
    reasons: dict[int, str] = {}
    notes: list[str] = []
    fitting = len(estimates)
    if budgets is not None:
        estimates, reasons = _fastest_budget_per_layout(estimates, budget_limits)
        notes.append(
            "max_token_len chosen per layout from " + ", ".join(map(str, budgets)) + " (the longest sequence x "
            "1..16): the fastest budget that fits"
        )
    estimates, spreads, pace_alternatives, pace_note = rank_with_host_pace(estimates, options)
    if pace_note:
        notes.append(pace_note)
    candidates = tuple(
        Candidate(i + 1, e.parallel, e.workload, e, reasons.get(id(e)), spreads.get(id(e)))
        for i, e in enumerate(estimates)
    )
    if not candidates and explain_impossible:
        raise ConfigError(
            "num_gpus",
            _does_not_fit_message(
                model, gpu, num_gpus, rejections, memory_margin, base, grad_reduce_in_fp32, max_token_len
            ),
        )
    return PlanResult(
        model=model,
        gpu=gpu,
        num_gpus=num_gpus,
        base_workload=base,
        options=options,
        candidates=candidates,
        rejections=tuple(rejections),
        considered=considered,
        elapsed_s=time.perf_counter() - started,
        notes=tuple(notes),
        pace_alternatives=pace_alternatives,
        superseded=fitting - len(estimates),
    )


GRAPH_MODES = ("auto", "try", "off")


def plan_with_graphs(model: ModelSpec, gpu: GPUSpec, num_gpus: int, seq_length: int, global_batch_size: int,
                     *, cuda_graphs: str = "auto", **kwargs: Any) -> PlanResult:  # fmt: skip
    """`plan`, with CUDA graphs tried where they matter. `cuda_graphs`: "auto" tries eager and per-layer graphs for
    every layout when the fastest eager layout waits on the host at the default pace (slower hosts: the plan names
    their best layouts, `search.host_pace`); "try" always; "off" never. A workload that already
    has graphs (`cuda_graph=`, a launch's own) or a search space that names its graph choices is planned as given."""
    if cuda_graphs not in GRAPH_MODES:
        raise ConfigError("cuda_graphs", f"must be one of {', '.join(GRAPH_MODES)}, got {cuda_graphs!r}")
    space = kwargs.pop("space", None) or SearchSpace()
    as_given = (kwargs.get("cuda_graph") is not None and kwargs["cuda_graph"].enabled) or space.cuda_graphs is not None
    if cuda_graphs == "off" or as_given:
        return plan(model, gpu, num_gpus, seq_length, global_batch_size, space=space, **kwargs)
    if cuda_graphs == "try":
        why = "CUDA graphs tried for every layout (--cuda-graphs try)"
    else:
        eager = plan(model, gpu, num_gpus, seq_length, global_batch_size, space=space, **kwargs)
        best = eager.best.estimate
        host_s = best.time.breakdown.get("host_bound", 0.0)
        if host_s <= 0.0:
            return eager
        why = (
            f"CUDA graphs tried: the fastest eager layout waits {host_s / best.step_time_s:.0%} of its step on the "
            "host, which per-layer graphs take off"
        )
    graphed = plan(
        model,
        gpu,
        num_gpus,
        seq_length,
        global_batch_size,
        space=replace(space, cuda_graphs=cuda_graph_choices(model)),
        **kwargs,
    )
    return replace(graphed, notes=(*graphed.notes, why))


def _fastest_budget_per_layout(
    estimates: list[Estimate], limits: dict[tuple[ParallelConfig, str], tuple[int, str]]
) -> tuple[list[Estimate], dict[int, str]]:
    """Per layout (parallel config and recompute) the estimate of its fastest token budget, and why (by the
    estimate's id): the largest that fits and what the next one needs, or the faster of those that fit."""
    groups: dict[tuple[ParallelConfig, str], list[Estimate]] = {}
    for e in estimates:
        groups.setdefault((e.parallel, e.workload.recompute.granularity), []).append(e)
    kept, reasons = [], {}
    for key, group in groups.items():
        best = min(group, key=lambda e: (e.step_time_s, e.peak_memory_gib))
        chosen = best.workload.max_token_len
        largest = max(group, key=lambda e: e.workload.max_token_len)
        if largest is best:
            reason = f"{chosen}: the largest budget that fits"
            limit = limits.get(key)
            if limit is not None:
                reason += f"; {limit[0]} {limit[1]}"
            else:
                reason += " (the largest tried)"
        else:
            reason = (
                f"{chosen}: the fastest budget that fits ({best.step_time_s:.3f} s/step; "
                f"{largest.workload.max_token_len} fits but takes {largest.step_time_s:.3f} s)"
            )
        kept.append(best)
        reasons[id(best)] = reason
    return kept, reasons


def _has_valid_layout(model: ModelSpec, gpu: GPUSpec, n: int, seq: int, gbs: int, space: SearchSpace) -> bool:
    for tp, pp, cp, _ep, _etp in iter_model_parallel(model, n, seq, gpu.gpus_per_node, space):
        if gbs % (n // (tp * pp * cp)) == 0:
            return True
    return False


def _gpu_counts_to_try(model: ModelSpec, gpu: GPUSpec, seq: int, gbs: int, space: SearchSpace) -> list[int]:
    """Every GPU count a layout could have, ascending: tp*pp*cp (the search space's choices) times a divisor of the
    global batch (dp). `_has_valid_layout` holds only for these, so the nearest valid counts are found among them
    instead of by trying every count (a scan of 100,000 GPUs took 55 s)."""
    divisors = {d for k in range(1, math.isqrt(gbs) + 1) if gbs % k == 0 for d in (k, gbs // k)}
    products = {
        tp * pp * cp
        for tp in tp_choices(model, gpu.gpus_per_node, space)
        for pp in pp_choices(model, space)
        for cp in cp_choices(seq, space)
    }
    return sorted({p * d for p in products for d in divisors})


def _nearest_gpu_count_message(model: ModelSpec, gpu: GPUSpec, n: int, seq: int, gbs: int, space: SearchSpace) -> str:
    counts = _gpu_counts_to_try(model, gpu, seq, gbs, space)
    valid = (m for m in reversed(counts) if m < n and _has_valid_layout(model, gpu, m, seq, gbs, space))
    below = next(valid, None)
    valid = (m for m in counts if n < m < 4 * n + 9 and _has_valid_layout(model, gpu, m, seq, gbs, space))
    above = next(valid, None)
    near = " or ".join(str(m) for m in (below, above) if m is not None) or "none found"
    return (
        f"no valid layout of {model.name} divides {n} GPUs with global batch {gbs} and seq {seq} "
        f"(tp*pp*cp must divide the GPU count and dp the global batch); nearest GPU counts that work: {near}"
    )


def _does_not_fit_message(
    model, gpu, n, rejections, margin, base: Workload, grad_reduce_in_fp32: bool, max_token_len: int | None
) -> str:
    seq, gbs = base.seq_length, base.global_batch_size
    mem = [r for r in rejections if r.peak_memory_gib is not None]
    smallest = min(mem, key=lambda r: r.peak_memory_gib) if mem else None
    msg = f"no layout of {model.name} fits {n} x {gpu.name} ({gpu.hbm_gib:.1f} GiB, margin {margin:g})"
    if smallest is not None:
        msg += f"; the smallest needs {smallest.peak_memory_gib:.1f} GiB per GPU ({smallest.label})"
    for factor in (2, 4, 8, 16):
        m = n * factor
        try:
            found = plan(
                model,
                gpu,
                m,
                seq,
                gbs * factor if gbs % m and gbs < m else gbs,
                mode=base.mode,
                precision=base.precision,
                max_token_len=max_token_len,
                memory_margin=margin,
                grad_reduce_in_fp32=grad_reduce_in_fp32,
                fp8_recipe=base.fp8_recipe,
                fp8_param=base.fp8_param,
                lengths=base.lengths,
                image_tokens=base.image_tokens_per_sequence,
                moe_routing=base.moe_routing,
                space=SearchSpace(
                    distributed_optimizer=(True,),
                    sequence_parallel=(True,),
                    recompute=("full",),
                    micro_batch_sizes=(1,),
                    vpp=(1,),
                ),
                explain_impossible=False,
            )
        except ConfigError:
            continue
        if not found.candidates:
            continue
        return msg + f"; nearest that works: {m} GPUs (with full recompute, micro-batch 1)"
    return msg + f"; nothing fits up to {16 * n} GPUs"
