"""Rank layouts so that the first stays best whatever the host's pace.

An eager megatron-core step waits on its host where the GPU work per launch is short (small models, small
micro-batches, MoE blocks). Without a calibration of this machine's host the cost model paces it with the default
host floors, and hosts measured so far issued the same layers in 0.54x to 2.23x that time
(`costmodel.defaults.HOST_PACE_RANGE`). A layout's step is then known on three hosts: the fastest measured, the
default and the slowest measured (`costmodel.estimate.host_pace_steps`).

The ranking minimises the worst regret over those three hosts: for each host k, a layout's regret is its step over
the fastest layout's step on that host, minus one; layouts are ranked by their largest regret, then by the step at the
default pace. Where no layout waits on the host this is the ranking by step; where the host decides, the first layout
is the one that loses least to the best on any host measured. With a calibration's own floors the host has one
pace, and the ranking is by step.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..costmodel import defaults as d
from ..costmodel.estimate import CostOptions, Estimate, host_pace_steps, padded_vocab


@dataclass(frozen=True)
class PaceSpread:
    """A layout's step on the fastest and slowest hosts measured, and its worst regret over the three paces."""

    steps_s: tuple[float, float]
    worst_regret: float


def pace_spreads(estimates: list[Estimate], options: CostOptions) -> dict[int, PaceSpread] | None:
    """`PaceSpread` per estimate (keyed by `id`); None when the host floors are measured (one pace)."""
    steps: dict[int, tuple[float, float, float]] = {}
    for e in estimates:
        ends = e.step_time_range_s or host_pace_steps(
            e.model, e.parallel, e.workload, e.gpu, options, padded_vocab(e.model, e.parallel.tp)
        )
        if ends is None:
            return None
        steps[id(e)] = (ends[0], e.step_time_s, ends[1])
    if not steps:
        return {}
    best = [min(s[k] for s in steps.values()) for k in range(3)]
    return {key: PaceSpread((s[0], s[2]), max(s[k] / best[k] - 1.0 for k in range(3))) for key, s in steps.items()}


def rank_across_host_pace(estimates: list[Estimate], options: CostOptions) -> tuple[list[Estimate], dict, str | None]:
    """(estimates in ranking order, `PaceSpread` by id, a note when the host's pace changed the first layout)."""
    by_step = sorted(estimates, key=lambda e: (e.step_time_s, e.peak_memory_gib))
    spreads = pace_spreads(by_step, options)
    if not spreads:
        return by_step, {}, None
    ranked = sorted(by_step, key=lambda e: (round(spreads[id(e)].worst_regret, 6), e.step_time_s, e.peak_memory_gib))
    lo, hi = d.HOST_PACE_RANGE
    note = None
    if ranked[0] is not by_step[0]:
        fastest = spreads[id(by_step[0])]
        note = (
            f"ranked to stay best on any host measured ({lo}x-{hi}x the default host floor; no calibration of this "
            f"machine's): #1 loses at most {spreads[id(ranked[0])].worst_regret:.1%} to the best layout on any of them,"
            f" the fastest at the default pace up to {fastest.worst_regret:.1%}"
        )
    return ranked, spreads, note
