"""The wait across ranks at each collective (`trace.collective_waits`, `mat trace waits`): hand-computed calls, the
invariants on the real TP 2 pair, and the CLI's one-line errors."""

from __future__ import annotations

import json

import pytest

from megatron_autotuner.cli import main
from megatron_autotuner.trace import TraceError, collective_waits, load_trace

from .helpers import NCCL, kernel, raw_kernels, write_trace

A2A = "ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)"
AG = "ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)"


def _pair(tmp_path, rank1_base_ns: int = 1_000_000_000):
    # rank 0 reaches both all-to-alls first; they end together once rank 1 is in: transfers 100 and 50 us
    r0 = [kernel(A2A, 1000, 400), kernel("gemm", 1500, 100), kernel(A2A, 2000, 150), kernel(AG, 3000, 30)]
    r1 = [kernel(A2A, 1300, 100), kernel(A2A, 2100, 50), kernel(AG, 3010, 20)]
    return [
        load_trace(write_trace(tmp_path / "r0.json", r0, baseTimeNanoseconds=1_000_000_000)),
        load_trace(write_trace(tmp_path / "r1.json", r1, baseTimeNanoseconds=rank1_base_ns)),
    ]


def test_hand_computed_transfer_and_waits(tmp_path):
    by = {w.collective: w for w in collective_waits(_pair(tmp_path))}
    a2a = by["send_recv"]
    assert a2a.calls == 2
    assert a2a.transfer_sum_us == pytest.approx(150.0)  # 100 + 50
    assert a2a.transfer_median_us == pytest.approx(75.0)
    assert a2a.wait_sum_us == pytest.approx((300.0 + 100.0, 0.0))  # rank 0 arrived 300 and 100 us early
    assert a2a.wait_max_us == pytest.approx((300.0, 0.0))
    ag = by["all_gather"]
    assert ag.transfer_sum_us == pytest.approx(20.0)
    assert ag.wait_sum_us == pytest.approx((10.0, 0.0))


def test_base_time_aligns_the_ranks(tmp_path):
    # rank 1's clock origin 1 us later: its calls happened 1 us later than written, so every call's transfer is
    # 1 us shorter and rank 0's wait 1 us longer; an offset of +1 us on rank 1 says the same
    late = collective_waits(_pair(tmp_path, rank1_base_ns=1_000_001_000))
    a2a = {w.collective: w for w in late}["send_recv"]
    assert a2a.transfer_sum_us == pytest.approx(150.0 - 2.0)
    assert a2a.wait_sum_us[0] == pytest.approx(400.0 + 2.0)
    shifted = collective_waits(_pair(tmp_path), offsets_us={1: 1.0})
    for by_offset, by_base in zip(shifted, late, strict=True):
        assert by_offset.transfer_sum_us == pytest.approx(by_base.transfer_sum_us)
        assert by_offset.wait_sum_us == pytest.approx(by_base.wait_sum_us)


def test_real_tp2_pair_transfer_plus_wait_is_each_rank_kernel_time():
    waits = collective_waits([load_trace(p) for p in NCCL])
    assert {w.collective for w in waits} == {"all_gather", "reduce_scatter"}
    for w in waits:
        assert w.unmatched == 0
        assert w.transfer_sum_us > 0.0
        for rank, path in enumerate(NCCL):
            # each rank's kernel time of that collective = the matched transfers + its waits
            kernels = [k for k in raw_kernels(path) if k["name"].startswith("ncclDevKernel")]
            name = "AllGather" if w.collective == "all_gather" else "ReduceScatter"
            total = sum(k["dur"] for k in kernels if name in k["name"])
            assert w.transfer_sum_us + w.wait_sum_us[rank] == pytest.approx(total, rel=1e-6)  # timestamps as floats


def test_unmatched_calls_are_counted(tmp_path):
    traces = _pair(tmp_path)
    extra = [kernel(A2A, 1000, 400), kernel(A2A, 2000, 150), kernel(A2A, 5000, 10), kernel(AG, 3000, 30)]
    traces[0] = load_trace(write_trace(tmp_path / "r0b.json", extra, baseTimeNanoseconds=1_000_000_000))
    a2a = {w.collective: w for w in collective_waits(traces)}["send_recv"]
    assert (a2a.calls, a2a.unmatched) == (2, 1)


def test_one_trace_is_refused(tmp_path, capsys):
    with pytest.raises(TraceError):
        collective_waits(_pair(tmp_path)[:1])
    assert main(["trace", "waits", str(NCCL[0])]) == 2
    assert capsys.readouterr().err.strip() == "mat: error: traces: give one trace per rank, two or more"


def test_cli_json(capsys):
    assert main(["trace", "waits", *map(str, NCCL), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [c["collective"] for c in doc["collectives"]] == ["all_gather", "reduce_scatter"]
    assert all(len(c["wait_sum_us"]) == 2 for c in doc["collectives"])


def test_validate_reports_each_profiled_layouts_waits(tmp_path):
    """`mat validate` adds the waits of a profiled multi-rank layout to its row (rank traces readable here), and
    its report names the rank that waited longest; traces it cannot read leave the row without them."""
    from megatron_autotuner.validate.report import format_waits
    from megatron_autotuner.validate.results import rank_collective_waits

    waits = rank_collective_waits([str(p) for p in NCCL])
    assert [w["collective"] for w in waits] == ["all_gather", "reduce_scatter"]
    assert rank_collective_waits([str(NCCL[0])]) is None
    assert rank_collective_waits([str(NCCL[0]), str(tmp_path / "gone.json.gz")]) is None
    (line,) = format_waits([{"label": "tp2", "layout_id": "x", "collective_waits": waits}, {"layout_id": "y"}])
    totals = [sum(w["wait_sum_us"][r] for w in waits) for r in (0, 1)]
    rank = totals.index(max(totals))
    assert line.startswith(f"waits (profiled step): tp2: rank {rank} waited {totals[rank] / 1e3:.1f} ms")
