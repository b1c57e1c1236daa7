"""Replay of a CUDA caching-allocator history (`trace.memory_history`, `mat trace memory`)."""

from __future__ import annotations

import datetime as dt
import gzip
import json
import pickle

import pytest
from hypothesis import given
from hypothesis import strategies as st

from megatron_autotuner.errors import ConfigError
from megatron_autotuner.trace import TraceError
from megatron_autotuner.trace.memory_history import load_snapshot, replay_history

MIB = 1 << 20


def _ev(action: str, addr: int, size: int, name: str = "fn") -> dict:
    frames = [{"filename": "m.py", "line": 1, "name": name}]
    return {"action": action, "addr": addr, "size": size, "stream": 0, "frames": frames}


def _hole_snapshot() -> dict:
    """A (10 MiB) and B (4 MiB) fill fresh pages; A is freed and C (6 MiB) reuses its start; D (10 MiB) no longer
    fits the 4 MiB left of A's place, so 10 MiB more are mapped although 4 MiB were free: 4 MiB beyond need."""
    a, b, c, d = 0, 10 * MIB, 0, 14 * MIB
    trace = [
        _ev("segment_map", a, 10 * MIB),
        _ev("alloc", a, 10 * MIB, "a"),
        _ev("segment_map", b, 4 * MIB),
        _ev("alloc", b, 4 * MIB, "b"),
        _ev("free_requested", a, 10 * MIB),
        _ev("free_completed", a, 10 * MIB),
        _ev("alloc", c, 6 * MIB, "c"),
        _ev("segment_map", d, 10 * MIB),
        _ev("alloc", d, 10 * MIB, "logits"),
    ]
    return {"segments": [], "device_traces": [trace]}


def test_hole_left_by_a_freed_block_is_found():
    h = replay_history(_hole_snapshot())
    assert h.peak_reserved_bytes == 24 * MIB
    assert h.peak_held_bytes == 20 * MIB  # b + c + d
    assert h.reserved_unallocated_at_peak_bytes == 4 * MIB
    assert [g.excess_bytes for g in h.growths] == [0, 0, 4 * MIB]
    worst = h.to_dict()["largest_excess_growths"]
    assert len(worst) == 1 and worst[0]["request_bytes"] == 10 * MIB and worst[0]["free_before_bytes"] == 4 * MIB
    assert worst[0]["frames"] == ["m.py:1 logits"]
    assert h.to_dict()["largest_allocations"][0]["size_bytes"] == 10 * MIB
    assert h.initial_held_bytes == h.initial_reserved_bytes == 0 and not h.notes


def test_history_that_starts_late_is_counted_from_what_it_implies():
    trace = [_ev("free_completed", 7, 3 * MIB), _ev("segment_unmap", 7, 3 * MIB), _ev("alloc", 9, MIB)]
    h = replay_history({"device_traces": [trace]})
    assert h.initial_held_bytes == 3 * MIB and h.initial_reserved_bytes == 3 * MIB
    assert h.notes and "started late" in h.notes[0]


def test_device_choice_and_errors():
    snap = {"device_traces": [[], _hole_snapshot()["device_traces"][0]]}
    assert replay_history(snap).device == 1
    with pytest.raises(ConfigError, match="device: 5"):
        replay_history(snap, device=5)
    with pytest.raises(TraceError, match="no allocator history"):
        replay_history({"device_traces": [[]]})


ACTIONS = st.sampled_from(["alloc", "free_completed", "segment_map", "segment_alloc", "segment_unmap"])


@given(st.lists(st.tuples(ACTIONS, st.integers(0, 6), st.integers(1, 64)), min_size=1, max_size=60))
def test_growth_beyond_need_is_never_negative_nor_more_than_the_growth(events):
    trace = [_ev(a, addr, size * MIB) for a, addr, size in events]
    trace.append(_ev("alloc", 99, MIB))
    h = replay_history({"device_traces": [trace]})
    assert all(0 <= g.excess_bytes <= g.growth_bytes for g in h.growths)
    assert h.peak_reserved_bytes >= h.initial_reserved_bytes >= 0


def test_load_snapshot_plain_gzip_and_refusals(tmp_path):
    snap = _hole_snapshot()
    plain, packed = tmp_path / "s.pickle", tmp_path / "s.pickle.gz"
    plain.write_bytes(pickle.dumps(snap))
    packed.write_bytes(gzip.compress(pickle.dumps(snap)))
    assert load_snapshot(plain) == snap == load_snapshot(packed)
    evil = tmp_path / "evil.pickle"
    evil.write_bytes(pickle.dumps({"device_traces": [], "when": dt.datetime(2026, 1, 1)}))
    with pytest.raises(TraceError, match="datetime"):
        load_snapshot(evil)
    other = tmp_path / "other.pickle"
    other.write_bytes(pickle.dumps({"segments": []}))
    with pytest.raises(TraceError, match="device_traces"):
        load_snapshot(other)
    with pytest.raises(TraceError, match="cannot be read"):
        load_snapshot(tmp_path / "missing.pickle")


