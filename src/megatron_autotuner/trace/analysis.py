"""Classification of a loaded trace, busy/idle time, communication/computation overlap, range attribution.

Definitions (per device; a trace with several devices sums device times):
- compute = union of gemm, attention, norm, elementwise and other (unmatched) events;
  communication = union of comm (NCCL, userbuffers, symm-mem kernels) and peer_copy events;
  memcpy (DtoD, HtoD, DtoH) and memset are neither.
- `overlap_us = |comm ∩ compute|`, `exposed_comm_us = |comm − compute| = comm_us − overlap_us`,
  `overlap_ratio = overlap_us / min(comm_us, compute_us)` (0 when either is 0),
  `comm_overlap_fraction = overlap_us / comm_us` (Holistic Trace Analysis' ratio).
- `busy_us = |union of all GPU events|`, `span_us = last end − first start`, `idle_us = span − busy`.
Unions count time once however many streams are busy (userbuffers runs a dozen).

Ranges: a CPU range (`cpu_op` or `user_annotation`, e.g. a record_function) owns the GPU work
launched from its thread while it was open (runtime/driver calls inside it, matched to GPU
events by correlation id); a `user_annotation` that launched nothing itself (a record_function
around `.backward()`, whose kernels autograd launches from its own thread) owns what the other
threads of its process launched inside its window (source `cpu_window`); a matching range
nested in another matching range on the same thread is not a second instance. A
`gpu_user_annotation` owns the GPU events on its stream within its time window, clipped to
the window (annotations sharing an External id form one instance).
Statistics of a range are computed per instance over the events it owns and summed; `span_us`
is then the sum of each instance's end-to-end GPU time.
"""

from __future__ import annotations

import bisect
import difflib
import re
import weakref
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from .. import SCHEMA_VERSION, __version__
from ..errors import ConfigError
from . import intervals as iv
from .classify import (
    CATEGORIES,
    COMM_CATEGORIES,
    COMPUTE_CATEGORIES,
    PEER_COPY,
    Classification,
    Classifier,
    default_classifier,
)
from .errors import TraceError
from .model import CpuRange, Trace

RANGE_MATCHES = ("exact", "contains", "regex")
RANGE_SOURCES = ("auto", "cpu", "gpu")

_class_cache: weakref.WeakKeyDictionary[Trace, tuple[Classifier, tuple[Classification, ...]]] = (
    weakref.WeakKeyDictionary()
)


# --------------------------------------------------------------------------------------------
# classification of a whole trace


def _launch_context(trace: Trace, classifier: Classifier, indices: list[int]) -> dict[int, list[str]]:
    """Names of the CPU ranges (matching any context rule) open at the launch of each event."""
    regexes = [r._context_regex for r in classifier.rules if r._context_regex is not None]
    by_thread: dict[tuple[Any, Any], list[CpuRange]] = defaultdict(list)
    for r in trace.cpu_ranges:  # sorted by start
        if any(rx.search(r.name) for rx in regexes):
            by_thread[(r.pid, r.tid)].append(r)
    index = {key: ([r.ts_us for r in rs], rs, max(r.dur_us for r in rs)) for key, rs in by_thread.items()}
    out: dict[int, list[str]] = {}
    for i in indices:
        launch = trace.launches.get(trace.gpu_events[i].correlation)
        if launch is None or (launch.pid, launch.tid) not in index:
            continue
        starts, ranges, max_dur = index[(launch.pid, launch.tid)]
        t = launch.ts_us
        lo = bisect.bisect_left(starts, t - max_dur)
        hi = bisect.bisect_right(starts, t)
        names = [r.name for r in ranges[lo:hi] if r.end_us >= t]
        if names:
            out[i] = names
    return out


def classify_trace(trace: Trace, classifier: Classifier | None = None) -> tuple[Classification, ...]:
    """Classification of every GPU event of `trace` (same order as `trace.gpu_events`); cached per trace."""
    classifier = classifier or default_classifier()
    cached = _class_cache.get(trace)
    if cached is not None and cached[0] is classifier:
        return cached[1]
    classes = [classifier.classify(e.name) for e in trace.gpu_events]
    needing = [i for i, e in enumerate(trace.gpu_events) if classifier.needs_context(e.name)]
    if needing:
        for i, names in _launch_context(trace, classifier, needing).items():
            classes[i] = classifier.classify(trace.gpu_events[i].name, names)
    result = tuple(classes)
    _class_cache[trace] = (classifier, result)
    return result


