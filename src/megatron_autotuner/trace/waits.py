"""The wait across ranks at each collective, from one profiled step of every rank.

A collective's kernel starts on each rank when that rank's stream reaches it and ends on all ranks together, once
the last one has arrived and the data has moved. Matching the n-th call of a collective on every rank (the ranks of
an SPMD job issue the same collectives in the same order), the time all ranks were inside it is the transfer,

    transfer = min over ranks of end - max over ranks of start   (>= 0)

and each rank's kernel time beyond it is that rank's wait for the others. The traces are aligned as `merge_traces`
aligns them (`baseTimeNanoseconds`, plus optional per-rank offsets). Calls are grouped by collective kind
(`classify.collective_from_name`); a kind whose call counts differ between ranks is matched over the calls every
rank has, and says so.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass

from .classify import Classifier, default_classifier
from .errors import TraceError
from .merge import alignment_shifts_us
from .model import Trace


@dataclass(frozen=True)
class CollectiveWaits:
    """One collective kind over the matched calls: their count, the transfer (median and sum, us) and each rank's
    wait (sum and largest, us, in rank order); `unmatched` calls that some rank had beyond the others'."""

    collective: str
    calls: int
    transfer_median_us: float
    transfer_sum_us: float
    wait_sum_us: tuple[float, ...]
    wait_max_us: tuple[float, ...]
    unmatched: int = 0

    def to_dict(self) -> dict:
        return asdict(self)


def _calls_by_kind(trace: Trace, shift_us: float, classifier: Classifier) -> dict[str, list[tuple[float, float]]]:
    """(start, end) in us of each collective kernel of one rank, per collective kind, in start order."""
    calls: dict[str, list[tuple[float, float]]] = {}
    for e in trace.gpu_events:
        c = classifier.classify(e.name)
        if e.kind != "kernel" or not c.is_comm or c.collective is None:
            continue
        calls.setdefault(c.collective, []).append((e.ts_us + shift_us, e.end_us + shift_us))
    return {k: sorted(v) for k, v in calls.items()}


def collective_waits(
    traces: Sequence[Trace], offsets_us: Mapping[int, float] | None = None, classifier: Classifier | None = None
) -> list[CollectiveWaits]:
    """Per collective kind, the transfer and each rank's wait over the calls matched across `traces` (one per rank,
    in rank order; at least two)."""
    if len(traces) < 2:
        where = traces[0].path if traces else "traces"
        raise TraceError(where, "collective waits need the traces of two or more ranks")
    offsets = [(offsets_us or {}).get(r, 0.0) for r in range(len(traces))]
    shifts = alignment_shifts_us([t.metadata.base_time_ns for t in traces], offsets)
    per_rank = [_calls_by_kind(t, s, classifier or default_classifier()) for t, s in zip(traces, shifts, strict=True)]
    kinds = sorted(set().union(*per_rank))
    out = []
    for kind in kinds:
        lists = [r.get(kind, []) for r in per_rank]
        n = min(len(x) for x in lists)
        if n == 0:
            continue
        transfers, waits = [], [[] for _ in traces]
        for i in range(n):
            spans = [x[i] for x in lists]
            transfer = max(0.0, min(end for _, end in spans) - max(start for start, _ in spans))
            transfers.append(transfer)
            for r, (start, end) in enumerate(spans):
                waits[r].append(max(0.0, end - start - transfer))
        out.append(
            CollectiveWaits(
                collective=kind,
                calls=n,
                transfer_median_us=statistics.median(transfers),
                transfer_sum_us=sum(transfers),
                wait_sum_us=tuple(sum(w) for w in waits),
                wait_max_us=tuple(max(w) for w in waits),
                unmatched=sum(len(x) - n for x in lists),
            )
        )
    return out
