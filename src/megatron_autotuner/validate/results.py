"""Validation records on disk, and their aggregation over ranks.

Layout of an output directory:
    layouts.json            every layout of the batch with its prediction (written before running)
    runs/rank_<r>.jsonl     one record per layout per rank, appended as each layout finishes
    runs/launcher.jsonl     failures the launcher saw (timeouts, crashed jobs, too few GPUs)
    results.jsonl           one comparison row per finished layout (measured vs predicted)
    summary.json            rows + rank agreement + targets, rewritten after every job
    jobs/                   torchrun job files and logs

Rank record (schema_version 1): {"schema_version", "tool_version", "layout_id", "layout", "rank",
"world_size", "env", "layer_spec", "status": ok|failed, "failure_kind": oom|nccl|timeout|error|null,
"error", "measured": {"step_times_s", "loss", "build_s", "max_allocated_gib", "max_reserved_gib",
"reserved_gib", "device_used_gib", "device_total_gib"}, "memory_before": {...}, "trace"}; a memory stand-in's
records (`validate.worker --stand-in-rank`) add "stand_in": true.
"""

from __future__ import annotations

import functools
import statistics
from pathlib import Path
from typing import Any

from ..errors import AutotunerError
from ..launch.records import LAUNCHER_FILE, append_record, read_records

__all__ = ["aggregate", "append_record", "current_file", "finished_layout_ids", "rank_file", "read_records"]


def rank_file(out_dir: Path, rank: int) -> Path:
    return Path(out_dir) / "runs" / f"rank_{rank}.jsonl"


def launcher_file(out_dir: Path) -> Path:
    return Path(out_dir) / "runs" / LAUNCHER_FILE


def current_file(out_dir: Path) -> Path:
    return Path(out_dir) / "runs" / "current_layout.txt"


def finished_layout_ids(out_dir: Path, retry_failed: bool = False) -> set[str]:
    """Layouts with a record on rank 0 or from the launcher: skipped on rerun (failed ones too, unless
    `retry_failed`)."""
    done: set[str] = set()
    for path in (rank_file(out_dir, 0), launcher_file(out_dir)):
        for rec in read_records(path):
            if rec.get("status") == "ok" or (rec.get("status") == "failed" and not retry_failed):
                done.add(rec["layout_id"])
    if retry_failed:
        return done
    # a failure another rank recorded also finishes the layout (rank 0 may have died waiting for it)
    for path in sorted((Path(out_dir) / "runs").glob("rank_*.jsonl")):
        for rec in read_records(path):
            if rec.get("status") == "failed":
                done.add(rec["layout_id"])
    return done


def _all_rank_records(out_dir: Path) -> list[dict[str, Any]]:
    records: list[dict[str, Any]] = []
    for path in sorted((Path(out_dir) / "runs").glob("rank_*.jsonl")):
        records.extend(read_records(path))
    return records


def layer_host_timing_by_rank(out_dir: Path, layout_id: str) -> list[dict[str, Any]]:
    """Per rank that timed its layers (`Layout.host_timing`): its summary (`host_timing.LayerHostTimer.summary`, or
    `CombinedLayerHostTimer.summary` under the all-to-all overlap) less the per-layer lists, with its rank."""
    out = []
    for rec in _all_rank_records(out_dir):
        timing = (rec.get("measured") or {}).get("host_timing") if rec["layout_id"] == layout_id else None
        if timing:
            out.append({"rank": rec["rank"], **{k: v for k, v in timing.items() if not k.endswith("_by_layer")}})
    return out


def layer_host_ms_by_rank(out_dir: Path, layout_id: str) -> list[dict[str, Any]]:
    """Per rank that timed its layers (`Layout.host_timing`): the median forward / backward host issue time of a
    decoder layer (ms)."""
    return [
        {"rank": t["rank"], "fwd_ms": t["fwd_ms"], "bwd_ms": t["bwd_ms"]}
        for t in layer_host_timing_by_rank(out_dir, layout_id)
    ]


def _median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def _non_torch_gib(rec: dict[str, Any]) -> float | None:
    m = rec.get("measured", {})
    if m.get("device_used_gib") is None or m.get("reserved_gib") is None:
        return None
    return m["device_used_gib"] - m["reserved_gib"]