def event_intervals(
    trace: Trace,
    *,
    categories: Iterable[str] | str | None = None,
    device: int | None = None,
    stream: int | None = None,
    classifier: Classifier | None = None,
) -> list[tuple[float, float]]:
    """Union of the GPU events of the given categories (e.g. `COMM_CATEGORIES`), device and stream.

    None means any; combine results with `intervals.intersection` / `difference` / `length`.
    """
    wanted = {categories} if isinstance(categories, str) else set(categories) if categories is not None else None
    classes = classify_trace(trace, classifier) if wanted is not None else None
    out = []
    for i, e in enumerate(trace.gpu_events):
        if device is not None and e.device != device:
            continue
        if stream is not None and e.stream != stream:
            continue
        if classes is not None and classes[i].category not in wanted:
            continue
        out.append((e.ts_us, e.ts_us + e.dur_us))
    return iv.union(out)


# --------------------------------------------------------------------------------------------
# result types


@dataclass(frozen=True)
class CommBreakdown:
    """Communication of one library or collective type: union time, overlap with compute, exposed time."""

    name: str
    count: int
    kernel_us: float  # Σ durations
    comm_us: float  # |union|
    overlap_us: float  # |union ∩ compute|
    exposed_us: float  # |union − compute|

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "count": self.count,
            "kernel_us": self.kernel_us,
            "comm_us": self.comm_us,
            "overlap_us": self.overlap_us,
            "exposed_us": self.exposed_us,
        }


@dataclass(frozen=True)
class OverlapStats:
    """Communication / computation overlap of a trace or of the instances of a named range."""

    range_name: str | None
    instances: int
    gpu_events: int
    span_us: float
    busy_us: float
    idle_us: float
    compute_us: float
    comm_us: float
    overlap_us: float
    exposed_comm_us: float
    overlap_ratio: float
    comm_overlap_fraction: float
    category_us: dict[str, float]
    by_library: tuple[CommBreakdown, ...]
    by_collective: tuple[CommBreakdown, ...]
    comm_overlap_any_compute_us: float | None = None
    source: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "range_name": self.range_name,
            "source": self.source,
            "instances": self.instances,
            "gpu_events": self.gpu_events,
            "span_us": self.span_us,
            "busy_us": self.busy_us,
            "idle_us": self.idle_us,
            "compute_us": self.compute_us,
            "comm_us": self.comm_us,
            "overlap_us": self.overlap_us,
            "exposed_comm_us": self.exposed_comm_us,
            "overlap_ratio": self.overlap_ratio,
            "comm_overlap_fraction": self.comm_overlap_fraction,
            "comm_overlap_any_compute_us": self.comm_overlap_any_compute_us,
            "category_us": dict(self.category_us),
            "by_library": [b.to_dict() for b in self.by_library],
            "by_collective": [b.to_dict() for b in self.by_collective],
        }


@dataclass(frozen=True)
class RangeInstance:
    """One occurrence of a named range and the GPU time it owns: `spans` = (event index, start_us, end_us)."""

    name: str
    source: str  # cpu | gpu
    ts_us: float
    dur_us: float
    spans: tuple[tuple[int, float, float], ...]

    @property
    def gpu_start_us(self) -> float | None:
        return min((s for _, s, _ in self.spans), default=None)

    @property
    def gpu_end_us(self) -> float | None:
        return max((e for _, _, e in self.spans), default=None)


@dataclass(frozen=True)
class CategoryStats:
    category: str
    count: int
    kernel_us: float  # Σ durations
    wall_us: float  # |union|

    def to_dict(self) -> dict[str, Any]:
        return {"category": self.category, "count": self.count, "kernel_us": self.kernel_us, "wall_us": self.wall_us}


@dataclass(frozen=True)
class StreamStats:
    device: int
    stream: int
    count: int
    kernel_us: float
    busy_us: float
    category_us: dict[str, float]

    def to_dict(self) -> dict[str, Any]:
        return {
            "device": self.device,
            "stream": self.stream,
            "count": self.count,
            "kernel_us": self.kernel_us,
            "busy_us": self.busy_us,
            "category_us": dict(self.category_us),
        }


