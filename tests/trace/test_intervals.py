"""Interval math against a brute force on an integer time grid (unit cells [t, t+1))."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from megatron_autotuner.trace import intervals as iv

GRID = 60
interval = st.tuples(st.integers(0, GRID), st.integers(0, GRID)).map(lambda p: (min(p), max(p)))
interval_sets = st.lists(interval, max_size=12)


def cells(intervals) -> set[int]:
    return {t for s, e in intervals for t in range(s, e)}


def cells_to_intervals(cs: set[int]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for t in sorted(cs):
        if out and out[-1][1] == t:
            out[-1] = (out[-1][0], t + 1)
        else:
            out.append((t, t + 1))
    return out


def assert_normalized(result) -> None:
    for s, e in result:
        assert e > s
    for (_, e1), (s2, _) in zip(result, result[1:], strict=False):
        assert e1 < s2  # disjoint and not touching


@settings(max_examples=300, deadline=None)
@given(interval_sets)
def test_union_matches_grid(a):
    u = iv.union(a)
    assert_normalized(u)
    assert u == cells_to_intervals(cells(a))
    assert iv.length(a) == len(cells(a))


@settings(max_examples=300, deadline=None)
@given(interval_sets, interval_sets)
def test_intersection_and_difference_match_grid(a, b):
    inter = iv.intersection(a, b)
    diff = iv.difference(a, b)
    assert_normalized(inter)
    assert_normalized(diff)
    assert inter == cells_to_intervals(cells(a) & cells(b))
    assert diff == cells_to_intervals(cells(a) - cells(b))
    assert iv.overlap_length(a, b) == len(cells(a) & cells(b))
    # |a| = |a ∩ b| + |a − b|
    assert iv.length(a) == iv.overlap_length(a, b) + iv.length(diff)


@settings(max_examples=200, deadline=None)
@given(st.lists(interval_sets, min_size=1, max_size=14))
def test_many_streams_union_and_exposed_time(streams):
    """A dozen concurrent streams: busy time counts each instant once; comm − compute is exposed."""
    everything = [x for s in streams for x in s]
    comm = [x for s in streams[::2] for x in s]
    compute = [x for s in streams[1::2] for x in s]
    assert iv.length(everything) == len(cells(everything))
    exposed = iv.length(iv.difference(comm, compute))
    assert exposed == len(cells(comm) - cells(compute))
    overlap = iv.overlap_length(comm, compute)
    assert overlap + exposed == iv.length(comm)


@settings(max_examples=200, deadline=None)
@given(interval_sets, interval)
def test_clip_and_idle(a, window):
    lo, hi = window
    assert iv.clip(a, lo, hi) == cells_to_intervals(cells(a) & set(range(lo, hi)))
    assert iv.idle_time(a, window) == len(set(range(lo, hi)) - cells(a))
    u = iv.union(a)
    if u:
        assert iv.span(a) == (u[0][0], u[-1][1])
        assert iv.idle_time(a) == (u[-1][1] - u[0][0]) - len(cells(a))
    else:
        assert iv.span(a) is None
        assert iv.idle_time(a) == 0.0


def test_float_intervals_and_touching():
    assert iv.union([(0.5, 1.0), (1.0, 2.25), (3.0, 3.0)]) == [(0.5, 2.25)]
    assert iv.intersection([(0.0, 1.5)], [(1.5, 2.0)]) == []
    assert iv.difference([(0.0, 4.0)], [(1.0, 2.0), (2.5, 3.0)]) == [(0.0, 1.0), (2.0, 2.5), (3.0, 4.0)]
