"""Result records of the testbench: one JSON object per case per rank, appended as JSON lines.

Record schema (schema_version 1):
{"schema_version", "tool_version", "case_id", "case": {...}, "rank", "world_size", "status": "ok"|"failed",
 "error": str|null, "mode", "layer_spec": "te"|"local", "env": {device, torch, megatron_core, transformer_engine,
 cuda, nccl, date}, "real": {...measured...}, "estimated": {...theory...}, "ratio": {...real/estimated...}}
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .. import SCHEMA_VERSION, __version__

LAUNCHER_FILE = "launcher.jsonl"


def rank_file(out_dir: Path, rank: int) -> Path:
    return Path(out_dir) / "collect" / f"rank_{rank}.jsonl"


def append_record(path: Path, record: dict[str, Any]) -> None:
    """Append one record and flush it to disk at once (a sweep killed later loses nothing)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    record = {"schema_version": SCHEMA_VERSION, "tool_version": __version__, **record}
    with open(path, "a") as f:
        f.write(json.dumps(record) + "\n")
        f.flush()


def read_records(path: Path) -> list[dict[str, Any]]:
    """Records of one JSON-lines file; a truncated last line (killed writer) is ignored."""
    if not Path(path).exists():
        return []
    records = []
    for line in Path(path).read_text().splitlines():
        line = line.strip()
        if not line:
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return records


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
