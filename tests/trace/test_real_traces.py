"""The shipped H200 traces: classification coverage and overlap numbers checked against brute force.

The brute force (helpers.py) reads the raw JSON with json.load, sorts kernels into comm / compute /
neither by plain name prefixes, and measures time on elementary segments between all event
boundaries; it shares no code with the package.
"""

from __future__ import annotations

import pytest

from megatron_autotuner.trace import CATEGORIES, classify_trace, find_ranges, load_trace, overlap, summarize

from .helpers import ALL_TRACES, NCCL, UB, brute_overlap, naive_kind, raw, raw_gpu_events


def _brute(path, keep=None):
    events = []
    for e in raw_gpu_events(path):
        if keep is not None and e["args"]["correlation"] not in keep:
            continue
        events.append((naive_kind(e["name"]), e["ts"], e["ts"] + e["dur"]))
    return brute_overlap(events)


@pytest.mark.parametrize("path", ALL_TRACES, ids=lambda p: p.name)
def test_every_gpu_event_classified(path):
    t = load_trace(path)
    classes = classify_trace(t)
    assert len(classes) == len(t.gpu_events) == len(raw_gpu_events(path))
    assert all(c.category in CATEGORIES and c.reason for c in classes)
    # nothing fell through to the "no rule matched" fallback
    assert summarize(t).unmatched_kernels == ()
    assert not [e.name for e, c in zip(t.gpu_events, classes, strict=True) if c.is_fallback]
    # the package's comm / compute / neither split agrees with the plain reading of the names
    for e, c in zip(t.gpu_events, classes, strict=True):
        expected = naive_kind(e.name)
        got = "comm" if c.is_comm else "compute" if c.is_compute else "neither"
        assert got == expected, (e.name, c)


@pytest.mark.parametrize("path", ALL_TRACES, ids=lambda p: p.name)
def test_overlap_matches_brute_force(path):
    ours = overlap(load_trace(path))
    ref = _brute(path)
    for key, value in (
        ("comm", ours.comm_us),
        ("compute", ours.compute_us),
        ("overlap", ours.overlap_us),
        ("exposed", ours.exposed_comm_us),
        ("busy", ours.busy_us),
    ):
        assert value == pytest.approx(ref[key], rel=1e-9, abs=1e-6), key
    den = min(ref["comm"], ref["compute"])
    assert ours.overlap_ratio == pytest.approx(ref["overlap"] / den if den else 0.0, rel=1e-9)


def test_cudnn_fusion_kernels_inside_attention_are_attention():
    t = load_trace(UB[0])
    fusion = [c for e, c in zip(t.gpu_events, classify_trace(t), strict=True) if "cudnn::fusion::" in e.name]
    assert len(fusion) == 4 and {c.category for c in fusion} == {"attention"}


@pytest.mark.parametrize("rank", [0, 1])
def test_userbuffers_overlap_gemms_on_other_streams(rank):
    path = UB[rank]
    t = load_trace(path)
    assert len(t.streams) >= 12  # userbuffers spreads GEMM chunks and comm over many streams
    # brute force: userbuffers kernel time that intersects a GEMM running on a different stream
    events = raw_gpu_events(path)
    ub = [e for e in events if "userbuffers" in e["name"]]
    gemms = [e for e in events if e["name"].startswith("nvjet_")]
    cross = 0.0
    for u in ub:
        pieces = []
        for g in gemms:
            if g["args"]["stream"] == u["args"]["stream"]:
                continue
            s, e = max(u["ts"], g["ts"]), min(u["ts"] + u["dur"], g["ts"] + g["dur"])
            if e > s:
                pieces.append((s, e))
        pieces.sort()
        end = float("-inf")
        for s, e in pieces:  # union of the pieces
            cross += max(0.0, e - max(s, end))
            end = max(end, e)
    assert cross > 100.0
    stats = overlap(t)
    ub_stats = {b.name: b for b in stats.by_library}["userbuffers"]
    assert ub_stats.count == 20
    assert ub_stats.overlap_us > 0
    assert ub_stats.overlap_us == pytest.approx(cross, rel=0.05)  # GEMMs are all the compute under UB comm
    assert {b.name for b in stats.by_collective} == {"reduce_scatter", "all_gather", "send_recv", "peer_copy"}


def test_userbuffers_rank0_numbers():
    stats = overlap(load_trace(UB[0]))
    assert stats.comm_us == pytest.approx(3385.806, abs=0.01)
    assert stats.overlap_us == pytest.approx(1288.616, abs=0.01)
    assert stats.exposed_comm_us == pytest.approx(2097.189, abs=0.01)
    assert stats.overlap_ratio == pytest.approx(0.3806, abs=1e-4)