@dataclass(frozen=True)
class KernelStats:
    name: str
    category: str
    library: str | None
    collective: str | None
    reason: str
    count: int
    total_us: float
    mean_us: float
    max_us: float

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "category": self.category,
            "library": self.library,
            "collective": self.collective,
            "reason": self.reason,
            "count": self.count,
            "total_us": self.total_us,
            "mean_us": self.mean_us,
            "max_us": self.max_us,
        }


@dataclass(frozen=True)
class TraceSummary:
    """What `summarize` reports for one trace; `to_dict()` is the JSON written by `mat trace summary --json`."""

    path: str
    rank: int | None
    world_size: int | None
    device_names: tuple[str, ...]
    gpu_event_count: int
    cpu_range_count: int
    skipped_events: int
    event_counts: dict[str, int]
    categories: tuple[CategoryStats, ...]
    streams: tuple[StreamStats, ...]
    top_kernels: tuple[KernelStats, ...]
    unmatched_kernels: tuple[str, ...]
    overlap: OverlapStats
    metadata: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema_version": SCHEMA_VERSION,
            "tool_version": __version__,
            "path": self.path,
            "rank": self.rank,
            "world_size": self.world_size,
            "device_names": list(self.device_names),
            "gpu_event_count": self.gpu_event_count,
            "cpu_range_count": self.cpu_range_count,
            "skipped_events": self.skipped_events,
            "event_counts": dict(self.event_counts),
            "categories": [c.to_dict() for c in self.categories],
            "streams": [s.to_dict() for s in self.streams],
            "top_kernels": [k.to_dict() for k in self.top_kernels],
            "unmatched_kernels": list(self.unmatched_kernels),
            "overlap": self.overlap.to_dict(),
            "metadata": self.metadata,
        }


# --------------------------------------------------------------------------------------------
# overlap


def _ratio(num: float, den: float) -> float:
    return num / den if den > 0 else 0.0


def _overlap_stats(
    trace: Trace,
    classes: Sequence[Classification],
    instances: Sequence[Iterable[tuple[int, float, float]]],
    range_name: str | None,
    source: str | None = None,
) -> OverlapStats:
    events = trace.gpu_events
    span = busy = compute = comm = overlap = exposed = 0.0
    any_overlap = 0.0
    n_events = 0
    cat_us: dict[str, float] = defaultdict(float)
    lib_acc: dict[str, list[float]] = defaultdict(lambda: [0, 0.0, 0.0, 0.0, 0.0])
    coll_acc: dict[str, list[float]] = defaultdict(lambda: [0, 0.0, 0.0, 0.0, 0.0])
    device_compute: dict[int, list[tuple[float, float]]] | None = None
    if range_name is not None:  # compute of the whole trace, to tell what hid the range's comm
        all_compute: dict[int, list[tuple[float, float]]] = defaultdict(list)
        for e, c in zip(events, classes, strict=True):
            if c.category in COMPUTE_CATEGORIES:
                all_compute[e.device].append((e.ts_us, e.ts_us + e.dur_us))
        device_compute = {d: iv.union(v) for d, v in all_compute.items()}

    for spans in instances:
        per_dev: dict[int, dict[str, Any]] = {}
        for idx, s, e in spans:
            ev, cl = events[idx], classes[idx]
            d = per_dev.get(ev.device)
            if d is None:
                d = per_dev[ev.device] = {
                    "all": [],
                    "comm": [],
                    "compute": [],
                    "cat": defaultdict(list),
                    "lib": defaultdict(list),
                    "coll": defaultdict(list),
                }
            n_events += 1
            d["all"].append((s, e))
            d["cat"][cl.category].append((s, e))
            if cl.category in COMM_CATEGORIES:
                d["comm"].append((s, e))
                d["lib"][cl.library or "unknown"].append((s, e))
                d["coll"][cl.collective or (PEER_COPY if cl.category == PEER_COPY else "unknown")].append((s, e))
            elif cl.category in COMPUTE_CATEGORIES:
                d["compute"].append((s, e))
        for dev, d in per_dev.items():
            all_u = iv.union(d["all"])
            comm_u = iv.union(d["comm"])
            comp_u = iv.union(d["compute"])
            span += all_u[-1][1] - all_u[0][0] if all_u else 0.0
            busy += iv._length_sorted(all_u)
            compute += iv._length_sorted(comp_u)
            comm += iv._length_sorted(comm_u)
            overlap += iv._length_sorted(iv._intersection_sorted(comm_u, comp_u))
            exposed += iv._length_sorted(iv._difference_sorted(comm_u, comp_u))
            if device_compute is not None:
                any_overlap += iv._length_sorted(iv._intersection_sorted(comm_u, device_compute.get(dev, [])))
            for cat, lst in d["cat"].items():
                cat_us[cat] += iv.length(lst)
            for acc, groups in ((lib_acc, d["lib"]), (coll_acc, d["coll"])):
                for key, lst in groups.items():
                    u = iv.union(lst)
                    a = acc[key]
                    a[0] += len(lst)
                    a[1] += sum(e - s for s, e in lst)
                    a[2] += iv._length_sorted(u)
                    a[3] += iv._length_sorted(iv._intersection_sorted(u, comp_u))
                    a[4] += iv._length_sorted(iv._difference_sorted(u, comp_u))

    def breakdown(acc: dict[str, list[float]]) -> tuple[CommBreakdown, ...]:
        rows = [CommBreakdown(k, int(a[0]), a[1], a[2], a[3], a[4]) for k, a in acc.items()]
        return tuple(sorted(rows, key=lambda b: (-b.comm_us, b.name)))

    return OverlapStats(
        range_name=range_name,
        instances=len(instances),
        gpu_events=n_events,
        span_us=span,
        busy_us=busy,
        idle_us=max(span - busy, 0.0),
        compute_us=compute,
        comm_us=comm,
        overlap_us=overlap,
        exposed_comm_us=exposed,
        overlap_ratio=_ratio(overlap, min(comm, compute)),
        comm_overlap_fraction=_ratio(overlap, comm),
        category_us={c: cat_us[c] for c in CATEGORIES if c in cat_us},
        by_library=breakdown(lib_acc),
        by_collective=breakdown(coll_acc),
        comm_overlap_any_compute_us=any_overlap if device_compute is not None else None,
        source=source,
    )


