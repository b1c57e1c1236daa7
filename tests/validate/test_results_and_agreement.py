"""Aggregation over ranks, resume keys, rank agreement math, comparison rows (pure Python)."""

import pytest

from megatron_autotuner.specs import get_gpu_spec
from megatron_autotuner.validate.agreement import average_ranks, rank_agreement, spearman
from megatron_autotuner.validate.layout import Layout
from megatron_autotuner.validate.predict import compare
from megatron_autotuner.validate.results import (
    aggregate,
    append_record,
    finished_layout_ids,
    launcher_file,
    rank_file,
)
from megatron_autotuner.validate.runner import failure_kind

LAY = Layout(model="Qwen3-8B", seq_length=4096, num_gpus=2, num_layers=4, global_batch_size=8)


def _rank_rec(layout, rank, status="ok", kind=None, times=(0.2, 0.3, 0.25), alloc=10.0, reserved=11.0):
    return {
        "layout_id": layout.layout_id, "layout": layout.to_dict(), "rank": rank, "world_size": layout.world_size,
        "status": status, "failure_kind": kind, "error": None if status == "ok" else f"{kind} on {rank}",
        "env": {"device": "NVIDIA H200"}, "layer_spec": "te",
        "measured": {"step_times_s": list(times), "loss": 11.0, "max_allocated_gib": alloc,
                     "max_reserved_gib": reserved, "reserved_gib": reserved - 1, "device_used_gib": reserved + 0.5},
    }  # fmt: skip


def test_aggregate_ok_failed_and_launcher(tmp_path):
    b = LAY.replace(tp=2)
    c = LAY.replace(cp=2)
    append_record(rank_file(tmp_path, 0), _rank_rec(LAY, 0))
    append_record(rank_file(tmp_path, 1), _rank_rec(LAY, 1, times=(0.4, 0.5, 0.45), alloc=12.0, reserved=12.5))
    append_record(rank_file(tmp_path, 1), _rank_rec(b, 1, status="failed", kind="oom"))  # rank 0 died waiting
    append_record(
        launcher_file(tmp_path),
        {
            "layout_id": c.layout_id,
            "layout": c.to_dict(),
            "rank": None,
            "status": "failed",
            "failure_kind": "timeout",
            "error": "timed out",
        },
    )
    agg = aggregate(tmp_path)
    ok = agg[LAY.layout_id]
    assert ok["status"] == "ok" and ok["measured"]["step_time_s"] == pytest.approx(0.45)  # slowest rank's median
    assert ok["measured"]["max_allocated_gib"] == 12.0
    assert ok["measured"]["peak_gib"] == pytest.approx(12.5 + 1.5)  # max reserved + (device used - reserved)
    assert agg[b.layout_id]["status"] == "failed" and agg[b.layout_id]["failure_kind"] == "oom"
    assert agg[c.layout_id]["failure_kind"] == "timeout"
    assert finished_layout_ids(tmp_path) == {LAY.layout_id, b.layout_id, c.layout_id}
    assert finished_layout_ids(tmp_path, retry_failed=True) == {LAY.layout_id}


def test_a_failed_rank_s_traceback_reaches_the_layout_row(tmp_path):
    rec = _rank_rec(LAY, 0, status="failed", kind="error")
    rec["traceback"] = 'File "cuda_graphs.py", line 1, in create_cudagraphs\nAcceleratorError: capture'
    append_record(rank_file(tmp_path, 0), rec)
    append_record(rank_file(tmp_path, 1), _rank_rec(LAY, 1))
    row = aggregate(tmp_path)[LAY.layout_id]
    assert row["status"] == "failed" and "create_cudagraphs" in row["traceback"]
    append_record(rank_file(tmp_path, 0), _rank_rec(LAY, 0))  # a retry that worked has none
    assert "traceback" not in aggregate(tmp_path)[LAY.layout_id]


def test_memory_left_by_earlier_layouts_is_not_counted(tmp_path):
    # H200, one process running layouts back to back: the 2nd layout started with 15.12 GiB still allocated
    rec = _rank_rec(LAY, 0, alloc=34.89, reserved=34.95)
    rec["memory_before"] = {"max_allocated_gib": 15.12, "reserved_gib": 18.26}
    append_record(rank_file(tmp_path, 0), rec)
    append_record(rank_file(tmp_path, 1), _rank_rec(LAY, 1, alloc=10.0, reserved=11.0))
    row = aggregate(tmp_path)[LAY.layout_id]
    r0 = row["per_rank"][0]
    assert r0["max_allocated_gib"] == pytest.approx(34.89 - 15.12)
    assert r0["carried_over_reserved_gib"] == 18.26
    # its peak cannot be compared with a prediction (NCCL communicators etc. of earlier layouts remain)
    assert row["measured"]["memory_comparable"] is False and row["measured"]["peak_gib"] is None
    assert row["measured"]["peak_net_gib"] == pytest.approx(max(34.95 - 18.26 + 1.5, 11.0 + 1.5))


