"""JSON-lines result records: appended and flushed one by one, so a sweep killed at any moment loses only the
item it was on, and a rerun finds every finished one."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .. import SCHEMA_VERSION, __version__

LAUNCHER_FILE = "launcher.jsonl"  # failures the launcher itself saw: timeouts, crashed jobs, too few GPUs


def append_record(path: Path, record: dict[str, Any]) -> None:
    """Append one record (with schema and tool version) and flush it to disk at once."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    record = {"schema_version": SCHEMA_VERSION, "tool_version": __version__, **record}
    with open(path, "a") as f:
        f.write(json.dumps(record) + "\n")
        f.flush()


def read_records(path: Path) -> list[dict[str, Any]]:
    """The JSON objects of one JSON-lines file; a line that is not a JSON object (a writer killed mid-line,
    bytes that are not UTF-8) is skipped."""
    if not Path(path).exists():
        return []
    records = []
    for line in Path(path).read_text(errors="replace").splitlines():
        line = line.strip()
        if not line:
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(record, dict):
            records.append(record)
    return records