def _carried_over_gib(rec: dict[str, Any]) -> tuple[float, float]:
    """(allocated, reserved) GiB already held when the layout started: what earlier layouts in the same process
    left behind. The runner records `memory_before` after emptying the cache and resetting the peak counters, so
    its max_allocated is the allocation at start. 0 in a fresh process."""
    before = rec.get("memory_before") or {}
    return before.get("max_allocated_gib") or 0.0, before.get("reserved_gib") or 0.0


def _minus(value: float | None, carried: float) -> float | None:
    return None if value is None else value - carried


def _stand_in_complete(ranks: dict[int, dict[str, Any]]) -> bool:
    """Memory stand-ins ran (at least) the first rank of every pipeline stage (`Layout.stand_in_ranks`)."""
    from .layout import Layout

    recs = list(ranks.values())
    if not recs or not all(r.get("stand_in") for r in recs):
        return False
    try:
        return set(Layout.from_dict(recs[0]["layout"]).stand_in_ranks()) <= set(ranks)
    except (AutotunerError, KeyError, TypeError, ValueError):
        return False


def aggregate(out_dir: Path) -> dict[str, dict[str, Any]]:
    """One measured summary per layout: the latest record of every rank, plus launcher failures.

    Step time = the slowest rank's median step (ranks wait for each other at every collective);
    memory = the largest rank. `peak_gib` = max reserved + memory outside the caching allocator
    (CUDA context, NCCL buffers: device used - reserved at the end), what `nvidia-smi` would show.
    Allocator figures are net of what was already held when the layout started (`_carried_over_gib`).
    """
    latest: dict[str, dict[int, dict[str, Any]]] = {}
    for rec in _all_rank_records(out_dir):
        latest.setdefault(rec["layout_id"], {})[rec["rank"]] = rec
    launcher: dict[str, dict[str, Any]] = {}
    for rec in read_records(launcher_file(out_dir)):
        launcher[rec["layout_id"]] = rec
    out: dict[str, dict[str, Any]] = {}
    for layout_id in sorted(set(latest) | set(launcher)):
        ranks = latest.get(layout_id, {})
        world = next((r["world_size"] for r in ranks.values()), None)
        failed = [r for r in ranks.values() if r.get("status") == "failed"]
        failed.sort(key=lambda r: (r.get("failure_kind") != "oom", r["rank"]))
        row: dict[str, Any] = {"layout_id": layout_id, "ranks_reported": sorted(ranks)}
        any_rec = next(iter(ranks.values()), None) or launcher.get(layout_id)
        row["layout"] = any_rec.get("layout") if any_rec else None
        if failed:
            row.update(
                status="failed",
                failure_kind=failed[0].get("failure_kind"),
                error=failed[0].get("error"),
                failed_rank=failed[0]["rank"],
            )
            if failed[0].get("traceback"):
                # the one-line error names the symptom; where it was raised is what a fix needs
                row["traceback"] = failed[0]["traceback"]
        elif world is not None and (len(ranks) == world or _stand_in_complete(ranks)):
            row.update(status="ok", failure_kind=None, error=None)
        elif layout_id in launcher:
            lrec = launcher[layout_id]
            row.update(
                status="failed",
                failure_kind=lrec.get("failure_kind", "error"),
                error=lrec.get("error"),
                log_tail=lrec.get("log_tail"),
            )
        else:
            row.update(status="incomplete", failure_kind=None, error="not every rank reported")
        if any(r.get("stand_in") for r in ranks.values()):
            row["stand_in"] = True
        if ranks:
            r0 = ranks.get(0) or next(iter(ranks.values()))
            row["env"] = r0.get("env")
            row["layer_spec"] = r0.get("layer_spec")
            row["gradient_accumulation_fusion"] = r0.get("gradient_accumulation_fusion")
            if r0.get("activation_offload"):
                row["activation_offload"] = r0["activation_offload"]
            packing = [rec["packing"] for _, rec in sorted(ranks.items()) if rec.get("packing")]
            if packing:
                # one entry per DP rank (ranks of one DP rank pack the same micro-batches)
                row["packing"] = list({p["dp_rank"]: p for p in packing}.values())
            per_rank = []
            for rank, rec in sorted(ranks.items()):
                m = rec.get("measured", {})
                carried_alloc, carried_reserved = _carried_over_gib(rec)
                per_rank.append(
                    {
                        "rank": rank,
                        "step_time_s": _median(m.get("step_times_s") or []),
                        "max_allocated_gib": _minus(m.get("max_allocated_gib"), carried_alloc),
                        "max_reserved_gib": _minus(m.get("max_reserved_gib"), carried_reserved),
                        "carried_over_allocated_gib": carried_alloc,
                        "carried_over_reserved_gib": carried_reserved,
                        "non_torch_gib": _non_torch_gib(rec),
                        "device_used_gib": m.get("device_used_gib"),
                        "loss": m.get("loss"),
                        "offloaded_gib": m.get("offloaded_gib"),
                    }
                )
            row["per_rank"] = per_rank
            traces = [rec["trace"] for _, rec in sorted(ranks.items()) if rec.get("trace")]
            if traces:
                row["traces"] = traces
                waits = rank_collective_waits(traces)
                if waits:
                    row["collective_waits"] = waits
            if row["status"] == "ok":
                row["measured"] = _measured_summary(list(ranks.values()), per_rank)
        out[layout_id] = row
    return out


