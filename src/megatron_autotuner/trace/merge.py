"""Merge the traces of N ranks into one Chrome/Perfetto trace, one process per rank.

Each rank becomes process `pid = R` named "rank R" (`process_name`, `process_sort_index = R`).
Its CPU threads and GPU streams become threads of that process, named
"<original process label> / <original thread name>" (e.g. "GPU 0 / stream 7"), CPU first.
Flow ids (`ac2g`, `fwdbwd`) are renumbered `id * N + position` so arrows never cross ranks.

Time alignment: Kineto timestamps are microseconds from the clock whose origin is
`baseTimeNanoseconds`; ranks of one job normally share it, so their `ts` line up as written.
Rank R is shifted by `shift_us(R) = (base_ns(R) − min over ranks of base_ns) / 1000 + offsets_us[R]`
and the merged file's `baseTimeNanoseconds` is that minimum. Use `offsets_us` to correct a
known clock skew between hosts (positive moves rank R later).

The output (`.json`, or gzip when the name ends in `.gz`) is written to a temporary file in the
destination folder and renamed at the end: a bad input raises `TraceError` naming it and leaves
nothing behind.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from os import PathLike
from pathlib import Path
from typing import IO, Any

from .. import SCHEMA_VERSION, __version__
from ..errors import ConfigError
from ..files import check_output_file, refuse_overwriting_inputs
from .errors import TraceError
from .jsonstream import TraceReader
from .model import GPU_EVENT_KINDS, GPU_RANGE_KIND, metadata_from_top_level

_GPU_CATS = frozenset((*GPU_EVENT_KINDS, GPU_RANGE_KIND))
_FLOW_PHASES = frozenset(("s", "t", "f"))
_DROPPED_METADATA = frozenset(
    ("process_name", "process_labels", "process_sort_index", "thread_name", "thread_sort_index")
)


@dataclass(frozen=True)
class MergedRank:
    rank: int
    path: str
    shift_us: float
    events: int
    gpu_events: int

    def to_dict(self) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "path": self.path,
            "shift_us": self.shift_us,
            "events": self.events,
            "gpu_events": self.gpu_events,
        }


@dataclass(frozen=True)
class MergeResult:
    out: str
    base_time_ns: int | None
    ranks: tuple[MergedRank, ...]

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema_version": SCHEMA_VERSION,
            "tool_version": __version__,
            "out": self.out,
            "base_time_ns": self.base_time_ns,
            "ranks": [r.to_dict() for r in self.ranks],
        }


@dataclass
class _Input:
    path: str
    rank: int
    base_ns: int | None
    top: dict[str, Any]


def _read_header(path: str) -> tuple[dict[str, Any], bool]:
    with TraceReader(path) as reader:
        top = dict(reader.header())
        bare = reader.bare_array
        if not bare and ("baseTimeNanoseconds" not in top or "distributedInfo" not in top):
            # Kineto writes these before traceEvents; other writers may put them after it.
            for _ in reader.events():
                pass
            top = dict(reader.metadata)
    return top, bare


def _prepare(paths: Sequence[str | PathLike[str]]) -> list[_Input]:
    inputs: list[_Input] = []
    by_rank: dict[int, str] = {}
    for position, p in enumerate(paths):
        path = str(p)
        top, _ = _read_header(path)
        meta = metadata_from_top_level(top)
        rank = meta.rank if meta.rank is not None else position
        if rank in by_rank:
            raise TraceError(path, f"rank {rank} is also the rank of {by_rank[rank]}; merge needs distinct ranks")
        by_rank[rank] = path
        inputs.append(_Input(path, rank, meta.base_time_ns, top))
    return inputs


def alignment_shifts_us(bases_ns: Sequence[int | None], offsets_us: Sequence[float]) -> list[float]:
    """Per trace, the shift that puts it on the clock of the earliest one (the module doc's `shift_us`): its
    baseTimeNanoseconds less the smallest, in us, plus its offset; a trace without a base time gets its offset only."""
    known = [b for b in bases_ns if b is not None]
    ref = min(known) if known else None
    return [
        (0.0 if b is None or ref is None else (b - ref) / 1000.0) + offset
        for b, offset in zip(bases_ns, offsets_us, strict=True)
    ]


def _track_id(value: Any) -> Any:
    """A trace's pid / tid as a key: an int or a string as Chrome's format has them, anything else (null, a list
    from a broken trace) as its text, so it can key the track tables and sort beside the others."""
    return value if type(value) in (int, str) else str(value)


class _RankWriter:
    """Rewrites the events of one rank into the merged stream."""

    def __init__(self, rank: int, position: int, n_inputs: int, shift_us: float):
        self.rank = rank
        self.position = position
        self.n_inputs = n_inputs
        self.shift_us = shift_us
        self.tids: dict[tuple[Any, Any], int] = {}
        self.process_labels: dict[Any, str] = {}
        self.process_names: dict[Any, str] = {}
        self.thread_names: dict[tuple[Any, Any], str] = {}
        self.gpu_pids: set[Any] = set()
        self.events = 0
        self.gpu_events = 0

    def _flow_id(self, value: Any) -> Any:
        if type(value) is int and value >= 0:
            return value * self.n_inputs + self.position
        return f"r{self.rank}:{value}"

    def rewrite(self, e: dict[str, Any]) -> dict[str, Any] | None:
        ph = e.get("ph")
        pid, tid = _track_id(e.get("pid")), _track_id(e.get("tid"))
        if ph == "M":
            name = e.get("name")
            args = e.get("args") or {}
            if name == "process_labels":
                self.process_labels[pid] = str(args.get("labels", ""))
            elif name == "process_name":
                self.process_names[pid] = str(args.get("name", ""))
            elif name == "thread_name":
                self.thread_names[(pid, tid)] = str(args.get("name", "")).strip()
            if name in _DROPPED_METADATA:
                return None
        cat = e.get("cat")
        if cat in _GPU_CATS:
            self.gpu_pids.add(pid)
            if cat != GPU_RANGE_KIND and ph == "X":
                self.gpu_events += 1
        key = (pid, tid)
        new_tid = self.tids.get(key)
        if new_tid is None:
            new_tid = self.tids[key] = len(self.tids) + 1
        e["pid"] = self.rank
        e["tid"] = new_tid
        if self.shift_us:
            ts = e.get("ts")
            if type(ts) is float or type(ts) is int:
                e["ts"] = ts + self.shift_us
        if ph in _FLOW_PHASES and "id" in e:
            e["id"] = self._flow_id(e["id"])
        if "bind_id" in e:
            e["bind_id"] = self._flow_id(e["bind_id"])
        self.events += 1
        return e

    def metadata_events(self, source: str) -> list[dict[str, Any]]:
        r = self.rank
        out: list[dict[str, Any]] = [
            {"name": "process_name", "ph": "M", "pid": r, "tid": 0, "args": {"name": f"rank {r}"}},
            {"name": "process_sort_index", "ph": "M", "pid": r, "tid": 0, "args": {"sort_index": r}},
            {"name": "process_labels", "ph": "M", "pid": r, "tid": 0, "args": {"labels": Path(source).name}},
        ]

        def proc_label(pid: Any) -> str:
            label = self.process_labels.get(pid)
            if label:
                return label
            if pid in self.gpu_pids:
                return f"GPU {pid}"
            return self.process_names.get(pid) or str(pid)

        def order(key: tuple[Any, Any]) -> tuple[int, str, int, str]:
            pid, tid = key
            group = 1 if (pid in self.gpu_pids or proc_label(pid).startswith("GPU")) else 0
            if isinstance(pid, str):
                group = 2
            return (group, f"{pid:>20}" if type(pid) is int else f"{pid}", tid if type(tid) is int else 0, str(tid))

        for sort_index, key in enumerate(sorted(self.tids, key=order)):
            pid, tid = key
            thread = self.thread_names.get(key) or (f"stream {tid}" if pid in self.gpu_pids else f"thread {tid}")
            new_tid = self.tids[key]
            out.append(
                {
                    "name": "thread_name",
                    "ph": "M",
                    "pid": r,
                    "tid": new_tid,
                    "args": {"name": f"{proc_label(pid)} / {thread}"},
                }
            )
            out.append(
                {"name": "thread_sort_index", "ph": "M", "pid": r, "tid": new_tid, "args": {"sort_index": sort_index}}
            )
        return out


def _open_output(tmp_path: str, compress: bool) -> IO[str]:
    if compress:
        return gzip.open(tmp_path, "wt", encoding="utf-8", compresslevel=6)
    return open(tmp_path, "w", encoding="utf-8")  # noqa: SIM115 - closed by the caller


def merge_traces(
    paths: Sequence[str | PathLike[str]],
    out: str | PathLike[str],
    offsets_us: Mapping[int, float] | None = None,
) -> MergeResult:
    """Merge rank traces into `out` (gzip when it ends in `.gz`); see the module docstring."""
    if not paths:
        raise ConfigError("paths", "give at least one trace to merge")
    check_output_file(out, "output")
    refuse_overwriting_inputs(out, paths, "output")
    inputs = _prepare(paths)
    offsets = dict(offsets_us or {})
    unknown = sorted(set(offsets) - {i.rank for i in inputs})
    if unknown:
        raise ConfigError("offset_us", f"no input has rank {unknown[0]} (ranks: {sorted(i.rank for i in inputs)})")
    bases = [i.base_ns for i in inputs if i.base_ns is not None]
    ref_ns = min(bases) if bases else None

    out_path = Path(out)
    compress = out_path.name.endswith(".gz")
    out_dir = out_path.parent if str(out_path.parent) else Path(".")
    try:
        fd, tmp_path = tempfile.mkstemp(prefix=f".{out_path.name}.", suffix=".tmp", dir=out_dir)
        os.close(fd)
    except OSError as exc:
        raise TraceError(out_path, f"cannot write output: {exc.strerror or exc}") from None

    ranks: list[MergedRank] = []
    dumps = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=True).encode
    try:
        with _open_output(tmp_path, compress) as f:
            f.write('{"schemaVersion":1,"displayTimeUnit":"ms",')
            if ref_ns is not None:
                f.write(f'"baseTimeNanoseconds":{ref_ns},')
            f.write('"traceEvents":[\n')
            first = True
            ordered = sorted(inputs, key=lambda i: i.rank)
            shifts = alignment_shifts_us([i.base_ns for i in ordered], [offsets.get(i.rank, 0.0) for i in ordered])
            for position, (item, shift) in enumerate(zip(ordered, shifts, strict=True)):
                writer = _RankWriter(item.rank, position, len(inputs), shift)
                with TraceReader(item.path) as reader:
                    for e in reader.events():
                        new = writer.rewrite(e)
                        if new is None:
                            continue
                        if not first:
                            f.write(",\n")
                        f.write(dumps(new))
                        first = False
                for m in writer.metadata_events(item.path):
                    if not first:
                        f.write(",\n")
                    f.write(dumps(m))
                    first = False
                ranks.append(MergedRank(item.rank, item.path, shift, writer.events, writer.gpu_events))
            f.write("\n],\n")
            info = {
                "schema_version": SCHEMA_VERSION,
                "tool": f"megatron-autotuner {__version__}",
                "ranks": [
                    {
                        **r.to_dict(),
                        "distributedInfo": next(i.top.get("distributedInfo") for i in inputs if i.rank == r.rank),
                    }
                    for r in ranks
                ],
            }
            f.write(f'"mergedBy":{dumps(info)}\n}}\n')
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp_path, 0o666 & ~umask)
        os.replace(tmp_path, out_path)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp_path)
        if isinstance(exc, OSError) and not isinstance(exc, TraceError):
            raise TraceError(out_path, f"cannot write output: {exc.strerror or exc}") from None
        raise
    return MergeResult(str(out_path), ref_ns, tuple(ranks))
