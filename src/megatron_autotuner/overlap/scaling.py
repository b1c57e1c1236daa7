"""TP scaling check against TP=1: does splitting an op over n GPUs give n times less time?

For each op (fwd + bwd of its GEMMs) and for the layer (sum of the ops), by the rule `mat plan` reports too
(`costmodel.tp_scaling`):
  ideal(n) = time(TP=1) / n,  efficiency(n) = ideal(n) / time(TP=n),
  efficient when time(TP=n) <= (1 + tolerance) * ideal(n)   (tolerance 0.2 by default).
time(TP=n) is the best measured setup at that size (tuned, TE default, symm-mem or NCCL).
The largest efficient TP is the largest n such that every measured size up to n is efficient.
Works from any records, e.g. TP=8 measured elsewhere. `predicted_scaling` is the same check on the cost
model's times (what `mat plan` prints), for sizes not measured.

The measured op times are CUDA-event times of each GEMM op started on an idle GPU: each carries a fixed cost
that does not shrink with TP (the committed 2x H200 run: Llama-3.1-8B qkv forward 0.834 ms at TP=1, 0.723 ms at
TP=2 for half the FLOPs plus a 156 us all-gather). In a training step the host runs ahead and that cost hides
behind GPU work, so the measured check is stricter than the predicted one (24% vs 6% over ideal at TP=2).
`whole_layer_scaling` applies the rule to whole TE TransformerLayers timed forward + backward
(`overlap.layer_check` at TP 1 and at TP n), where the host issues the layer's ops ahead of the GPU as a step does:
that is the check the tuner recommends a TP size by when it has it, and the one `mat plan` predicts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..costmodel.tp_scaling import (
    TP_SCALING_TOLERANCE,
    ScalingPoint,
    TPScaling,
    largest_efficient_tp,
    predicted_tp_scaling,
    scaling_point,
)
from ..specs import get_gpu_spec, load_model_spec

__all__ = ["ScalingPoint", "ScalingResult", "predicted_scaling", "scaling_check", "whole_layer_scaling"]


@dataclass(frozen=True)
class ScalingResult:
    name: str  # op or "layer"
    tp1_ms: float
    points: tuple[ScalingPoint, ...]
    largest_efficient_tp: int
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "tp1_ms": self.tp1_ms,
            "points": [p.to_dict() for p in self.points],
            "largest_efficient_tp": self.largest_efficient_tp,
            "reason": self.reason,
        }


def scaling_check(
    name: str,
    tp1_ms: float,
    by_tp: dict[int, tuple[float, str, float | None]],
    tolerance: float = TP_SCALING_TOLERANCE,
) -> ScalingResult:
    """by_tp: n -> (best time ms, setup name, exposed comm ms or None)."""
    if tp1_ms <= 0:
        raise ValueError("TP=1 time must be positive")
    points = [scaling_point(tp1_ms, n, *by_tp[n], tolerance) for n in sorted(by_tp)]
    largest = largest_efficient_tp(points)
    first_bad = next((p for p in points if not p.efficient), None)
    if not points:
        reason = "no TP > 1 measured"
    elif first_bad is None:
        last = points[-1]
        reason = (
            f"scales to TP={last.tp}: {last.time_ms:.3f} ms vs ideal {last.ideal_ms:.3f} ms "
            f"({last.efficiency:.0%} efficient, within the {tolerance:.0%} tolerance)"
        )
    else:
        over = first_bad.time_ms / first_bad.ideal_ms - 1
        why = ""
        if first_bad.exposed_comm_ms is not None and first_bad.exposed_comm_ms > 0:
            gap = first_bad.time_ms - first_bad.ideal_ms
            why = (
                f"; {first_bad.exposed_comm_ms:.3f} ms of communication stays exposed"
                f" ({min(first_bad.exposed_comm_ms / gap, 1):.0%} of the gap)"
                if gap > 0
                else ""
            )
        else:
            why = "; the GEMMs get too small to keep the GPU busy or communication is not hidden"
        reason = (
            f"TP={first_bad.tp} takes {first_bad.time_ms:.3f} ms vs ideal {first_bad.ideal_ms:.3f} ms "
            f"(TP=1 {tp1_ms:.3f} ms / {first_bad.tp}): {over:.0%} over, beyond the {tolerance:.0%} "
            f"tolerance{why}; largest efficient TP is {largest}"
        )
    return ScalingResult(name, tp1_ms, tuple(points), largest, reason)


def whole_layer_scaling(
    checks: list[dict[str, Any]], model: str, tolerance: float = TP_SCALING_TOLERANCE
) -> ScalingResult | None:
    """The check on whole layers: `checks` are `overlap.layer_check` results (one per TP size, {"tp", "models":
    {model: {"status", "median_ms": {setup: ms}}}}); TP 1 is its plain layer, TP n the fastest setup measured
    there. None without both a TP 1 and a larger size for `model`."""
    tp1 = None
    by_tp: dict[int, tuple[float, str, float | None]] = {}
    for doc in checks:
        res = (doc.get("models") or {}).get(model) or {}
        times = {k: v for k, v in (res.get("median_ms") or {}).items() if v} if res.get("status") == "ok" else {}
        if not times:
            continue
        if doc["tp"] == 1:
            tp1 = times.get("nccl")
        else:
            t, setup = min((v, k) for k, v in times.items())
            by_tp[doc["tp"]] = (t, setup, None)
    if tp1 is None or not by_tp:
        return None
    return scaling_check("whole layer", tp1, by_tp, tolerance)


def predicted_scaling(
    model: str, gpu: str, tokens: int, tps: tuple[int, ...] = (2, 4, 8), tolerance: float = TP_SCALING_TOLERANCE
) -> tuple[ScalingResult, TPScaling]:
    """The layer check on the cost model's times (`costmodel.tp_scaling.predicted_tp_scaling`, sequence length =
    tokens): the verdict `mat plan` reports for the same model and GPU."""
    spec = load_model_spec(model)
    pred = predicted_tp_scaling(spec, get_gpu_spec(gpu), tokens, tokens, tps, tolerance=tolerance)
    by_tp = {p.tp: (p.time_ms, p.setup, p.exposed_comm_ms) for p in pred.points}
    return scaling_check("layer", pred.tp1_ms, by_tp, tolerance), pred