def _all_spans(trace: Trace) -> list[tuple[int, float, float]]:
    return [(i, e.ts_us, e.ts_us + e.dur_us) for i, e in enumerate(trace.gpu_events)]


def overlap(
    trace: Trace,
    range_name: str | None = None,
    *,
    match: str = "exact",
    source: str = "auto",
    classifier: Classifier | None = None,
) -> OverlapStats:
    """Overlap of communication with computation for the whole trace or inside a named range.

    See the module docstring for the formulas and how ranges own GPU work; `match` is
    exact | contains | regex, `source` is auto (CPU ranges if any match, else GPU annotations) | cpu | gpu.
    For a range, `comm_overlap_any_compute_us` also counts compute launched outside the range.
    """
    classes = classify_trace(trace, classifier)
    if range_name is None:
        return _overlap_stats(trace, classes, [_all_spans(trace)], None)
    instances = find_ranges(trace, range_name, match=match, source=source)
    return _overlap_stats(trace, classes, [inst.spans for inst in instances], range_name, source=instances[0].source)


# --------------------------------------------------------------------------------------------
# ranges


def _matcher(name: str, match: str):
    if match == "exact":
        return lambda n: n == name
    if match == "contains":
        return lambda n: name in n
    if match == "regex":
        try:
            rx = re.compile(name)
        except re.error as exc:
            raise ConfigError("range", f"invalid regular expression {name!r}: {exc}") from None
        return lambda n: rx.search(n) is not None
    raise ValueError(f"match must be one of {RANGE_MATCHES}, got {match!r}")


@dataclass
class _RangeIndex:
    launches_by_thread: dict[tuple[Any, Any], tuple[list[float], list[int]]]
    events_by_corr: dict[int, list[int]]
    stream_events: dict[tuple[int, int], tuple[list[float], list[int], float]]


_index_cache: weakref.WeakKeyDictionary[Trace, _RangeIndex] = weakref.WeakKeyDictionary()


