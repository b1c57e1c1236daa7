"""TP scaling, one definition for `mat plan` and the overlap tuner: does splitting a layer's GEMMs over n GPUs
give n times less time?

    ideal(n) = time(TP=1) / n,   efficiency(n) = ideal(n) / time(TP=n),
    efficient when time(TP=n) <= (1 + tolerance) x ideal(n),
    largest efficient TP = the largest n such that every size up to n is efficient.

time is what the overlap tuner measures per layer: the GEMM ops (qkv, proj, fc1, fc2 of a dense layer) forward and
backward with their tensor-parallel communication, sequence parallel at TP > 1, the faster of NCCL without
overlap and TE userbuffers. `predicted_tp_scaling` prices it with the cost model (`layer.layer_cost`, whose TP
communication comes from `nccl_protocols` / `collectives.userbuffers_time_s`); `overlap.scaling.scaling_check`
applies the same rule to measured times.

This is a per-GPU efficiency question. `mat plan` answers another one, the fastest whole step on a fixed number of
GPUs, where TP=1 must fit in memory and DP (or CP, PP) takes the GPUs TP does not: a TP that is not efficient by
this rule can still rank first when the layouts without it do not fit or need recompute.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..specs.hardware import ClusterSpec, GPUSpec
from ..specs.model import ModelSpec
from .layer import LayerContext, layer_cost

TP_SCALING_TOLERANCE = 0.2  # the overlap tuner's default `scaling_tolerance` (overlap.config.OverlapTunerConfig)


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


def scaling_point(
    tp1_ms: float, tp: int, time_ms: float, setup: str, exposed_comm_ms: float | None, tolerance: float
) -> ScalingPoint:
    """One size against TP=1 by the rule above."""
    if tp1_ms <= 0:
        raise ValueError("TP=1 time must be positive")
    ideal = tp1_ms / tp
    eff = ideal / time_ms if time_ms > 0 else 0.0
    return ScalingPoint(tp, time_ms, ideal, eff, time_ms <= (1 + tolerance) * ideal, setup, exposed_comm_ms)


def largest_efficient_tp(points: list[ScalingPoint] | tuple[ScalingPoint, ...]) -> int:
    """The largest TP such that every measured size up to it is efficient (1 if the first is not)."""
    largest = 1
    for p in sorted(points, key=lambda q: q.tp):
        if not p.efficient:
            break
        largest = p.tp
    return largest


def _gemm_ops_ms(model: ModelSpec, gpu: GPUSpec, tp: int, tokens: int, seq: int, precision: str, ub: bool):
    """(ms of the layer's GEMMs fwd + bwd with their exposed TP communication, exposed TP comm ms)."""
    ctx = LayerContext(
        cluster=ClusterSpec(gpu, max(tp, 1)),
        tp=tp,
        sequence_parallel=tp > 1,
        tokens=tokens,
        seq_length=seq,
        precision=precision,
        tp_comm_overlap=ub and tp > 1,
    )
    layer = next((i for i in range(model.num_layers) if not model.is_moe_layer(i)), 0)
    cost = layer_cost(model, layer, ctx)
    comm = cost.fwd.parts.get("tp", 0.0) + cost.bwd.parts.get("tp", 0.0)
    gemm = cost.fwd.parts.get("gemm", 0.0) + cost.bwd.parts.get("gemm", 0.0)
    return (gemm + comm) * 1e3, comm * 1e3


@dataclass(frozen=True)
class TPScaling:
    """Predicted TP scaling of one model's layer GEMMs (the overlap tuner's check, priced by the cost model)."""

    model: str
    gpu: str
    tokens: int
    tp1_ms: float
    points: tuple[ScalingPoint, ...]
    tolerance: float

    @property
    def largest_efficient_tp(self) -> int:
        return largest_efficient_tp(self.points)

    def summary(self) -> str:
        parts = [
            f"TP={p.tp} {p.time_ms / p.ideal_ms - 1:+.0%} over ideal ({'' if p.efficient else 'not '}efficient)"
            for p in self.points
        ]
        return (
            f"layer GEMMs + TP communication, TP=1 {self.tp1_ms:.2f} ms: "
            + ", ".join(parts)
            + f"; largest efficient TP {self.largest_efficient_tp} (tolerance {self.tolerance:.0%})"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "definition": "overlap tuner's TP scaling check (costmodel.tp_scaling), predicted",
            "model": self.model,
            "gpu": self.gpu,
            "tokens": self.tokens,
            "tolerance": self.tolerance,
            "tp1_ms": self.tp1_ms,
            "points": [p.to_dict() for p in self.points],
            "largest_efficient_tp": self.largest_efficient_tp,
            "summary": self.summary(),
        }


def predicted_tp_scaling(
    model: ModelSpec,
    gpu: GPUSpec,
    tokens: int,
    seq_length: int,
    tps: tuple[int, ...] = (2, 4, 8),
    precision: str = "bf16",
    tolerance: float = TP_SCALING_TOLERANCE,
) -> TPScaling:
    """The check for each TP in `tps` that divides the model's heads and fits in one NVLink domain."""
    tp1, _ = _gemm_ops_ms(model, gpu, 1, tokens, seq_length, precision, False)
    points = []
    for n in sorted(tps):
        if n <= 1 or n > gpu.gpus_per_node or model.num_attention_heads % n or model.num_query_groups % n:
            continue
        options = [
            (*_gemm_ops_ms(model, gpu, n, tokens, seq_length, precision, ub), setup)
            for ub, setup in ((False, "nccl"), (True, "userbuffers"))
        ]
        t, comm, setup = min(options)
        points.append(scaling_point(tp1, n, t, setup, comm, tolerance))
    return TPScaling(model.name, gpu.name, tokens, tp1, tuple(points), tolerance)
