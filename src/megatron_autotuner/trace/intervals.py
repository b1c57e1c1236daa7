"""Interval math on half-open time intervals `[start, end)` (any unit; traces use microseconds).

A *set* of intervals is normalized by `union`: sorted, disjoint, non-touching, non-empty.
Every public function accepts any iterable of `(start, end)` pairs and normalizes it first;
the `_sorted` helpers assume normalized input and run in linear time.

- `union(a)`: the points covered by at least one interval.
- `intersection(a, b) = union(a) ∩ union(b)`; `difference(a, b) = union(a) − union(b)`.
- `length(a) = busy_time(a) = Σ (end − start)` over `union(a)` (covered once however many streams).
- `idle_time(a, window) = (window end − window start) − length(a ∩ window)`.
- `overlap_length(a, b) = length(a ∩ b)`.
"""

from __future__ import annotations

from collections.abc import Iterable

Interval = tuple[float, float]


def union(intervals: Iterable[Interval]) -> list[Interval]:
    """Normalize: sort, drop empty intervals, merge overlapping or touching ones."""
    items = sorted((s, e) for s, e in intervals if e > s)
    out: list[Interval] = []
    if not items:
        return out
    cur_s, cur_e = items[0]
    for s, e in items:
        if s <= cur_e:
            if e > cur_e:
                cur_e = e
        else:
            out.append((cur_s, cur_e))
            cur_s, cur_e = s, e
    out.append((cur_s, cur_e))
    return out


def _intersection_sorted(a: list[Interval], b: list[Interval]) -> list[Interval]:
    out: list[Interval] = []
    i = j = 0
    while i < len(a) and j < len(b):
        s = max(a[i][0], b[j][0])
        e = min(a[i][1], b[j][1])
        if e > s:
            out.append((s, e))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out


def _difference_sorted(a: list[Interval], b: list[Interval]) -> list[Interval]:
    out: list[Interval] = []
    j = 0
    for s, e in a:
        cur = s
        while j < len(b) and b[j][1] <= cur:
            j += 1
        k = j
        while k < len(b) and b[k][0] < e:
            if b[k][0] > cur:
                out.append((cur, b[k][0]))
            cur = max(cur, b[k][1])
            if cur >= e:
                break
            k += 1
        if cur < e:
            out.append((cur, e))
    return out


def _length_sorted(a: Iterable[Interval]) -> float:
    return sum(e - s for s, e in a)


def intersection(a: Iterable[Interval], b: Iterable[Interval]) -> list[Interval]:
    """Points covered by both `a` and `b`."""
    return _intersection_sorted(union(a), union(b))


def difference(a: Iterable[Interval], b: Iterable[Interval]) -> list[Interval]:
    """Points covered by `a` and not by `b`."""
    return _difference_sorted(union(a), union(b))


def length(a: Iterable[Interval]) -> float:
    """Total covered time of `union(a)`."""
    return _length_sorted(union(a))


def busy_time(a: Iterable[Interval]) -> float:
    """Time covered by at least one interval (same as `length`)."""
    return length(a)


def overlap_length(a: Iterable[Interval], b: Iterable[Interval]) -> float:
    """Length of `a ∩ b`."""
    return _length_sorted(intersection(a, b))


def clip(a: Iterable[Interval], start: float, end: float) -> list[Interval]:
    """`union(a) ∩ [start, end)`."""
    return _intersection_sorted(union(a), [(start, end)] if end > start else [])


def span(a: Iterable[Interval]) -> Interval | None:
    """`(first start, last end)` of the non-empty intervals, or None."""
    u = union(a)
    return (u[0][0], u[-1][1]) if u else None


def idle_time(a: Iterable[Interval], window: Interval | None = None) -> float:
    """Time in `window` (default: the span of `a`) not covered by `a`."""
    u = union(a)
    if window is None:
        if not u:
            return 0.0
        window = (u[0][0], u[-1][1])
    if window[1] <= window[0]:
        return 0.0
    return (window[1] - window[0]) - _length_sorted(_intersection_sorted(u, [window]))
