"""The host's blocking waits on the GPU in one trace, and what the GPU was running while the host waited.

A host thread blocked in `cudaStreamSynchronize` / `cudaEventSynchronize` (a `.item()`, a pageable copy, an event's
`synchronize()`) issues nothing until the GPU reaches the point it waits for. Where the host paces a step, every
such wait is time the GPU's queue drains and nothing new is queued behind it. For each wait: its call, duration,
the innermost CPU op around it on the same thread (`aten::item`, `aten::copy_`, or none for a Python-level event
sync), and the GPU work that ran during it: kernel time per kernel name (all streams), the longest first.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from .errors import TraceError
from .model import LAUNCH_KINDS, Trace


@dataclass(frozen=True)
class HostWait:
    """One blocking call: `start_ms` from the first GPU event of the trace."""

    call: str
    start_ms: float
    duration_ms: float
    inside: str | None
    gpu_during_ms: tuple[tuple[str, float], ...]  # (kernel name, ms of it inside the wait), longest first

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class HostWaits:
    """Every wait of at least `min_ms`, in time order, and the total of all blocking calls (any length)."""

    path: str
    min_ms: float
    total_ms: float
    calls: int
    waits: tuple[HostWait, ...]

    def to_dict(self) -> dict:
        return asdict(self)


def _innermost_op(trace: Trace, sync) -> str | None:
    inside = [
        r for r in trace.cpu_ranges
        if r.tid == sync.tid and r.pid == sync.pid and r.ts_us <= sync.ts_us and r.end_us >= sync.end_us
        and r.kind == "cpu_op"
    ]  # fmt: skip
    return min(inside, key=lambda r: r.dur_us).name if inside else None


def _gpu_during(trace: Trace, start_us: float, end_us: float, top: int) -> tuple[tuple[str, float], ...]:
    per_name: dict[str, float] = {}
    for e in trace.gpu_events:
        if e.ts_us >= end_us:
            break
        inside = min(end_us, e.end_us) - max(start_us, e.ts_us)
        if inside > 0 and e.kind == "kernel":
            per_name[e.name] = per_name.get(e.name, 0.0) + inside / 1e3
    return tuple(sorted(per_name.items(), key=lambda kv: -kv[1])[:top])


def host_waits(trace: Trace, min_ms: float = 1.0, top: int = 3) -> HostWaits:
    """The host's blocking waits of `trace` of at least `min_ms`, each with the `top` kernels that ran during it.
    Raises `TraceError` for a trace with no CUDA runtime or driver call at all: it cannot show a wait."""
    if not any(trace.event_counts.get(kind) for kind in LAUNCH_KINDS):
        raise TraceError(
            trace.path, "no CUDA runtime or driver calls: profile with ProfilerActivity.CUDA to see the host's waits"
        )
    origin = trace.gpu_events[0].ts_us if trace.gpu_events else 0.0
    waits = tuple(
        HostWait(
            s.name,
            (s.ts_us - origin) / 1e3,
            s.dur_us / 1e3,
            _innermost_op(trace, s),
            _gpu_during(trace, s.ts_us, s.end_us, top),
        )
        for s in trace.host_syncs
        if s.dur_us >= min_ms * 1e3
    )
    total = sum(s.dur_us for s in trace.host_syncs) / 1e3
    return HostWaits(trace.path, min_ms, total, len(trace.host_syncs), waits)
