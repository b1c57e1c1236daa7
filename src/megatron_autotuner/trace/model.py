"""In-memory form of a loaded trace: compact immutable records plus the file's metadata.

Records are `NamedTuple`s (tuples: small and fast to build for millions of events). Times are
Kineto's: microseconds on the trace's own clock (`ts_us`); absolute time in nanoseconds is
`base_time_ns + ts_us * 1000` when the file has `baseTimeNanoseconds`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, NamedTuple

GPU_EVENT_KINDS = ("kernel", "gpu_memcpy", "gpu_memset")
CPU_RANGE_KINDS = ("cpu_op", "user_annotation")
GPU_RANGE_KIND = "gpu_user_annotation"
LAUNCH_KINDS = ("cuda_runtime", "cuda_driver")


class GpuEvent(NamedTuple):
    """One kernel, memcpy or memset on a GPU stream. `correlation` / `external_id` are -1 when absent."""

    name: str
    kind: str  # Kineto `cat`: kernel | gpu_memcpy | gpu_memset
    ts_us: float
    dur_us: float
    device: int
    stream: int
    correlation: int
    external_id: int

    @property
    def end_us(self) -> float:
        return self.ts_us + self.dur_us


class CpuRange(NamedTuple):
    """A CPU-side range: an operator (`cpu_op`) or a record_function / NVTX-style `user_annotation`."""

    name: str
    kind: str  # cpu_op | user_annotation
    ts_us: float
    dur_us: float
    pid: int | str
    tid: int | str
    external_id: int

    @property
    def end_us(self) -> float:
        return self.ts_us + self.dur_us


class GpuRange(NamedTuple):
    """A `gpu_user_annotation`: a named range drawn on one GPU stream by time."""

    name: str
    ts_us: float
    dur_us: float
    device: int
    stream: int
    external_id: int

    @property
    def end_us(self) -> float:
        return self.ts_us + self.dur_us


# CUDA runtime / driver calls that block the calling host thread until the GPU reaches a point
HOST_SYNC_CALLS = frozenset(
    {
        "cudaEventSynchronize",
        "cudaStreamSynchronize",
        "cudaDeviceSynchronize",
        "cuEventSynchronize",
        "cuStreamSynchronize",
        "cuCtxSynchronize",
    }
)


class HostSync(NamedTuple):
    """A blocking synchronisation call on a host thread (`HOST_SYNC_CALLS`)."""

    name: str
    ts_us: float
    dur_us: float
    pid: int | str
    tid: int | str

    @property
    def end_us(self) -> float:
        return self.ts_us + self.dur_us


class Launch(NamedTuple):
    """CPU side of a correlation id: the runtime/driver call (or ac2g flow start) that enqueued GPU work."""

    pid: int | str
    tid: int | str
    ts_us: float


@dataclass(frozen=True)
class ProcessGroupInfo:
    """One entry of Kineto's `distributedInfo.pg_config`."""

    name: str
    description: str
    size: int
    ranks: tuple[int, ...]
    backend: str


@dataclass(frozen=True)
class DeviceInfo:
    """One entry of Kineto's `deviceProperties`."""

    id: int
    name: str
    total_memory_bytes: int | None
    num_sms: int | None
    compute_capability: str | None


@dataclass(frozen=True)
class TraceMetadata:
    """Top-level facts of a trace file; `extra` keeps every other top-level key as read."""

    rank: int | None = None
    world_size: int | None = None
    backend: str | None = None
    process_groups: tuple[ProcessGroupInfo, ...] = ()
    devices: tuple[DeviceInfo, ...] = ()
    base_time_ns: int | None = None
    schema_version: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "world_size": self.world_size,
            "backend": self.backend,
            "base_time_ns": self.base_time_ns,
            "process_groups": [
                {"name": g.name, "description": g.description, "size": g.size, "ranks": list(g.ranks)}
                for g in self.process_groups
            ],
            "devices": [
                {
                    "id": d.id,
                    "name": d.name,
                    "total_memory_bytes": d.total_memory_bytes,
                    "num_sms": d.num_sms,
                    "compute_capability": d.compute_capability,
                }
                for d in self.devices
            ],
        }


