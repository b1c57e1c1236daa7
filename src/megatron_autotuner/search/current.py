"""Your run vs the best: a user's own Megatron-LM launch predicted beside the plan's top candidates, the gain, and
the flags to change (a diff of Megatron-LM arguments, through the same flag table import and export use)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..costmodel.estimate import CostOptions, Estimate
from ..specs.megatron_args import FLAG_TABLE, ImportedLaunch, render_flags, specs_to_megatron_args


@dataclass(frozen=True)
class FlagChange:
    """One Megatron-LM argument to change: `before` / `after` are flag texts ('' when absent)."""

    dest: str
    before: str
    after: str

    def to_dict(self) -> dict[str, str]:
        return {"dest": self.dest, "before": self.before, "after": self.after}

    def __str__(self) -> str:
        if not self.after:
            return f"remove {self.before}"
        if not self.before:
            return f"add    {self.after}"
        return f"change {self.before} -> {self.after}"


def flag_changes(current: dict[str, Any], proposed: dict[str, Any]) -> list[FlagChange]:
    """The Megatron-LM arguments that differ between two argument sets, each as rendered flags. A dest's text is
    empty when it is at Megatron-LM's default (no flag needed)."""
    changes = []
    for dest in [d for d in FLAG_TABLE if d in current or d in proposed]:
        before = " ".join(render_flags({dest: current[dest]})) if dest in current else ""
        after = " ".join(render_flags({dest: proposed[dest]})) if dest in proposed else ""
        if before != after:
            changes.append(FlagChange(dest, before, after))
    return changes


@dataclass(frozen=True)
class CurrentRun:
    """A user's launch, predicted with its own settings, against the plan's best candidate."""

    estimate: Estimate
    best: Estimate
    changes: tuple[FlagChange, ...]

    @property
    def speedup(self) -> float:
        """Your step time / the best's: 1.25 means the best layout is 25% faster."""
        return self.estimate.step_time_s / self.best.step_time_s

    def to_dict(self) -> dict[str, Any]:
        e = self.estimate
        return {
            "step_time_s": e.step_time_s,
            "tokens_per_s_per_gpu": e.tokens_per_s_per_gpu,
            "model_tflops_per_gpu": e.model_tflops_per_gpu,
            **e.mfu_fields(),
            "peak_memory_gib": e.peak_memory_gib,
            "fits": e.fits,
            "parallel": e.parallel.to_dict(),
            "best_step_time_s": self.best.step_time_s,
            "speedup_of_best": self.speedup,
            "flag_changes": [c.to_dict() for c in self.changes],
            "notes": list(e.notes),  # what `mat plan` prints under the launch's row
            "not_modelled": list(e.not_modelled),
        }


def compare_with_best(current: Estimate, best: Estimate, best_options: CostOptions) -> CurrentRun:
    """Your launch (`current`, predicted with the launch's own options) against the plan's best (predicted with
    `best_options`): the flags to change are the difference of the two runs' Megatron-LM arguments."""
    mine = specs_to_megatron_args(current.model, current.parallel, current.workload, current.options)
    theirs = specs_to_megatron_args(best.model, best.parallel, best.workload, best_options)
    return CurrentRun(current, best, tuple(flag_changes(mine, theirs)))


def refused_launch(reason: str, launch: ImportedLaunch, best: Estimate, best_options: CostOptions) -> dict[str, Any]:
    """A launch whose own layout Megatron-LM would refuse (`reason`): its layout, what reading it assumed, the best
    layout's step time and the Megatron-LM flags that turn the launch into the best layout."""
    mine = specs_to_megatron_args(best.model, launch.parallel, launch.workload, best_options)
    theirs = specs_to_megatron_args(best.model, best.parallel, best.workload, best_options)
    return {
        "refused": reason,
        "parallel": launch.parallel.to_dict(),
        "best_step_time_s": best.step_time_s,
        "flag_changes": [c.to_dict() for c in flag_changes(mine, theirs)],
        "notes": list(launch.notes),
        "not_modelled": list(launch.not_modelled),
    }


__all__ = ["CurrentRun", "FlagChange", "compare_with_best", "flag_changes", "refused_launch"]