def test_cli_json_and_table(mat, tmp_path):
    path = tmp_path / "rank_0.pickle.gz"
    path.write_bytes(gzip.compress(pickle.dumps(_hole_snapshot())))
    code, out, _ = mat("trace", "memory", path, "--json")
    assert code == 0
    doc = json.loads(out)
    assert doc["schema_version"] == 1 and doc["excess_growth_bytes"] == 4 * MIB
    code, out, _ = mat("trace", "memory", path, "--top", "3")
    assert code == 0 and "beyond need" in out and "logits" in out
    code, _, err = mat("trace", "memory", tmp_path / "nope.pickle")
    assert code != 0 and len(err.strip().splitlines()) == 1 and "cannot be read" in err
    for bad, expected in ((("--top", "0"), "--top: must be a positive"), (("--device", "3"), "device: 3 is not in")):
        code, _, err = mat("trace", "memory", path, *bad)
        assert code != 0 and len(err.strip().splitlines()) == 1 and expected in err, err


REAL = "benchmarks/results/testbench_h200_x2/snapshot"


def test_real_h200_snapshot_replays_to_the_measured_peak():
    """The testbench's snapshot of one Qwen3-8B decoder layer on H200 (history recorded after warm-up, so the
    reservation predates it): the replayed peak of held bytes is what torch.cuda.max_memory_allocated reported."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[2] / REAL
    measured = json.loads((root.parent / "snapshot_summary.json").read_text())["rows"][0]["peak_allocated_gib"]
    (path,) = root.glob("memory_snapshot/*/rank_0.pickle.gz")
    snap = load_snapshot(path)
    h = replay_history(snap)
    gib = 1024**3
    assert h.peak_held_bytes / gib == pytest.approx(measured, abs=1e-3)
    assert h.peak_reserved_bytes == sum(seg["total_size"] for seg in snap["segments"])
    assert h.growths == () and h.initial_reserved_bytes == h.peak_reserved_bytes
    assert any("layernorm_linear.py" in f for a in h.largest_allocations for f in a.frames)


def test_what_is_held_at_the_peak_is_grouped_by_the_code_that_allocated_it():
    h = replay_history(_hole_snapshot())
    sites = {s.site: (s.bytes, s.blocks) for s in h.held_at_peak_by_site}
    # a was freed before the peak; b, c and d are held when d arrives
    assert sites == {"m.py:1 logits": (10 * MIB, 1), "m.py:1 c": (6 * MIB, 1), "m.py:1 b": (4 * MIB, 1)}
    assert sum(b for b, _ in sites.values()) == h.peak_held_bytes
    assert h.to_dict()["held_at_peak_by_site"][0] == {"site": "m.py:1 logits", "bytes": 10 * MIB, "blocks": 1}
    # a history that starts late: what was held before it, and not freed by the peak, is its own site
    late = [_ev("free_completed", 7, 3 * MIB), _ev("alloc", 9, 5 * MIB), _ev("free_completed", 9, 5 * MIB)]
    late += [_ev("alloc", 9, 6 * MIB)]
    h = replay_history({"device_traces": [[_ev("free_completed", 6, 2 * MIB), *late]]})
    assert h.initial_held_bytes == 5 * MIB
    assert {s.site: s.bytes for s in h.held_at_peak_by_site} == {"m.py:1 fn": 6 * MIB}
    h = replay_history({"device_traces": [late]})
    assert {s.site: s.bytes for s in h.held_at_peak_by_site} == {"m.py:1 fn": 6 * MIB}


def test_frees_awaiting_another_stream_are_held_at_the_peak_and_named():
    """A weight gradient freed with a use on another stream (`free_requested`, completed only after the peak) is
    still held when the next allocation peaks; torch's memory_allocated had already dropped it."""
    wgrad, act, other = 0, 10 * MIB, 20 * MIB
    trace = [
        _ev("segment_map", 0, 30 * MIB),
        _ev("alloc", wgrad, 4 * MIB, "wgrad_gemm"),
        _ev("alloc", act, 8 * MIB, "act"),
        _ev("free_requested", wgrad, 4 * MIB),
        _ev("alloc", other, 6 * MIB, "next"),
        _ev("free_completed", wgrad, 4 * MIB),
    ]
    h = replay_history({"device_traces": [trace]})
    assert h.peak_held_bytes == 18 * MIB
    assert h.awaiting_at_peak_bytes == 4 * MIB
    assert h.to_dict()["awaiting_at_peak_by_site"] == [{"site": "m.py:1 wgrad_gemm", "bytes": 4 * MIB, "blocks": 1}]
    # a free completed at once waits for nothing
    assert replay_history(_hole_snapshot()).awaiting_at_peak_bytes == 0
