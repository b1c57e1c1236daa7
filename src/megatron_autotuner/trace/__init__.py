"""Kineto / Chrome trace analysis: load, classify GPU work, interval math, overlap, ranges, merge, rank waits,
the host's waits on the GPU.

Pure Python (standard library only); no torch. Typical use::

    from megatron_autotuner.trace import load_trace, summarize, overlap, merge_traces
    t = load_trace("rank0.json.gz")
    summarize(t).to_dict()                      # time per category / stream, top kernels, overlap
    overlap(t, "_LayerNormLinear").overlap_us   # comm hidden under compute inside a range
    merge_traces(["rank0.json.gz", "rank1.json.gz"], "merged.json.gz", offsets_us={1: 3.5})
"""

from .analysis import (
    CategoryStats,
    CommBreakdown,
    KernelStats,
    OverlapStats,
    RangeInstance,
    StreamStats,
    TraceSummary,
    classify_trace,
    event_intervals,
    find_ranges,
    overlap,
    summarize,
)
from .classify import (
    CATEGORIES,
    COMM_CATEGORIES,
    COMPUTE_CATEGORIES,
    DEFAULT_RULES,
    Classification,
    Classifier,
    Rule,
    classify,
    collective_from_name,
    load_rules,
)
from .errors import TraceError
from .intervals import busy_time, clip, difference, idle_time, intersection, length, overlap_length, span, union
from .loader import load_trace
from .merge import MergedRank, MergeResult, merge_traces
from .model import CpuRange, GpuEvent, GpuRange, HostSync, Launch, Trace, TraceMetadata
from .syncs import HostWait, HostWaits, host_waits
from .waits import CollectiveWaits, collective_waits

__all__ = [
    "HostSync",
    "HostWait",
    "HostWaits",
    "host_waits",
    "CATEGORIES",
    "COMM_CATEGORIES",
    "COMPUTE_CATEGORIES",
    "DEFAULT_RULES",
    "CategoryStats",
    "Classification",
    "Classifier",
    "CollectiveWaits",
    "CommBreakdown",
    "CpuRange",
    "GpuEvent",
    "GpuRange",
    "KernelStats",
    "Launch",
    "MergeResult",
    "MergedRank",
    "OverlapStats",
    "RangeInstance",
    "Rule",
    "StreamStats",
    "Trace",
    "TraceError",
    "TraceMetadata",
    "TraceSummary",
    "busy_time",
    "classify",
    "classify_trace",
    "clip",
    "collective_waits",
    "collective_from_name",
    "difference",
    "event_intervals",
    "find_ranges",
    "idle_time",
    "intersection",
    "length",
    "load_rules",
    "load_trace",
    "merge_traces",
    "overlap",
    "overlap_length",
    "span",
    "summarize",
    "union",
]