@pytest.mark.parametrize(("rank", "ag_overlap", "rs_overlap"), [(0, 340.832, 350.145), (1, 486.081, 421.089)])
def test_nccl_all_gather_and_reduce_scatter(rank, ag_overlap, rs_overlap):
    path = NCCL[rank]
    t = load_trace(path)
    stats = overlap(t)
    by = {b.name: b for b in stats.by_collective}
    assert by["all_gather"].count == 6 and by["reduce_scatter"].count == 4
    assert {b.name for b in stats.by_library} == {"nccl"}
    assert by["all_gather"].overlap_us == pytest.approx(ag_overlap, abs=0.01)
    assert by["reduce_scatter"].overlap_us == pytest.approx(rs_overlap, abs=0.01)
    # brute force per collective: NCCL kernels of one type against all compute
    for kind, name in (("all_gather", "AllGather"), ("reduce_scatter", "ReduceScatter")):
        events = []
        for e in raw_gpu_events(path):
            k = naive_kind(e["name"])
            if k == "comm" and name not in e["name"]:
                continue
            events.append((k, e["ts"], e["ts"] + e["dur"]))
        ref = brute_overlap(events)
        assert by[kind].overlap_us == pytest.approx(ref["overlap"], rel=1e-9)
        assert by[kind].comm_us == pytest.approx(ref["comm"], rel=1e-9)


def _raw_cpu_range_correlations(path, name):
    """Correlation ids launched from the thread of each `name` cpu_op while it is open (brute force)."""
    doc = raw(path)["traceEvents"]
    ranges = [e for e in doc if e.get("cat") in ("cpu_op", "user_annotation") and e["name"] == name]
    calls = [e for e in doc if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})]
    keep = set()
    for r in ranges:
        for c in calls:
            if c["tid"] == r["tid"] and c["pid"] == r["pid"] and r["ts"] <= c["ts"] <= r["ts"] + r["dur"]:
                keep.add(c["args"]["correlation"])
    return len(ranges), keep


def test_cpu_range_attribution_layernorm_linear_userbuffers():
    path = UB[0]
    n, keep = _raw_cpu_range_correlations(path, "_LayerNormLinear")
    t = load_trace(path)
    instances = find_ranges(t, "_LayerNormLinear")
    assert len(instances) == n == 2
    got = {t.gpu_events[i].correlation for inst in instances for i, _, _ in inst.spans}
    expected = {e["args"]["correlation"] for e in raw_gpu_events(path) if e["args"]["correlation"] in keep}
    assert got == expected
    stats = overlap(t, "_LayerNormLinear")
    assert stats.category_us["gemm"] > 0 and stats.comm_us > 0 and stats.overlap_us > 0
    # per-instance brute force, summed
    ref = {"comm": 0.0, "overlap": 0.0, "compute": 0.0}
    for inst in instances:
        part = _brute(path, keep={t.gpu_events[i].correlation for i, _, _ in inst.spans})
        for k in ref:
            ref[k] += part[k]
    assert stats.comm_us == pytest.approx(ref["comm"], rel=1e-9)
    assert stats.compute_us == pytest.approx(ref["compute"], rel=1e-9)
    assert stats.overlap_us == pytest.approx(ref["overlap"], rel=1e-9)
    spans = sum(inst.gpu_end_us - inst.gpu_start_us for inst in instances)
    assert stats.span_us == pytest.approx(spans)


def test_cpu_and_gpu_annotation_ranges_agree_on_nccl():
    t = load_trace(NCCL[0])
    cpu = find_ranges(t, "nccl:_all_gather_base", source="cpu")
    gpu = find_ranges(t, "nccl:_all_gather_base", source="gpu")
    assert len(cpu) == len(gpu) == 6
    names_cpu = sorted(t.gpu_events[i].name for inst in cpu for i, _, _ in inst.spans)
    names_gpu = sorted(t.gpu_events[i].name for inst in gpu for i, _, _ in inst.spans)
    assert names_cpu == names_gpu == ["ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)"] * 6
    stats = overlap(t, "nccl:_all_gather_base")
    assert stats.compute_us == 0 and stats.overlap_us == 0  # the range launched only NCCL kernels
    assert stats.comm_overlap_any_compute_us == pytest.approx(340.832, abs=0.01)  # hidden by other ranges' GEMMs


def test_event_intervals_per_category_stream_and_device():
    from megatron_autotuner.trace import COMM_CATEGORIES, COMPUTE_CATEGORIES, event_intervals, intersection, length

    t = load_trace(UB[1])
    stats = overlap(t)
    comm = event_intervals(t, categories=COMM_CATEGORIES)
    compute = event_intervals(t, categories=COMPUTE_CATEGORIES, device=t.devices[0])
    assert t.devices == (1,)  # rank 1 ran on GPU 1
    assert length(comm) == pytest.approx(stats.comm_us)
    assert length(intersection(comm, compute)) == pytest.approx(stats.overlap_us)
    gemm_other_streams = [
        x for s in {e.stream for e in t.gpu_events} - {7} for x in event_intervals(t, categories="gemm", stream=s)
    ]
    assert length(intersection(comm, gemm_other_streams)) > 0
    per_stream = {(s.device, s.stream): s.busy_us for s in summarize(t).streams}
    assert length(event_intervals(t, stream=7)) == pytest.approx(per_stream[(1, 7)])
