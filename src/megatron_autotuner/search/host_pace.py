"""The host's pace in the ranking: the step of every layout on the fastest and slowest hosts measured, and the best
layout of each.

An eager megatron-core step waits on its host where the GPU work per launch is short (small models, small
micro-batches, MoE blocks). Without a calibration of this machine's host the cost model paces it with the default
host floors, and hosts measured so far issued the same layers in 0.54x to 2.23x that time
(`costmodel.defaults.HOST_PACE_RANGE`). A layout's step is then known on three hosts: the fastest measured, the
default and the slowest measured (`costmodel.estimate.host_pace_steps`).

How the plan chooses across them: it ranks by the step at the default pace (the pace its checks were made at), and
where another layout is best on the fastest or the slowest host measured, it says so and names that layout as an
alternative (`PlanResult.pace_alternatives`), which `mat plan --validate K` runs beside the top K: on the machine at
hand the measurement decides between the layouts the host's pace could make best. A rule that picks one layout for
all hosts was tried and rejected on the evidence: minimising the worst regret over the three hosts let the slowest
lease VM (2.23x) pick for everyone and moved NVIDIA's Llama 3.1 70B layout on 64 H100 from first to twelfth;
minimising the mean step turned a 4x H200 MoE case's measured regret from 1.6% to 6.2%
(benchmarks/results/plan_regret.json). With a calibration's own floors the host has one pace: no spread, no
alternatives.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..costmodel import defaults as d
from ..costmodel.estimate import CostOptions, Estimate, host_pace_steps, host_sets_pace, padded_vocab


@dataclass(frozen=True)
class PaceSpread:
    """A layout's step on the fastest and slowest hosts measured, and its worst regret over the three paces (its step
    over the best layout's on the same host, minus one, at its worst host). Layouts that can win on no host measured
    past the first `SPREAD_SHOWN` get none (`pace_spreads`)."""

    steps_s: tuple[float, float]
    worst_regret: float


# layouts whose spread is always computed (the table and plan.json show the first ones)
SPREAD_SHOWN = 32


def _ends(e: Estimate, options: CostOptions) -> tuple[float, float] | None:
    return e.step_time_range_s or host_pace_steps(
        e.model, e.parallel, e.workload, e.gpu, options, padded_vocab(e.model, e.parallel.tp)
    )


def pace_spreads(ranked: list[Estimate], options: CostOptions) -> dict[int, PaceSpread] | None:
    """`PaceSpread` (keyed by `id`) of the first `SPREAD_SHOWN` layouts of `ranked` (by step at the default pace) and of
    every layout that could be best on the fastest or slowest host measured; None when the host floors are measured
    (one pace). A step never falls as the host slows, and a host `lo` times the default's pace takes a step down to
    `lo` times at most (every term of it is a GPU time or a host time, combined by sums and maxima): a layout whose
    default step is above the best step yet found on the slowest host, and whose `lo` x default step is above the best
    yet on the fastest, cannot win on either, and its spread is not computed. Where no host time sets any part of a
    layout's step at the default pace, a faster host leaves it as it is (`host_sets_pace`): its bound on the fastest
    host is its default step."""
    if not ranked:
        return {}
    first = _ends(ranked[0], options)
    if first is None:
        return None
    lo = d.HOST_PACE_RANGE[0]
    steps: dict[int, tuple[float, float, float]] = {}
    fastest, slowest = first  # the best steps found so far on the fastest and the slowest host
    for i, e in enumerate(ranked):
        fastest_bound_s = lo * e.step_time_s if host_sets_pace(e.time) else e.step_time_s
        contender = e.step_time_s < slowest or fastest_bound_s < fastest
        if i < SPREAD_SHOWN or contender:
            ends = first if i == 0 else _ends(e, options)
            steps[id(e)] = (ends[0], e.step_time_s, ends[1])
            fastest, slowest = min(fastest, ends[0]), min(slowest, ends[1])
    best = [min(s[k] for s in steps.values()) for k in range(3)]
    return {key: PaceSpread((s[0], s[2]), max(s[k] / best[k] - 1.0 for k in range(3))) for key, s in steps.items()}


# a loss the note would print as 0.0%: no change of winner
SAME_STEP_FRACTION = 0.0005


def rank_with_host_pace(
    estimates: list[Estimate], options: CostOptions
) -> tuple[list[Estimate], dict[int, PaceSpread], tuple[int, ...], str | None]:
    """(estimates by step at the default pace, `PaceSpread` by id, the 1-based ranks of the best layouts on the fastest
    and slowest hosts measured where they are not #1, a note naming them)."""
    ranked = sorted(estimates, key=lambda e: (e.step_time_s, e.peak_memory_gib))
    spreads = pace_spreads(ranked, options)
    if not spreads:
        return ranked, {}, (), None
    lo, hi = d.HOST_PACE_RANGE
    alternatives: list[int] = []
    said = []
    known = [i for i in range(len(ranked)) if id(ranked[i]) in spreads]
    for end, pace in ((0, lo), (1, hi)):
        rank = 1 + min(known, key=lambda i: (spreads[id(ranked[i])].steps_s[end], i))
        if rank != 1:
            first = spreads[id(ranked[0])]
            best = spreads[id(ranked[rank - 1])]
            loss = first.steps_s[end] / best.steps_s[end] - 1.0
            if loss < SAME_STEP_FRACTION:
                continue  # a tie at the note's precision: #1 stays as good there
            said.append(f"#{rank} on a host at {pace}x the default floor (#1 would be {loss:.1%} slower there)")
            if rank not in alternatives:
                alternatives.append(rank)
    note = None
    if said:
        note = (
            "the host's pace could change the winner (no calibration of this machine's host): best are "
            + " and ".join(said)
            + "; mat plan --validate runs them beside the top layouts, or measure the host: mat validate "
            "--measure-host-floor"
        )
    return ranked, spreads, tuple(alternatives), note