def rank_collective_waits(traces: list[str]) -> list[dict[str, Any]] | None:
    """Per collective, the transfer and each rank's wait for the last to arrive (`trace.collective_waits`) in a
    multi-rank layout's profiled step; None unless two or more of its rank traces are readable on this machine."""
    paths = [Path(t) for t in traces]
    if len(paths) < 2 or not all(p.is_file() for p in paths):
        return None
    # the batch re-aggregates after every job: each layout's traces are read once, until a file changes
    return _collective_waits_of(tuple((str(p), p.stat().st_mtime_ns, p.stat().st_size) for p in paths))


@functools.lru_cache(maxsize=64)
def _collective_waits_of(files: tuple[tuple[str, int, int], ...]) -> list[dict[str, Any]] | None:
    """`rank_collective_waits` of the rank traces (path, mtime, size); None for a trace that cannot be read."""
    from ..trace import TraceError, collective_waits, load_trace

    try:
        return [w.to_dict() for w in collective_waits([load_trace(path) for path, _, _ in files])]
    except TraceError:
        return None


def _max(values: list[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return max(vals) if vals else None


def _measured_summary(records: list[dict[str, Any]], per_rank: list[dict[str, Any]]) -> dict[str, Any]:
    times = [p["step_time_s"] for p in per_rank if p["step_time_s"] is not None]
    steps = [t for rec in records for t in rec.get("measured", {}).get("step_times_s") or []]
    peak = [
        p["max_reserved_gib"] + p["non_torch_gib"]
        for p in per_rank
        if p["max_reserved_gib"] is not None and p["non_torch_gib"] is not None
    ]
    # a process that ran other layouts first still holds some of their memory, allocator blocks and NCCL
    # communicators (H200: 9-15 GiB allocated, non-torch memory growing 1.4 -> 13.6 GiB over 8 layouts), so
    # only a layout that started in a fresh process has a peak that can be compared with a prediction
    fresh = all((p.get("carried_over_allocated_gib") or 0.0) < 0.01 for p in per_rank)
    if any(rec.get("stand_in") for rec in records):
        # memory stand-ins (fake process group, one rank per process): their steps moved no data and their memory
        # outside the allocator has no NCCL buffers, so only the allocator's figures are measurements
        times, peak = [], []
    return {
        "memory_comparable": fresh,
        "step_time_s": max(times) if times else None,
        "step_time_min_s": min(steps) if steps else None,
        "step_time_max_s": max(steps) if steps else None,
        "steps": len(records[0].get("measured", {}).get("step_times_s") or []),
        "max_allocated_gib": _max([p["max_allocated_gib"] for p in per_rank]),
        "max_reserved_gib": _max([p["max_reserved_gib"] for p in per_rank]),
        "non_torch_gib": _max([p["non_torch_gib"] for p in per_rank]),
        "peak_gib": max(peak) if peak and fresh else None,
        "peak_net_gib": max(peak) if peak and not fresh else None,
        "loss": next((p["loss"] for p in reversed(per_rank) if p["loss"] is not None), None),
        # fine-grained activation offloading: what megatron-core's manager offloaded after its warm-up, largest rank
        "offloaded_gib": _max([p.get("offloaded_gib") for p in per_rank]),
        # recording the allocator's history slowed these steps: their time is not compared with a prediction
        "memory_history": any(rec.get("measured", {}).get("memory_history") for rec in records),
        "stand_in": any(rec.get("stand_in") for rec in records),
        # per-layer host issue times (`Layout.host_timing`), of the first rank that recorded them
        "host_timing": next(
            (rec["measured"]["host_timing"] for rec in records if (rec.get("measured") or {}).get("host_timing")), None
        ),
    }
