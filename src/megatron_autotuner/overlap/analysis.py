"""Analysis of a tuning run from its records and traces (no torch; runs alone on an output directory).

Per candidate (one slot `op.fwd|op.bwd` of one round), from the round's CUDA-event timing and, when
the round was profiled, the rank-0 trace range of that slot (trace package: classification, ranges):
- `e2e_ms`: median CUDA-event time of the range (forward, or backward = dgrad + wgrad);
- `gemm_us` = |union of GEMM kernels|, `comm_us` = |union of comm kernels| (NCCL, userbuffers,
  symm-mem, peer copies), `overlap_us` = |GEMM ∩ comm|, `overlap_ratio` = overlap / min(gemm, comm)
  (0 when either is 0), `exposed_comm_us` = |comm − compute| (comm hidden by no kernel at all).
Best candidate per slot: lowest mean e2e over its measurements; candidates within `tie_frac` of the
best are tied and the highest overlap ratio wins.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..trace import COMM_CATEGORIES, COMPUTE_CATEGORIES, TraceError, classify_trace, find_ranges, load_trace
from ..trace import intervals as iv
from .jobs import all_round_records
from .rules import cfg_from_dict, te_default

SLOT_NAMES = {"fwd": ("fprop",), "bwd": ("dgrad", "wgrad")}


@dataclass(frozen=True)
class RangeMetrics:
    """GEMM / communication overlap inside one range of one trace (µs)."""

    gemm_us: float
    compute_us: float
    comm_us: float
    overlap_us: float
    exposed_comm_us: float
    overlap_ratio: float
    span_us: float
    gemm_intervals: tuple[tuple[float, float], ...] = ()  # relative to the range's first GPU event
    comm_intervals: tuple[tuple[float, float], ...] = ()

    def to_dict(self, intervals: bool = False) -> dict[str, Any]:
        d = {
            k: getattr(self, k)
            for k in ("gemm_us", "compute_us", "comm_us", "overlap_us", "exposed_comm_us", "overlap_ratio", "span_us")
        }
        if intervals:
            d["gemm_intervals"] = [list(x) for x in self.gemm_intervals]
            d["comm_intervals"] = [list(x) for x in self.comm_intervals]
        return d


def range_metrics(trace, range_name: str, instance: int | None = None) -> RangeMetrics:
    """Metrics of range `range_name` (all instances summed, or only instance `instance`)."""
    classes = classify_trace(trace)
    instances = find_ranges(trace, range_name)
    if instance is not None:
        instances = [instances[instance]]
    gemm_t = comp_t = comm_t = ov = exp = span = 0.0
    g_rel: list[tuple[float, float]] = []
    c_rel: list[tuple[float, float]] = []
    for inst in instances:
        by_dev: dict[int, dict[str, list]] = defaultdict(lambda: {"gemm": [], "compute": [], "comm": []})
        for idx, s, e in inst.spans:
            cat = classes[idx].category
            d = by_dev[trace.gpu_events[idx].device]
            if cat == "gemm":
                d["gemm"].append((s, e))
            if cat in COMPUTE_CATEGORIES:
                d["compute"].append((s, e))
            elif cat in COMM_CATEGORIES:
                d["comm"].append((s, e))
        for d in by_dev.values():
            g, c, m = iv.union(d["gemm"]), iv.union(d["compute"]), iv.union(d["comm"])
            gemm_t += iv.length(g)
            comp_t += iv.length(c)
            comm_t += iv.length(m)
            ov += iv.length(iv.intersection(g, m))
            exp += iv.length(iv.difference(m, c))
            allu = iv.union(g + c + m)
            if allu:
                t0 = allu[0][0]
                span += allu[-1][1] - t0
                if not g_rel and not c_rel:
                    g_rel = [(a - t0, b - t0) for a, b in g]
                    c_rel = [(a - t0, b - t0) for a, b in m]
    den = min(gemm_t, comm_t)
    return RangeMetrics(gemm_t, comp_t, comm_t, ov, exp, ov / den if den > 0 else 0.0, span, tuple(g_rel), tuple(c_rel))


@dataclass
class Candidate:
    """One slot variant of one (model, tp, backend), with all its measurements."""

    model: str
    tp: int
    backend: str
    slot: str  # op.fwd | op.bwd
    key: str  # variant label ("nccl", "symm_mem", or the ub labels of the slot's names)
    cfg: dict[str, Any] | None
    labels: set[str] = field(default_factory=set)
    e2e_ms: list[float] = field(default_factory=list)
    metrics: list[RangeMetrics] = field(default_factory=list)
    round_ids: list[str] = field(default_factory=list)

    @property
    def mean_ms(self) -> float:
        return statistics.fmean(self.e2e_ms) if self.e2e_ms else math.inf

    @property
    def overlap_ratio(self) -> float:
        return statistics.fmean(m.overlap_ratio for m in self.metrics) if self.metrics else 0.0

    def metric_mean(self, name: str) -> float | None:
        return statistics.fmean(getattr(m, name) for m in self.metrics) if self.metrics else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "tp": self.tp,
            "backend": self.backend,
            "slot": self.slot,
            "variant": self.key,
            "cfg": self.cfg,
            "labels": sorted(self.labels),
            "e2e_ms": self.mean_ms if self.e2e_ms else None,
            "e2e_ms_samples": self.e2e_ms,
            "measurements": len(self.e2e_ms),
            "round_ids": self.round_ids,
            **{k: self.metric_mean(k) for k in ("gemm_us", "comm_us", "overlap_us", "exposed_comm_us")},
            "overlap_ratio": self.overlap_ratio if self.metrics else None,
        }


def _slot_variant(rec: dict[str, Any], op: str, phase: str) -> tuple[str, dict | None]:
    label = rec.get("label")
    if label in ("nccl", "symm_mem", "no_tp"):
        return label, None
    names = [f"{op}_{p}" for p in SLOT_NAMES[phase]]
    raw = rec.get("cfg") or {}
    cfg = cfg_from_dict({n: raw[n] for n in names if n in raw})
    tp = rec["tp"]
    variants = {n: cfg.get(n, te_default(n, tp)) for n in names}
    return " | ".join(variants[n].label() for n in names), {n: variants[n].to_cfg() for n in names}


@dataclass
class RunAnalysis:
    out_dir: Path
    records: list[dict[str, Any]]
    candidates: list[Candidate]
    failures: list[dict[str, Any]]
    searches: list[dict[str, Any]]
    trace_errors: list[str]

    def group(self, model: str, tp: int, backend: str, slot: str) -> list[Candidate]:
        return [c for c in self.candidates if (c.model, c.tp, c.backend, c.slot) == (model, tp, backend, slot)]

    def by_label(self, model: str, tp: int, slot: str, label: str) -> Candidate | None:
        """The candidate measured under a round label (nccl / te_default / tuned / symm_mem / no_tp)."""
        for c in self.candidates:
            if (c.model, c.tp, c.slot) == (model, tp, slot) and label in c.labels:
                if (
                    label == "nccl"
                    and c.backend != "te"
                    and any(x.backend == "te" and "nccl" in x.labels for x in self.group(model, tp, "te", slot))
                ):
                    continue
                return c
        return None

    def model_tps(self) -> list[tuple[str, int]]:
        return sorted({(c.model, c.tp) for c in self.candidates})

    def slots(self, model: str) -> list[str]:
        order = {"qkv": 0, "proj": 1, "fc1": 2, "fc2": 3}
        found = {c.slot for c in self.candidates if c.model == model}
        return sorted(found, key=lambda s: (order.get(s.split(".")[0], 9), s.split(".")[-1] != "fwd", s))


def best_candidate(cands: list[Candidate], tie_frac: float = 0.005, min_samples: int = 2) -> Candidate | None:
    """Lowest mean e2e; within `tie_frac` of it, the highest overlap ratio (then the lowest time).

    Only candidates measured at least `min_samples` times (TE default, verified search winners) compete when
    there are any: on 2x H200 single samples of one config spread 3-12%, as much as the gains tuned for, and
    a one-sample win would put an unverified setting in the yaml."""
    ok = [c for c in cands if c.e2e_ms and c.cfg is not None]
    repeated = [c for c in ok if len(c.e2e_ms) >= min_samples]
    ok = repeated or ok
    if not ok:
        return None
    fastest = min(c.mean_ms for c in ok)
    tied = [c for c in ok if c.mean_ms <= fastest * (1 + tie_frac)]
    return max(tied, key=lambda c: (c.overlap_ratio, -c.mean_ms))


def analyze_run(out_dir: str | Path, with_traces: bool = True) -> RunAnalysis:
    """Read every record under `out_dir` and build the candidates (traces analysed when present)."""
    out = Path(out_dir)
    recs = list(all_round_records(out).values())
    rounds = [r for r in recs if r.get("kind", "round") == "round" and r.get("model")]
    failures = [r for r in recs if r.get("status") == "failed"]
    searches = [r for r in recs if r.get("kind") == "search"]
    cands: dict[tuple, Candidate] = {}
    trace_errors: list[str] = []
    loaded: dict[str, Any] = {}
    for r in rounds:
        if r.get("status") != "ok" or not r.get("ops"):
            continue
        trace = None
        if with_traces and r.get("trace"):
            path = out / r["trace"]
            try:
                trace = loaded.get(r["trace"]) or load_trace(path)
                loaded = {r["trace"]: trace}  # keep one trace in memory
            except (OSError, TraceError) as exc:
                trace_errors.append(f"{r['trace']}: {exc}")
        for op, m in r["ops"].items():
            for phase in ("fwd", "bwd"):
                key, cfg = _slot_variant(r, op, phase)
                ident = (r["model"], r["tp"], r["backend"], f"{op}.{phase}", key)
                c = cands.get(ident)
                if c is None:
                    c = cands[ident] = Candidate(r["model"], r["tp"], r["backend"], f"{op}.{phase}", key, cfg)
                c.labels.add(r["label"])
                c.round_ids.append(r["case_id"])
                c.e2e_ms.append(float(m[f"{phase}_ms"]["median"]))
                if trace is not None:
                    try:
                        c.metrics.append(range_metrics(trace, f"{op}.{phase}"))
                    except TraceError as exc:
                        trace_errors.append(str(exc))
    return RunAnalysis(out, recs, list(cands.values()), failures, searches, trace_errors)


# ---- TE layer traces (e.g. tests/fixtures/traces): map TE module ranges to the four GEMMs ------------

TE_LAYER_RANGES = {
    # forward runs qkv, proj, fc1, fc2; backward runs them in reverse
    "qkv.fwd": ("_LayerNormLinear", 0),
    "fc1.fwd": ("_LayerNormLinear", 1),
    "proj.fwd": ("_Linear", 0),
    "fc2.fwd": ("_Linear", 1),
    "fc1.bwd": ("_LayerNormLinearBackward", 0),
    "qkv.bwd": ("_LayerNormLinearBackward", 1),
    "fc2.bwd": ("_LinearBackward", 0),
    "proj.bwd": ("_LinearBackward", 1),
}


def te_layer_metrics(trace_path: str | Path) -> dict[str, RangeMetrics]:
    """Per-slot metrics of one step of a megatron-core TE TransformerLayer trace (module ranges by order)."""
    trace = load_trace(trace_path)
    return {slot: range_metrics(trace, name, idx) for slot, (name, idx) in TE_LAYER_RANGES.items()}
