"""Result records of the testbench: one JSON object per case per rank, appended as JSON lines.

Record schema (schema_version 1):
{"schema_version", "tool_version", "case_id", "case": {...}, "rank", "world_size", "status": "ok"|"failed",
 "error": str|null, "mode", "layer_spec": "te"|"local", "env": {device, torch, megatron_core, transformer_engine,
 cuda, nccl, date}, "real": {...measured...}, "estimated": {...theory...}, "ratio": {...real/estimated...}}
"""

from __future__ import annotations

import copy
import statistics
from pathlib import Path
from typing import Any

from ..launch.records import LAUNCHER_FILE, append_record, read_records

__all__ = [
    "LAUNCHER_FILE",
    "all_records",
    "append_record",
    "finished_case_ids",
    "latest_by_case",
    "median_over_rounds",
    "rank_file",
    "read_records",
]


def rank_file(out_dir: Path, rank: int) -> Path:
    return Path(out_dir) / "collect" / f"rank_{rank}.jsonl"


def all_records(out_dir: Path) -> list[dict[str, Any]]:
    """Every record under `out_dir/collect/` (all ranks, plus failures the launcher recorded)."""
    collect = Path(out_dir) / "collect"
    records: list[dict[str, Any]] = []
    for path in sorted(collect.glob("*.jsonl")):
        records.extend(read_records(path))
    return records


def finished_case_ids(out_dir: Path, retry_failed: bool = False) -> set[str]:
    """Cases with a result on rank 0 (or a launcher-recorded failure): skipped on restart.

    With `retry_failed`, failed cases count as unfinished.
    """
    done: set[str] = set()
    for path in (rank_file(out_dir, 0), Path(out_dir) / "collect" / LAUNCHER_FILE):
        for rec in read_records(path):
            if rec.get("status") == "ok" or (rec.get("status") == "failed" and not retry_failed):
                done.add(rec["case_id"])
    return done


def latest_by_case(records: list[dict[str, Any]], rank: int | None = 0) -> dict[str, dict[str, Any]]:
    """The last record of each case (on `rank`; None = any rank)."""
    latest: dict[str, dict[str, Any]] = {}
    for rec in records:
        if rank is not None and rec.get("rank") not in (rank, None):
            continue
        latest[rec["case_id"]] = rec
    return latest


# the timings a round's record holds, each a {"median", "min", "max", "std", "n"} summary (`testbench.measure`)
ROUND_TIMINGS = ("fwd_ms", "bwd_ms", "host_fwd_ms", "host_bwd_ms")


def median_over_rounds(rounds: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """One record per case that succeeded (rank 0) in any round, each round a separate process: the first successful
    round's record with each timing's median replaced by the median over the successful rounds' medians, which stay
    beside it (`real[key]["round_medians"]`). A process's host pace is its own: one H200 host timed the same MoE
    block's backward at 6.3, 6.6 and 9.8 ms in three processes (benchmarks/results/moe_floor_repeat_h200_x2)."""
    per_round = [latest_by_case(records) for records in rounds]
    merged = []
    for case_id in dict.fromkeys(case_id for by_case in per_round for case_id in by_case):
        recs = [by_case[case_id] for by_case in per_round if by_case.get(case_id, {}).get("status") == "ok"]
        if not recs:
            continue
        out = copy.deepcopy(recs[0])
        for key in ROUND_TIMINGS:
            medians = [(r["real"].get(key) or {}).get("median") for r in recs]
            if None not in medians:
                out["real"][key] = out["real"][key] | {"median": statistics.median(medians), "round_medians": medians}
        merged.append(out)
    return merged