def _range_index(trace: Trace) -> _RangeIndex:
    cached = _index_cache.get(trace)
    if cached is not None:
        return cached
    by_thread: dict[tuple[Any, Any], list[tuple[float, int]]] = defaultdict(list)
    for corr, launch in trace.launches.items():
        by_thread[(launch.pid, launch.tid)].append((launch.ts_us, corr))
    launches_by_thread = {}
    for key, items in by_thread.items():
        items.sort()
        launches_by_thread[key] = ([t for t, _ in items], [c for _, c in items])
    events_by_corr: dict[int, list[int]] = defaultdict(list)
    per_stream: dict[tuple[int, int], list[int]] = defaultdict(list)
    for i, e in enumerate(trace.gpu_events):
        if e.correlation >= 0:
            events_by_corr[e.correlation].append(i)
        per_stream[(e.device, e.stream)].append(i)
    stream_events = {}
    for key, idxs in per_stream.items():  # gpu_events are sorted by start already
        starts = [trace.gpu_events[i].ts_us for i in idxs]
        max_dur = max(trace.gpu_events[i].dur_us for i in idxs)
        stream_events[key] = (starts, idxs, max_dur)
    index = _RangeIndex(launches_by_thread, dict(events_by_corr), stream_events)
    _index_cache[trace] = index
    return index


def _cpu_instances(trace: Trace, accept) -> list[RangeInstance]:
    index = _range_index(trace)
    events = trace.gpu_events
    open_until: dict[tuple[Any, Any], float] = {}
    out = []
    for r in trace.cpu_ranges:  # sorted by (start, -duration): outer ranges come first
        if not accept(r.name):
            continue
        key = (r.pid, r.tid)
        if r.ts_us < open_until.get(key, float("-inf")):
            continue  # nested inside a matching range on the same thread: its work is already counted
        open_until[key] = r.end_us
        spans = _launched_in_window(index, events, [(r.pid, r.tid)], r.ts_us, r.end_us)
        source = "cpu"
        if not spans and r.kind == "user_annotation":
            # autograd runs backward on its own device thread while the caller's `.backward()` inside
            # the range blocks: the range owns what other threads of its process launched meanwhile.
            others = [key for key in index.launches_by_thread if key[0] == r.pid and key != (r.pid, r.tid)]
            spans = _launched_in_window(index, events, others, r.ts_us, r.end_us)
            source = "cpu_window" if spans else "cpu"
        out.append(RangeInstance(r.name, source, r.ts_us, r.dur_us, tuple(spans)))
    return out


def _launched_in_window(index, events, threads, start_us: float, end_us: float) -> list[tuple[int, float, float]]:
    """GPU events launched by `threads` between start_us and end_us, as (index, start, end) sorted by start."""
    spans = []
    for key in threads:
        launches = index.launches_by_thread.get(key)
        if launches is None:
            continue
        times, corrs = launches
        lo = bisect.bisect_left(times, start_us)
        hi = bisect.bisect_right(times, end_us)
        for corr in corrs[lo:hi]:
            for i in index.events_by_corr.get(corr, ()):
                spans.append((i, events[i].ts_us, events[i].end_us))
    spans.sort(key=lambda s: (s[1], s[0]))
    return spans


def _gpu_instances(trace: Trace, accept) -> list[RangeInstance]:
    index = _range_index(trace)
    events = trace.gpu_events
    groups: dict[Any, list] = {}
    for k, g in enumerate(trace.gpu_ranges):
        if not accept(g.name):
            continue
        key = (g.name, g.external_id) if g.external_id >= 0 else (g.name, "#", k)
        groups.setdefault(key, []).append(g)
    out = []
    for windows in groups.values():
        seen: dict[int, tuple[float, float]] = {}
        for w in windows:
            stream = index.stream_events.get((w.device, w.stream))
            if stream is None:
                continue
            starts, idxs, max_dur = stream
            lo = bisect.bisect_left(starts, w.ts_us - max_dur)
            hi = bisect.bisect_left(starts, w.end_us)
            for i in idxs[lo:hi]:
                s, e = max(events[i].ts_us, w.ts_us), min(events[i].end_us, w.end_us)
                if e > s or (e == s and events[i].dur_us == 0 and w.ts_us <= s <= w.end_us):
                    prev = seen.get(i)
                    seen[i] = (min(prev[0], s), max(prev[1], e)) if prev else (s, e)
        spans = tuple(sorted(((i, s, e) for i, (s, e) in seen.items()), key=lambda x: (x[1], x[0])))
        start = min(w.ts_us for w in windows)
        end = max(w.end_us for w in windows)
        out.append(RangeInstance(windows[0].name, "gpu", start, end - start, spans))
    out.sort(key=lambda r: r.ts_us)
    return out