def test_failure_kinds():
    assert failure_kind("OutOfMemoryError: CUDA out of memory. Tried to allocate") == "oom"
    assert failure_kind("DistBackendError: NCCL error in: ProcessGroupNCCL.cpp") == "nccl"
    assert failure_kind("timed out after 150 s") == "timeout"
    assert failure_kind("ValueError: bad") == "error"


def test_spearman_and_ranks():
    assert average_ranks([10, 20, 20, 5]) == [2, 3.5, 3.5, 1]
    assert spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    assert spearman([1, 2, 3], [1, 3, 2]) == pytest.approx(0.5)
    assert spearman([1], [1]) is None and spearman([1, 1], [1, 2]) is None


def _row(layout, measured_tps, predicted_tps, status="ok"):
    return {
        "layout_id": layout.layout_id,
        "label": layout.label,
        "layout": layout.to_dict(),
        "status": status,
        "measured": {"tokens_per_s_per_gpu": measured_tps},
        "predicted": {"tokens_per_s_per_gpu": predicted_tps},
    }


def test_rank_agreement_gap():
    a, b, c = LAY, LAY.replace(tp=2), LAY.replace(pp=2)
    other = LAY.replace(seq_length=8192)
    rows = [
        _row(a, 100.0, 90.0),
        _row(b, 98.0, 95.0),
        _row(c, 70.0, 60.0),
        _row(other, 50.0, 50.0),
        _row(LAY.replace(cp=2), None, 80.0, status="failed"),
    ]
    (group,) = rank_agreement(rows)
    assert group["n"] == 3 and group["predicted_best"] == b.layout_id and group["measured_best"] == a.layout_id
    assert group["predicted_best_gap"] == pytest.approx(0.02) and group["predicted_best_ok"]
    assert group["spearman"] == pytest.approx(0.5)
    rows[1] = _row(b, 90.0, 95.0)
    assert not rank_agreement(rows)[0]["predicted_best_ok"]


def test_compare_row_derives_rates_and_oom():
    gpu = get_gpu_spec("H200")
    pred = {"step_time_s": 0.22, "peak_memory_gib": 21.0, "fits": True, "mfu": 0.5, "model_flops_per_iteration": 2.0e14}
    row = compare(LAY, {"status": "ok", "measured": {"step_time_s": 0.2, "peak_gib": 20.0}}, pred, gpu)
    assert row["measured"]["tokens_per_s_per_gpu"] == pytest.approx(8 * 4096 / 0.2 / 2)
    assert row["measured"]["mfu"] == pytest.approx(2.0e14 / 0.2 / 2 / (gpu.bf16_tflops * 1e12))
    assert row["error_rel"]["step_time"] == pytest.approx(0.1) and row["error_rel"]["peak_memory"] == pytest.approx(
        0.05
    )
    assert row["oom_as_predicted"] is True
    oom = compare(LAY, {"status": "failed", "failure_kind": "oom", "error": "OOM"}, {**pred, "fits": False}, gpu)
    assert oom["measured_oom"] and oom["oom_as_predicted"] is True
    other = compare(LAY, {"status": "failed", "failure_kind": "nccl", "error": "x"}, pred, gpu)
    assert other["oom_as_predicted"] is None


def test_memory_history_runs_compare_memory_not_time(tmp_path):
    """Recording the allocator's history slows the steps: such a run is compared on memory (peak, and the
    allocator's max allocated against the prediction without its allowance), never on time or rank agreement."""
    from megatron_autotuner.validate.batch import targets

    gpu = get_gpu_spec("H200")
    lay = LAY.replace(memory_history=True)
    assert lay.layout_id != LAY.layout_id and LAY.replace(memory_history=False).layout_id == LAY.layout_id
    for rank in (0, 1):
        rec = _rank_rec(lay, rank, alloc=18.0, reserved=19.0)
        rec["measured"]["memory_history"] = True
        append_record(rank_file(tmp_path, rank), rec)
    measured = aggregate(tmp_path)[lay.layout_id]
    assert measured["measured"]["memory_history"] is True
    pred = {
        "step_time_s": 0.22, "peak_memory_gib": 21.0, "fits": True, "mfu": 0.5, "model_flops_per_iteration": 2.0e14,
        "tokens_per_s_per_gpu": 1.0, "memory_breakdown_gib": {"allowance": 1.0, "total": 21.0},
    }  # fmt: skip
    row = compare(lay, measured, pred, gpu)
    assert row["error_rel"]["step_time"] is None and row["error_rel"]["mfu"] is None
    assert row["error_rel"]["peak_memory"] == pytest.approx(21.0 / 20.5 - 1)  # 19 reserved + 1.5 outside torch
    assert row["error_rel"]["allocated_memory"] == pytest.approx(20.0 / 18.0 - 1)
    timed = compare(LAY, {"status": "ok", "measured": {"step_time_s": 0.2, "peak_gib": 20.5}}, pred, gpu)
    assert rank_agreement([row, timed]) == []  # one timed layout left in the group
    t = targets([row, timed], [])
    assert t["step_time_compared"] == 1 and t["allocated_memory_compared"] == 1
    assert t["allocated_memory_within_5pct"] == 0 and t["peak_memory_within_5pct"] == 2
