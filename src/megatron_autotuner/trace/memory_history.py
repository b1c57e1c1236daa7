"""Where reserved-but-unallocated memory comes from: replay a CUDA caching-allocator history.

Input: the dictionary of `torch.cuda.memory._snapshot()` taken while `_record_memory_history(enabled="all")`
was on (pickled, optionally gzipped; the same file pytorch.org/memory_viz opens). Its `device_traces[d]`
lists the allocator's actions in order: `alloc` / `free_requested` / `free_completed` of blocks, and
`segment_alloc` / `segment_map` (cudaMalloc, or a page mapping that grows an expandable segment) /
`segment_free` / `segment_unmap` of reserved memory (PyTorch's `torch.cuda.memory._snapshot` docstring).

Replaying it gives, at every point, the bytes held by blocks (allocated until `free_completed`) and the
bytes reserved. A reservation that grows by `g` bytes for a request of `r` bytes while `f` reserved bytes
were free could, with perfect packing, have grown by only max(0, r - f): the rest,

    excess = g - max(0, r - f),

was needed because the free bytes were in pieces (or in another stream's or the small-block pool). The
requests with the largest excess are where the peak's reserved-unallocated memory came from. What was held at the
peak is grouped by the code that allocated it (the innermost model frame of each live block's `alloc`), so a
predicted memory breakdown can be set beside it part by part.

Pure Python (standard library); the pickle is read with an unpickler that only builds plain containers.
"""

from __future__ import annotations

import gzip
import heapq
import io
import pickle
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from ..files import SNAPSHOT_LIMIT_BYTES, read_bytes_bounded
from ..theory.allocator import K_SMALL_SIZE, round_size
from .errors import TraceError

GROWTH_ACTIONS = ("segment_alloc", "segment_map")
SHRINK_ACTIONS = ("segment_free", "segment_unmap")
# frames from these files say nothing about which model code asked for the memory
_INTERNAL_FRAME_PARTS = (
    "torch/cuda/memory.py",
    "torch/utils/",
    "torch/autograd/function.py",
    "torch/_dynamo/",
    "torch/nn/modules/module.py",
    "<frozen ",
)


