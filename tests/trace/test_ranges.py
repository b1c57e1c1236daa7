"""Range attribution on small hand-made traces."""

from __future__ import annotations

import pytest

from megatron_autotuner.trace import TraceError, find_ranges, load_trace, overlap

from .helpers import cpu, kernel, launch, write_trace


@pytest.fixture
def trace(tmp_path):
    events = [
        # "fc1 fprop" on the main thread launches a GEMM (stream 7) and an all-gather (stream 20)
        cpu("fc1 fprop", 0.0, 50.0, cat="user_annotation"),
        cpu("fc1 fprop", 10.0, 5.0, cat="user_annotation"),  # nested same name: not a second instance
        launch(5.0, 1),
        launch(12.0, 2),
        cpu("fc2 fprop", 60.0, 20.0, cat="user_annotation"),
        launch(65.0, 3),
        launch(70.0, 4, tid=200),  # another thread: not fc2's
        kernel("nvjet_sm90_tst_a", 100.0, 40.0, stream=7, corr=1),
        kernel("ncclDevKernel_AllGather_RING_LL", 120.0, 40.0, stream=20, corr=2),
        kernel("nvjet_sm90_tst_b", 170.0, 10.0, stream=7, corr=3),
        kernel("ncclDevKernel_ReduceScatter_Sum", 172.0, 20.0, stream=20, corr=4),
        {
            "ph": "X",
            "cat": "gpu_user_annotation",
            "name": "window",
            "pid": 0,
            "tid": 20,
            "ts": 130.0,
            "dur": 50.0,
            "args": {"device": 0, "stream": 20},
        },
    ]
    return load_trace(write_trace(tmp_path / "ranges.json", events))


def test_cpu_range_owns_launched_kernels(trace):
    inst = find_ranges(trace, "fc1 fprop")
    assert len(inst) == 1
    assert sorted(trace.gpu_events[i].correlation for i, _, _ in inst[0].spans) == [1, 2]
    stats = overlap(trace, "fc1 fprop")
    assert stats.span_us == 60.0  # 100 .. 160
    assert stats.compute_us == 40.0 and stats.comm_us == 40.0
    assert stats.overlap_us == 20.0 and stats.exposed_comm_us == 20.0
    assert stats.overlap_ratio == 0.5
    assert stats.category_us == {"gemm": 40.0, "comm": 40.0}


def test_other_thread_not_attributed(trace):
    inst = find_ranges(trace, "fc2 fprop")
    assert [trace.gpu_events[i].correlation for i, _, _ in inst[0].spans] == [3]
    stats = overlap(trace, "fc2 fprop")
    assert stats.comm_us == 0 and stats.compute_us == 10.0
    # the reduce-scatter (launched elsewhere) is not part of fc2, but overlaps GEMM time globally
    assert stats.comm_overlap_any_compute_us == 0.0


def test_gpu_annotation_clips_to_window(trace):
    inst = find_ranges(trace, "window")
    assert inst[0].source == "gpu"
    spans = sorted((trace.gpu_events[i].name, s, e) for i, s, e in inst[0].spans)
    # only stream 20 events, clipped to [130, 180)
    assert spans == [
        ("ncclDevKernel_AllGather_RING_LL", 130.0, 160.0),
        ("ncclDevKernel_ReduceScatter_Sum", 172.0, 180.0),
    ]
    stats = overlap(trace, "window")
    assert stats.comm_us == 38.0
    assert stats.comm_overlap_any_compute_us == 10.0 + 8.0  # GEMM a until 140, GEMM b 172..180


def test_match_modes_and_missing(trace):
    assert len(find_ranges(trace, "fprop", match="contains")) == 2
    assert len(find_ranges(trace, "fc", match="contains")) == 2  # nested "fc1 fprop" counted once
    assert len(find_ranges(trace, r"^fc\d fprop$", match="regex")) == 2
    expected = r"ranges.json: no .* range matches 'fc3 fprop' \(exact match\); close names: .*'fc1 fprop'"
    with pytest.raises(TraceError, match=expected):
        find_ranges(trace, "fc3 fprop")
    with pytest.raises(TraceError):
        find_ranges(trace, "window", source="cpu")


def test_whole_trace_overlap(trace):
    stats = overlap(trace)
    # compute: [100,140) ∪ [170,180) = 50; comm: [120,160) ∪ [172,192) = 60; overlap: [120,140) ∪ [172,180) = 28
    assert (stats.compute_us, stats.comm_us, stats.overlap_us) == (50.0, 60.0, 28.0)
    assert stats.busy_us == 40.0 + 20.0 + 22.0
    assert stats.span_us == 92.0 and stats.idle_us == 10.0
    assert stats.overlap_ratio == 28.0 / 50.0