def _int_or_none(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return int(value)
    return None


def metadata_from_top_level(top: dict[str, Any]) -> TraceMetadata:
    """Build `TraceMetadata` from a trace's top-level keys (missing or odd fields become None)."""
    dist = top.get("distributedInfo") if isinstance(top.get("distributedInfo"), dict) else {}
    groups = []
    for g in dist.get("pg_config") or []:
        if not isinstance(g, dict):
            continue
        ranks = g.get("ranks") if isinstance(g.get("ranks"), list) else []
        groups.append(
            ProcessGroupInfo(
                name=str(g.get("pg_name", "")),
                description=str(g.get("pg_desc", "")),
                size=_int_or_none(g.get("pg_size")) or len(ranks),
                ranks=tuple(r for r in (_int_or_none(x) for x in ranks) if r is not None),
                backend=str(g.get("backend_config", "")),
            )
        )
    devices = []
    for d in top.get("deviceProperties") or []:
        if not isinstance(d, dict):
            continue
        major, minor = d.get("computeMajor"), d.get("computeMinor")
        devices.append(
            DeviceInfo(
                id=_int_or_none(d.get("id")) if _int_or_none(d.get("id")) is not None else len(devices),
                name=str(d.get("name", "")),
                total_memory_bytes=_int_or_none(d.get("totalGlobalMem")),
                num_sms=_int_or_none(d.get("numSms")),
                compute_capability=f"{major}.{minor}" if major is not None and minor is not None else None,
            )
        )
    extra = {k: v for k, v in top.items() if k not in ("distributedInfo", "deviceProperties")}
    return TraceMetadata(
        rank=_int_or_none(dist.get("rank")),
        world_size=_int_or_none(dist.get("world_size")),
        backend=str(dist["backend"]) if "backend" in dist else None,
        process_groups=tuple(groups),
        devices=tuple(devices),
        base_time_ns=_int_or_none(top.get("baseTimeNanoseconds")),
        schema_version=_int_or_none(top.get("schemaVersion")),
        extra=extra,
    )


@dataclass(frozen=True, eq=False)
class Trace:
    """A loaded trace. `gpu_events` are sorted by start time; `launches` maps correlation id -> CPU launch;
    `host_syncs` are the host's blocking synchronisation calls, by start time.

    `event_counts` counts every event of the file by `cat` (or `ph:<ph>` when it has none);
    `skipped_events` counts events of a kept kind dropped for a missing/negative `ts` or `dur`.
    """

    path: str
    metadata: TraceMetadata
    gpu_events: tuple[GpuEvent, ...]
    cpu_ranges: tuple[CpuRange, ...]
    gpu_ranges: tuple[GpuRange, ...]
    launches: dict[int, Launch]
    event_counts: dict[str, int]
    skipped_events: int = 0
    process_names: dict[Any, str] = field(default_factory=dict)
    thread_names: dict[tuple[Any, Any], str] = field(default_factory=dict)
    host_syncs: tuple[HostSync, ...] = ()

    @property
    def rank(self) -> int | None:
        return self.metadata.rank

    @cached_property
    def devices(self) -> tuple[int, ...]:
        """Devices that ran at least one GPU event."""
        return tuple(sorted({e.device for e in self.gpu_events}))

    @cached_property
    def streams(self) -> tuple[tuple[int, int], ...]:
        """(device, stream) pairs that ran at least one GPU event."""
        return tuple(sorted({(e.device, e.stream) for e in self.gpu_events}))

    def __repr__(self) -> str:
        return (
            f"Trace(path={self.path!r}, rank={self.metadata.rank}, gpu_events={len(self.gpu_events)}, "
            f"cpu_ranges={len(self.cpu_ranges)}, gpu_ranges={len(self.gpu_ranges)})"
        )