class _PlainUnpickler(pickle.Unpickler):
    """A snapshot holds only dicts, lists, strings and numbers: refuse anything that names a class."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"memory snapshot refers to {module}.{name}: not a plain snapshot")


def load_snapshot(path: str | Path) -> dict[str, Any]:
    """Read a `torch.cuda.memory._snapshot()` pickle (`.pickle` or `.pickle.gz`)."""
    p = Path(path)
    raw = read_bytes_bounded(
        p, "snapshot", SNAPSHOT_LIMIT_BYTES, error=lambda problem: TraceError(p, f"cannot be read ({problem})")
    )
    if raw[:2] == b"\x1f\x8b":
        try:
            raw = gzip.decompress(raw)
        except EOFError:
            raise TraceError(p, "truncated gzip stream (compressed file ended before its end marker)") from None
        except (gzip.BadGzipFile, zlib.error, OSError) as exc:
            raise TraceError(p, f"corrupt gzip data ({exc})") from None
    try:
        data = _PlainUnpickler(io.BytesIO(raw)).load()
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError, IndexError, KeyError) as exc:
        raise TraceError(p, f"not a torch memory snapshot pickle ({exc})") from exc
    except (RecursionError, MemoryError) as exc:
        raise TraceError(p, f"not a torch memory snapshot pickle ({type(exc).__name__})") from None
    if not isinstance(data, dict) or "device_traces" not in data:
        raise TraceError(p, "not a torch memory snapshot (no 'device_traces'; record with _record_memory_history)")
    return data


def _frames(entry: dict[str, Any], limit: int = 4) -> list[str]:
    """The innermost Python frames of an event's stack (C++ frames and torch plumbing left out), paths
    shortened to what follows `site-packages/`."""
    out = []
    for fr in entry.get("frames") or []:
        filename = str(fr.get("filename", ""))
        if not filename.endswith(".py") or any(part in filename for part in _INTERNAL_FRAME_PARTS):
            continue
        filename = filename.rsplit("site-packages/", 1)[-1]
        out.append(f"{filename}:{fr.get('line', '?')} {fr.get('name', '')}")
        if len(out) == limit:
            break
    return out


def _state_at_snapshot(snapshot: dict[str, Any], device: int) -> tuple[int, int] | None:
    """(held, reserved) bytes when the snapshot was taken, from its `segments`; None when it has none."""
    segments = [seg for seg in snapshot.get("segments") or [] if int(seg.get("device", device)) == device]
    if not segments:
        return None
    held = sum(int(seg.get("active_size", seg.get("allocated_size", 0))) for seg in segments)
    return held, sum(int(seg.get("total_size", 0)) for seg in segments)


@dataclass(frozen=True)
class Growth:
    """One reservation growth and the request that caused it (bytes)."""

    index: int
    action: str
    growth_bytes: int
    request_bytes: int
    free_before_bytes: int
    held_before_bytes: int
    reserved_after_bytes: int
    frames: tuple[str, ...]

    @property
    def excess_bytes(self) -> int:
        """Growth beyond what the request needed had the free reserved bytes been one piece."""
        return max(0, self.growth_bytes - max(0, self.request_bytes - self.free_before_bytes))

    def to_dict(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "action": self.action,
            "growth_bytes": self.growth_bytes,
            "request_bytes": self.request_bytes,
            "free_before_bytes": self.free_before_bytes,
            "held_before_bytes": self.held_before_bytes,
            "reserved_after_bytes": self.reserved_after_bytes,
            "excess_bytes": self.excess_bytes,
            "frames": list(self.frames),
        }


@dataclass(frozen=True)
class Allocation:
    index: int
    size_bytes: int
    frames: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"index": self.index, "size_bytes": self.size_bytes, "frames": list(self.frames)}


@dataclass(frozen=True)
class HeldSite:
    """Blocks still held at the peak that one code site allocated (blocks from before the history: site '')."""

    site: str
    bytes: int
    blocks: int

    def to_dict(self) -> dict[str, Any]:
        return {"site": self.site, "bytes": self.bytes, "blocks": self.blocks}


@dataclass(frozen=True)
class MemoryHistory:
    """Replay of one device's allocator history.

    `initial_reserved_bytes` / `initial_held_bytes`: what existed before the first recorded event (inferred so
    that neither count goes negative: the history may start late or its ring buffer may have wrapped).
    """

    device: int
    events: int
    initial_reserved_bytes: int
    initial_held_bytes: int
    peak_held_bytes: int
    peak_reserved_bytes: int
    held_at_peak_reserved_bytes: int
    growths: tuple[Growth, ...]
    largest_allocations: tuple[Allocation, ...]
    top: int = 10
    notes: tuple[str, ...] = field(default=())
    held_at_peak_by_site: tuple[HeldSite, ...] = ()
    # of those, the blocks the program had freed whose free awaited an event on another stream (`record_stream`:
    # `free_requested` without `free_completed`): held by the allocator, no longer counted by memory_allocated
    awaiting_at_peak_by_site: tuple[HeldSite, ...] = ()

    @property
    def excess_growth_bytes(self) -> int:
        return sum(g.excess_bytes for g in self.growths)

    @property
    def reserved_unallocated_at_peak_bytes(self) -> int:
        """Peak reserved minus peak held; `max_memory_reserved - max_memory_allocated` reports this plus what awaited
        its free at the peak (`awaiting_at_peak_bytes`), which torch no longer counts as allocated."""
        return self.peak_reserved_bytes - self.peak_held_bytes

    @property
    def awaiting_at_peak_bytes(self) -> int:
        return sum(site.bytes for site in self.awaiting_at_peak_by_site)

    def to_dict(self) -> dict[str, Any]:
        worst = sorted(self.growths, key=lambda g: -g.excess_bytes)[: self.top]
        return {
            "device": self.device,
            "events": self.events,
            "initial_reserved_bytes": self.initial_reserved_bytes,
            "initial_held_bytes": self.initial_held_bytes,
            "peak_held_bytes": self.peak_held_bytes,
            "peak_reserved_bytes": self.peak_reserved_bytes,
            "held_at_peak_reserved_bytes": self.held_at_peak_reserved_bytes,
            "reserved_unallocated_at_peak_bytes": self.reserved_unallocated_at_peak_bytes,
            "growth_events": len(self.growths),
            "growth_bytes": sum(g.growth_bytes for g in self.growths),
            "excess_growth_bytes": self.excess_growth_bytes,
            "largest_excess_growths": [g.to_dict() for g in worst if g.excess_bytes > 0],
            "largest_allocations": [a.to_dict() for a in self.largest_allocations],
            "held_at_peak_by_site": [h.to_dict() for h in self.held_at_peak_by_site[: 3 * self.top]],
            "awaiting_at_peak_bytes": self.awaiting_at_peak_bytes,
            "awaiting_at_peak_by_site": [h.to_dict() for h in self.awaiting_at_peak_by_site[: self.top]],
            "notes": list(self.notes),
        }


def _deltas(event: dict[str, Any], live: dict[Any, int]) -> tuple[int, int]:
    """(held, reserved) byte changes of one event; `live` maps the addresses of held blocks to their sizes."""
    action, size = event.get("action"), int(event.get("size", 0))
    if action == "alloc":
        live[event.get("addr")] = size
        return size, 0
    if action == "free_completed":
        return -live.pop(event.get("addr"), size), 0
    if action in GROWTH_ACTIONS:
        return 0, size
    if action in SHRINK_ACTIONS:
        return 0, -size
    return 0, 0


def _sites(blocks: list[int], trace: list[dict[str, Any]], earlier: int = 0) -> tuple[HeldSite, ...]:
    """Blocks (indices of their `alloc` events) summed by the innermost model frame of the alloc, largest first;
    `earlier`: bytes from before the history, as the site ''."""
    sites: dict[str, list[int]] = {"": [earlier, 0]} if earlier > 0 else {}
    for i in blocks:
        frames = _frames(trace[i], limit=1)
        entry = sites.setdefault(frames[0] if frames else "?", [0, 0])
        entry[0] += int(trace[i].get("size", 0))
        entry[1] += 1
    return tuple(HeldSite(site, b, n) for site, (b, n) in sorted(sites.items(), key=lambda kv: -kv[1][0]))


def _held_by_site(
    trace: list[dict[str, Any]], peak_index: int, initial_held: int
) -> tuple[tuple[HeldSite, ...], tuple[HeldSite, ...]]:
    """(the blocks held right after event `peak_index`, those of them whose free was requested but not yet
    completed), each by `_sites`; what was held before the history began is the site '' of the first."""
    live: dict[Any, int] = {}  # address -> index of its alloc event
    requested: set[Any] = set()  # addresses freed by the program, awaiting an event on another stream
    earlier = initial_held  # of the blocks from before the history, what is still held
    for i, e in enumerate(trace[: peak_index + 1]):
        action, addr = e.get("action"), e.get("addr")
        if action == "alloc":
            live[addr] = i
        elif action == "free_requested" and addr in live:
            requested.add(addr)
        elif action == "free_completed":
            requested.discard(addr)
            if live.pop(addr, None) is None:
                earlier -= int(e.get("size", 0))
    awaiting = [i for addr, i in live.items() if addr in requested]
    return _sites(list(live.values()), trace, earlier), _sites(awaiting, trace)


def replay_history(snapshot: dict[str, Any], device: int | None = None, top: int = 10) -> MemoryHistory:
    """Replay `snapshot["device_traces"][device]` (default: the device with the most events). A snapshot whose
    entries have the wrong shape (not what torch writes) is a one-line `TraceError`."""
    try:
        return _replay_history(snapshot, device, top)
    except (TypeError, ValueError, AttributeError, KeyError, IndexError, OverflowError) as exc:
        if isinstance(exc, (ConfigError, TraceError)):
            raise
        problem = " ".join(str(exc).split())[:200]
        raise TraceError("memory snapshot", f"malformed allocator history ({type(exc).__name__}: {problem})") from None


def _replay_history(snapshot: dict[str, Any], device: int | None, top: int) -> MemoryHistory:
    traces = snapshot.get("device_traces") or []
    if not traces or not any(traces):
        raise TraceError("memory snapshot", "has no allocator history: record it with _record_memory_history()")
    if device is None:
        device = max(range(len(traces)), key=lambda d: len(traces[d] or []))
    if not 0 <= device < len(traces):
        raise ConfigError("device", f"{device} is not in the snapshot (devices 0..{len(traces) - 1})")
    trace = traces[device] or []
    held = reserved = 0
    min_held = min_reserved = 0
    # first pass: how low would the counts go from zero? that much existed before the history began
    live: dict[Any, int] = {}
    for e in trace:
        d_held, d_reserved = _deltas(e, live)
        held, reserved = held + d_held, reserved + d_reserved
        min_held, min_reserved = min(min_held, held), min(min_reserved, reserved)
    initial_held, initial_reserved = -min_held, -min_reserved
    final = _state_at_snapshot(snapshot, device)
    if final is not None:  # what the segments held at the end, less what the history added
        initial_held = max(initial_held, final[0] - held)
        initial_reserved = max(initial_reserved, final[1] - reserved)
    notes = []
    if initial_held or initial_reserved:
        notes.append(
            "the history starts after memory was already held or reserved (recording started late or its ring "
            "buffer wrapped): counts start from what the snapshot's segments imply"
        )
    held, reserved = initial_held, initial_reserved
    peak_held, peak_reserved, held_at_peak = held, reserved, held
    peak_index = -1
    live.clear()
    growths: list[Growth] = []
    allocations: list[tuple[int, int]] = []  # (size, event index) of every alloc
    pending: list[tuple[int, str, int, int, int]] = []  # growths waiting for the request that caused them
    for i, e in enumerate(trace):
        action = e.get("action")
        if action in GROWTH_ACTIONS:
            pending.append((i, action, int(e.get("size", 0)), reserved - held, held))
        elif action == "alloc" and pending:
            frames = tuple(_frames(e))
            size = int(e.get("size", 0))
            for index, act, grown, free_before, held_before in pending:
                growths.append(Growth(index, act, grown, size, free_before, held_before, reserved, frames))
            pending.clear()
        d_held, d_reserved = _deltas(e, live)
        held, reserved = held + d_held, reserved + d_reserved
        if d_reserved > 0 and reserved > peak_reserved:
            peak_reserved, held_at_peak = reserved, held
        if d_held > 0:
            if held > peak_held:
                peak_held, peak_index = held, i
            if reserved == peak_reserved:
                held_at_peak = max(held_at_peak, held)
            allocations.append((d_held, i))
    for index, act, grown, free_before, held_before in pending:  # growth with no request after it (OOM)
        growths.append(Growth(index, act, grown, 0, free_before, held_before, reserved, ()))
    largest = tuple(
        Allocation(i, size, tuple(_frames(trace[i])))
        for size, i in heapq.nlargest(top, allocations, key=lambda a: (a[0], -a[1]))  # ties: earliest first
    )
    held_sites, awaiting_sites = _held_by_site(trace, peak_index, initial_held)
    return MemoryHistory(
        held_at_peak_by_site=held_sites,
        awaiting_at_peak_by_site=awaiting_sites,
        device=device,
        events=len(trace),
        initial_reserved_bytes=initial_reserved,
        initial_held_bytes=initial_held,
        peak_held_bytes=peak_held,
        peak_reserved_bytes=peak_reserved,
        held_at_peak_reserved_bytes=held_at_peak,
        growths=tuple(growths),
        largest_allocations=largest,
        top=top,
        notes=tuple(notes),
    )


def large_pool_requests(snapshot: dict[str, Any], device: int = 0) -> list[tuple[str, str, int]]:
    """The large-pool requests of one device's history as `theory.allocator.large_pool_peak` replays them:
    ("alloc", address, bytes) for every `alloc` above 1 MiB after rounding, ("free", address, 0) at its
    `free_completed`. Streams are not told apart (one pool), and blocks freed before the history began are
    skipped, so the replay stands for the recorded reserved memory only where the history starts with the
    process (no reserved memory before its first event)."""
    traces = snapshot.get("device_traces") or []
    if not 0 <= device < len(traces):
        raise ConfigError("device", f"{device} is not in the snapshot (devices 0..{len(traces) - 1})")
    requests: list[tuple[str, str, int]] = []
    live: set[str] = set()
    for event in traces[device] or []:
        action, size, addr = event.get("action"), int(event.get("size", 0)), str(event.get("addr"))
        if round_size(size) <= K_SMALL_SIZE:
            continue
        if action == "alloc":
            requests.append(("alloc", addr, size))
            live.add(addr)
        elif action == "free_completed" and addr in live:
            requests.append(("free", addr, 0))
            live.discard(addr)
    return requests
