"""TP scaling check against TP=1: does splitting an op over n GPUs give n times less time?

For each op (fwd + bwd of its GEMMs) and for the layer (sum of the ops):
  ideal(n) = time(TP=1) / n,  efficiency(n) = ideal(n) / time(TP=n),
  efficient when time(TP=n) <= (1 + tolerance) * ideal(n)   (tolerance 0.2 by default).
time(TP=n) is the best measured setup at that size (tuned, TE default, symm-mem or NCCL).
The largest efficient TP is the largest n such that every measured size up to n is efficient.
Works from any records, e.g. TP=8 measured elsewhere.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ScalingPoint:
    tp: int
    time_ms: float
    ideal_ms: float
    efficiency: float
    efficient: bool
    setup: str
    exposed_comm_ms: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


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
    name: str, tp1_ms: float, by_tp: dict[int, tuple[float, str, float | None]], tolerance: float = 0.2
) -> ScalingResult:
    """by_tp: n -> (best time ms, setup name, exposed comm ms or None)."""
    if tp1_ms <= 0:
        raise ValueError("TP=1 time must be positive")
    points = []
    for n in sorted(by_tp):
        t, setup, exposed = by_tp[n]
        ideal = tp1_ms / n
        points.append(
            ScalingPoint(n, t, ideal, ideal / t if t > 0 else 0.0, t <= (1 + tolerance) * ideal, setup, exposed)
        )
    largest = 1
    for p in points:
        if not p.efficient:
            break
        largest = p.tp
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