def find_ranges(trace: Trace, name: str, *, match: str = "exact", source: str = "auto") -> list[RangeInstance]:
    """Instances of the range `name` with the GPU time each owns (see module docstring).

    Raises `TraceError` naming the trace file when no range matches.
    """
    if source not in RANGE_SOURCES:
        raise ValueError(f"source must be one of {RANGE_SOURCES}, got {source!r}")
    accept = _matcher(name, match)
    found: list[RangeInstance] = []
    if source in ("auto", "cpu"):
        found = _cpu_instances(trace, accept)
    if not found and source in ("auto", "gpu"):
        found = _gpu_instances(trace, accept)
    if not found:
        kinds = {"auto": "cpu_op, user_annotation or gpu_user_annotation", "cpu": "cpu_op or user_annotation"}
        known = {r.name for r in trace.cpu_ranges} | {g.name for g in trace.gpu_ranges}
        close = difflib.get_close_matches(name, sorted(known), n=3, cutoff=0.6)
        hint = f"; close names: {', '.join(repr(c) for c in close)}" if close else ""
        raise TraceError(
            trace.path, f"no {kinds.get(source, 'gpu_user_annotation')} range matches {name!r} ({match} match){hint}"
        )
    return found


# --------------------------------------------------------------------------------------------
# summary


def summarize(trace: Trace, top: int | None = 20, classifier: Classifier | None = None) -> TraceSummary:
    """Time per category, per stream, top kernels by total time, and the overlap of the whole trace."""
    classes = classify_trace(trace, classifier)
    events = trace.gpu_events
    cat_lists: dict[tuple[int, str], list[tuple[float, float]]] = defaultdict(list)
    stream_acc: dict[tuple[int, int], dict[str, Any]] = {}
    kernel_acc: dict[str, list[Any]] = {}
    for e, c in zip(events, classes, strict=True):
        end = e.ts_us + e.dur_us
        cat_lists[(e.device, c.category)].append((e.ts_us, end))
        st = stream_acc.get((e.device, e.stream))
        if st is None:
            st = stream_acc[(e.device, e.stream)] = {"n": 0, "sum": 0.0, "iv": [], "cat": defaultdict(float)}
        st["n"] += 1
        st["sum"] += e.dur_us
        st["iv"].append((e.ts_us, end))
        st["cat"][c.category] += e.dur_us
        k = kernel_acc.get(e.name)
        if k is None:
            kernel_acc[e.name] = [c, 1, e.dur_us, e.dur_us]
        else:
            k[1] += 1
            k[2] += e.dur_us
            if e.dur_us > k[3]:
                k[3] = e.dur_us
    categories = []
    for cat in CATEGORIES:
        lists = [v for (dev, c), v in cat_lists.items() if c == cat]
        if not lists:
            continue
        count = sum(len(v) for v in lists)
        kernel_us = sum(e - s for v in lists for s, e in v)
        wall = sum(iv.length(v) for v in lists)
        categories.append(CategoryStats(cat, count, kernel_us, wall))
    streams = tuple(
        StreamStats(dev, stream, st["n"], st["sum"], iv.length(st["iv"]), dict(st["cat"]))
        for (dev, stream), st in sorted(stream_acc.items())
    )
    kernels = sorted(
        (
            KernelStats(name, c.category, c.library, c.collective, c.reason, n, total, total / n, mx)
            for name, (c, n, total, mx) in kernel_acc.items()
        ),
        key=lambda k: (-k.total_us, k.name),
    )
    unmatched = tuple(sorted({e.name for e, c in zip(events, classes, strict=True) if c.is_fallback}))
    meta = trace.metadata
    used_devices = set(trace.devices)
    return TraceSummary(
        path=trace.path,
        rank=meta.rank,
        world_size=meta.world_size,
        device_names=tuple(d.name for d in meta.devices if d.id in used_devices),
        gpu_event_count=len(events),
        cpu_range_count=len(trace.cpu_ranges),
        skipped_events=trace.skipped_events,
        event_counts=dict(sorted(trace.event_counts.items())),
        categories=tuple(categories),
        streams=streams,
        top_kernels=tuple(kernels if top is None else kernels[:top]),
        unmatched_kernels=unmatched,
        overlap=_overlap_stats(trace, classes, [_all_spans(trace)], None),
        metadata=meta.to_dict(),
    )
