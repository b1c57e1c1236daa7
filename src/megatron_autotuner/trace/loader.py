"""`load_trace`: stream a Kineto trace into compact records (see `jsonstream` for the parsing)."""

from __future__ import annotations

from os import PathLike
from typing import Any

from .jsonstream import DEFAULT_CHUNK_CHARS, TraceReader
from .model import (
    CPU_RANGE_KINDS,
    GPU_EVENT_KINDS,
    GPU_RANGE_KIND,
    HOST_SYNC_CALLS,
    LAUNCH_KINDS,
    CpuRange,
    GpuEvent,
    GpuRange,
    HostSync,
    Launch,
    Trace,
    metadata_from_top_level,
)

_GPU_KINDS = frozenset(GPU_EVENT_KINDS)
_CPU_KINDS = frozenset(CPU_RANGE_KINDS)
_LAUNCH_KINDS = frozenset(LAUNCH_KINDS)


def _num(value: Any) -> float | None:
    t = type(value)
    if t is float or t is int:
        return float(value)
    return None


def _int(value: Any, default: int = -1) -> int:
    return value if type(value) is int else default


def load_trace(path: str | PathLike[str], chunk_chars: int = DEFAULT_CHUNK_CHARS) -> Trace:
    """Load a `.json` / `.json.gz` Kineto trace (gzip is detected by content, not by suffix).

    Keeps GPU events (`cat` kernel, gpu_memcpy, gpu_memset), CPU ranges (`cpu_op`,
    `user_annotation`), `gpu_user_annotation` ranges, and the CPU side of each correlation id
    (from `cuda_runtime` / `cuda_driver` events carrying `args.correlation`, else from the start
    of the `ac2g` flow with that id), and the runtime / driver calls that block the host (`HOST_SYNC_CALLS`).
    Raises `TraceError` naming the file for broken input.
    """
    names: dict[str, str] = {}
    intern = names.setdefault
    gpu_events: list[GpuEvent] = []
    cpu_ranges: list[CpuRange] = []
    gpu_ranges: list[GpuRange] = []
    launches: dict[int, Launch] = {}
    host_syncs: list[HostSync] = []
    flow_starts: dict[int, Launch] = {}
    counts: dict[str, int] = {}
    process_names: dict[Any, str] = {}
    thread_names: dict[tuple[Any, Any], str] = {}
    skipped = 0

    with TraceReader(path, chunk_chars=chunk_chars) as reader:
        for e in reader.events():
            cat = e.get("cat")
            ph = e.get("ph")
            key = cat if type(cat) is str else f"ph:{ph}"
            counts[key] = counts.get(key, 0) + 1
            if ph == "X":
                if cat in _GPU_KINDS:
                    ts, dur = _num(e.get("ts")), _num(e.get("dur"))
                    if ts is None or dur is None or dur < 0:
                        skipped += 1
                        continue
                    args = e.get("args") or {}
                    name = str(e.get("name", ""))
                    pid = e.get("pid")
                    device = args.get("device")
                    if type(device) is not int:
                        device = pid if type(pid) is int else -1
                    stream = args.get("stream")
                    if type(stream) is not int:
                        tid = e.get("tid")
                        stream = tid if type(tid) is int else -1
                    gpu_events.append(
                        GpuEvent(
                            intern(name, name),
                            cat,
                            ts,
                            dur,
                            device,
                            stream,
                            _int(args.get("correlation")),
                            _int(args.get("External id")),
                        )
                    )
                elif cat in _CPU_KINDS:
                    ts, dur = _num(e.get("ts")), _num(e.get("dur"))
                    if ts is None or dur is None or dur < 0:
                        skipped += 1
                        continue
                    args = e.get("args") or {}
                    name = str(e.get("name", ""))
                    cpu_ranges.append(
                        CpuRange(
                            intern(name, name),
                            cat,
                            ts,
                            dur,
                            e.get("pid"),
                            e.get("tid"),
                            _int(args.get("External id")),
                        )
                    )
                elif cat in _LAUNCH_KINDS:
                    args = e.get("args")
                    corr = args.get("correlation") if args else None
                    ts = _num(e.get("ts"))
                    if type(corr) is int and ts is not None:
                        launches[corr] = Launch(e.get("pid"), e.get("tid"), ts)
                    name = e.get("name")
                    if name in HOST_SYNC_CALLS:
                        dur = _num(e.get("dur"))
                        if ts is None or dur is None or dur < 0:
                            skipped += 1
                            continue
                        host_syncs.append(HostSync(name, ts, dur, e.get("pid"), e.get("tid")))
                elif cat == GPU_RANGE_KIND:
                    ts, dur = _num(e.get("ts")), _num(e.get("dur"))
                    if ts is None or dur is None or dur < 0:
                        skipped += 1
                        continue
                    args = e.get("args") or {}
                    pid, tid = e.get("pid"), e.get("tid")
                    device = args.get("device")
                    if type(device) is not int:
                        device = pid if type(pid) is int else -1
                    stream = args.get("stream")
                    if type(stream) is not int:
                        stream = tid if type(tid) is int else -1
                    name = str(e.get("name", ""))
                    gpu_ranges.append(
                        GpuRange(intern(name, name), ts, dur, device, stream, _int(args.get("External id")))
                    )
            elif ph == "s" and cat == "ac2g":
                fid, ts = e.get("id"), _num(e.get("ts"))
                if type(fid) is int and ts is not None:
                    flow_starts[fid] = Launch(e.get("pid"), e.get("tid"), ts)
            elif ph == "M":
                args = e.get("args") or {}
                if e.get("name") == "process_name" and "name" in args:
                    process_names[e.get("pid")] = str(args["name"])
                elif e.get("name") == "thread_name" and "name" in args:
                    thread_names[(e.get("pid"), e.get("tid"))] = str(args["name"]).strip()
        top = reader.metadata

    for corr, launch in flow_starts.items():
        launches.setdefault(corr, launch)
    gpu_events.sort(key=lambda ev: (ev.ts_us, ev.dur_us))
    cpu_ranges.sort(key=lambda r: (r.ts_us, -r.dur_us))
    gpu_ranges.sort(key=lambda r: (r.ts_us, -r.dur_us))
    return Trace(
        path=str(path),
        metadata=metadata_from_top_level(top),
        gpu_events=tuple(gpu_events),
        cpu_ranges=tuple(cpu_ranges),
        gpu_ranges=tuple(gpu_ranges),
        launches=launches,
        event_counts=counts,
        skipped_events=skipped,
        process_names=process_names,
        thread_names=thread_names,
        host_syncs=tuple(sorted(host_syncs, key=lambda h: h.ts_us)),
    )
