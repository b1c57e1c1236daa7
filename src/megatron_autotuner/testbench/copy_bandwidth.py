"""Host <-> device copy bandwidth: H2D and D2H, pinned and pageable host memory, 1 MiB up to the largest size free
host and device memory allow, each timed with CUDA events (median of repeats) on its own stream.

    torchrun --nproc-per-node W -m megatron_autotuner.testbench.copy_bandwidth --out-dir D [--max-gib 16]

Every row names the traffic that ran beside the copy (`interference`):
- "none": the copy alone;
- "hbm_d2d": a second CUDA stream on the same GPU runs device-to-device copies of two large buffers (reading and
  writing HBM), enqueued before the timed copy and long enough to outlast it;
- "nccl_allreduce" (world size >= 2 only): every rank runs NCCL all-reduces of a large buffer, enqueued before
  rank 0's timed copy and long enough to outlast it. NCCL refuses two ranks on one device, so one GPU cannot run it;
- "nccl_loopback" (world size 1 only): a one-rank NCCL communicator runs all-reduces with op AVG of a large buffer.
  With one rank NCCL skips the network and runs a local kernel for ops that must scale (AVG, PREMUL_SUM: its
  one-rank reduce kernel), on SMs and HBM; a one-rank SUM or a send/recv to itself would only be a cudaMemcpy on a
  copy engine (an all_to_all_single to itself measured as `Memcpy DtoD` on an H100). It is NCCL kernel traffic on
  the copy's GPU, without NVLink or PCIe traffic; the kernel names that ran are kept with the rows;
- "gemm": a second stream runs bf16 GEMMs (SM- and HBM-bound compute, what activation offloading hides behind).
Rank 0 measures and writes D/copy_bandwidth/rank_0.jsonl (one JSON line per row) and D/copy_bandwidth/summary.json;
other ranks only take part in the all-reduces.

Pageable copies go through the CUDA driver's staging buffers (synchronous for the host); pinned ones are async DMA.
These are the two cases verl's offload meets: `.cpu().pin_memory()` and `.to("cpu", non_blocking=True)` (torch's
`_to_copy` allocates a pinned destination for a non-blocking CUDA->CPU copy), then `.copy_(..., non_blocking=True)`
or `.to(device, non_blocking=True)` back from pinned memory (verl/utils/megatron_utils.py).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
from pathlib import Path
from typing import Any

from ..costmodel.calibration import COPY_INTERFERENCES
from ..specs.hardware import GIB, MIB

DIRECTIONS = ("h2d", "d2h")
INTERFERENCES = COPY_INTERFERENCES  # one list: what a calibration file may hold
SINGLE_GPU_ONLY = ("nccl_loopback",)
MULTI_GPU_ONLY = ("nccl_allreduce",)
# host buffers (a pinned and a pageable one) may take this fraction of MemAvailable each; the device buffer this
# fraction of free device memory (the d2d interference buffers take another 2 x HBM_BUFFER_BYTES)
HOST_FRACTION = 0.2
DEVICE_FRACTION = 0.4
HBM_BUFFER_BYTES = GIB
ALLREDUCE_BYTES = 256 * MIB
GEMM_DIM = 8192  # bf16 8192^3: ~1.1 TFLOP, ~2 ms on an H100
# the interfering work is enqueued to last this many times the copy's own (alone) time, plus two launches
OUTLAST_FACTOR = 2.0
MAX_INTERFERING_LAUNCHES = 4096


def copy_sizes(max_bytes: int, min_bytes: int = MIB, factor: int = 4) -> list[int]:
    """1 MiB, 4 MiB, 16 MiB, ... up to `max_bytes` (the largest power-of-`factor` multiple not above it), and
    `max_bytes` itself when it is a whole GiB beyond the last step."""
    if max_bytes < min_bytes:
        return []
    sizes = [min_bytes]
    while sizes[-1] * factor <= max_bytes:
        sizes.append(sizes[-1] * factor)
    if max_bytes > sizes[-1] and max_bytes % GIB == 0:
        sizes.append(max_bytes)
    return sizes


def max_copy_bytes(cap_bytes: int, host_available_bytes: int, device_free_bytes: int) -> int:
    """The largest copy to measure: `cap_bytes`, bounded by the host and device shares, rounded down to whole MiB."""
    limit = min(cap_bytes, int(HOST_FRACTION * host_available_bytes), int(DEVICE_FRACTION * device_free_bytes))
    return limit // MIB * MIB


def host_available_bytes() -> int:
    """MemAvailable from /proc/meminfo (Linux), else the physical memory."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def interfering_launches(copy_s: float, launch_s: float) -> int:
    """How many interfering kernels (each `launch_s` long alone) to enqueue so they outlast a copy of `copy_s`."""
    if launch_s <= 0:
        return 2
    return min(MAX_INTERFERING_LAUNCHES, math.ceil(OUTLAST_FACTOR * copy_s / launch_s) + 2)


NOT_RUN_REASON = {
    "nccl_allreduce": "needs world size >= 2 (NCCL refuses two ranks on one GPU; one GPU runs nccl_loopback)",
    "nccl_loopback": "runs on one GPU only (with two or more, nccl_allreduce is the real traffic)",
}


def runnable_interferences(wanted: list[str], world: int) -> list[str]:
    """The asked interferences that `world` ranks can run, "none" first (the others size their traffic from the
    copy alone)."""
    keep = [x for x in wanted if not (x in MULTI_GPU_ONLY and world < 2) and not (x in SINGLE_GPU_ONLY and world > 1)]
    return ["none"] + [x for x in keep if x != "none"]


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _stats_ms(values: list[float]) -> dict[str, float]:
    return {
        "median": statistics.median(values),
        "min": min(values),
        "max": max(values),
        "n": len(values),
    }


class _Bench:
    """Buffers and streams of one GPU; times copies and the interfering work."""

    def __init__(self, torch, max_bytes: int, world: int, rank: int) -> None:
        self.torch = torch
        self.world = world
        self.rank = rank
        self.copy_stream = torch.cuda.Stream()
        self.side_stream = torch.cuda.Stream()
        self.device_buf = torch.empty(max_bytes, dtype=torch.uint8, device="cuda") if rank == 0 else None
        self.pinned = torch.empty(max_bytes, dtype=torch.uint8, pin_memory=True) if rank == 0 else None
        self.pageable = torch.ones(max_bytes, dtype=torch.uint8) if rank == 0 else None  # pages touched
        hbm = HBM_BUFFER_BYTES if rank == 0 else 0
        self.hbm_src = torch.empty(hbm, dtype=torch.uint8, device="cuda")
        self.hbm_dst = torch.empty(hbm, dtype=torch.uint8, device="cuda")
        self.allreduce_buf = torch.ones(ALLREDUCE_BYTES // 4, dtype=torch.float32, device="cuda") if world > 1 else None
        self.loopback_in = None
        self.gemm_a = self.gemm_out = None
        self.nccl_kernels: list[str] = []

    def prepare(self, interferences: list[str]) -> None:
        """Allocate the buffers of the interfering work asked for."""
        torch = self.torch
        if "nccl_loopback" in interferences:
            self.loopback_in = torch.ones(ALLREDUCE_BYTES // 4, dtype=torch.float32, device="cuda")
        if "gemm" in interferences:
            self.gemm_a = torch.randn(GEMM_DIM, GEMM_DIM, dtype=torch.bfloat16, device="cuda")
            self.gemm_out = torch.empty_like(self.gemm_a)

    def _events(self):
        return [self.torch.cuda.Event(enable_timing=True) for _ in range(2)]

    def time_copy(self, direction: str, pinned: bool, nbytes: int) -> float:
        """Seconds of one copy on the copy stream (CUDA events)."""
        host = (self.pinned if pinned else self.pageable)[:nbytes]
        dev = self.device_buf[:nbytes]
        start, end = self._events()
        with self.torch.cuda.stream(self.copy_stream):
            start.record()
            if direction == "h2d":
                dev.copy_(host, non_blocking=pinned)
            else:
                host.copy_(dev, non_blocking=pinned)
            end.record()
        end.synchronize()
        return start.elapsed_time(end) * 1e-3

    # one launch of each kind of interfering work (the collectives asynchronous when asked)
    def _hbm_copy(self) -> None:
        self.hbm_dst.copy_(self.hbm_src, non_blocking=True)

    def _gemm(self) -> None:
        self.torch.matmul(self.gemm_a, self.gemm_a, out=self.gemm_out)

    def _allreduce(self, async_op: bool = False) -> Any:
        return self.torch.distributed.all_reduce(self.allreduce_buf, async_op=async_op)

    def _loopback(self, async_op: bool = False) -> Any:
        dist = self.torch.distributed
        return dist.all_reduce(self.loopback_in, op=dist.ReduceOp.AVG, async_op=async_op)

    def _median_launch_s(self, launch, stream=None, repeats: int = 5) -> float:
        """Median seconds of one `launch()` from an idle GPU (CUDA events on `stream`, else the current stream)."""
        times = []
        for _ in range(repeats):
            self.torch.cuda.synchronize()
            start, end = self._events()
            with self.torch.cuda.stream(stream):  # None: the current stream
                start.record()
                launch()
                end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) * 1e-3)
        return statistics.median(times)

    def _enqueue_on_side(self, launch, launches: int) -> None:
        with self.torch.cuda.stream(self.side_stream):
            for _ in range(launches):
                launch()

    def enqueue_hbm(self, launches: int) -> None:
        self._enqueue_on_side(self._hbm_copy, launches)

    def time_hbm_launch(self) -> float:
        return self._median_launch_s(self._hbm_copy, self.side_stream)

    def enqueue_allreduce(self, launches: int) -> list[Any]:
        return [self._allreduce(async_op=True) for _ in range(launches)]

    def time_allreduce(self) -> float:
        return self._median_launch_s(self._allreduce)

    def enqueue_loopback(self, launches: int) -> list[Any]:
        return [self._loopback(async_op=True) for _ in range(launches)]

    def time_loopback(self) -> float:
        return self._median_launch_s(self._loopback)

    def loopback_kernel_names(self) -> list[str]:
        """The GPU kernels (and copies) one loop-back all-reduce ran, from torch.profiler."""
        from torch.profiler import ProfilerActivity, profile

        self.torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            self._loopback()
            self.torch.cuda.synchronize()
        return sorted({e.name for e in prof.events() if e.device_type.name == "CUDA"})

    def enqueue_gemm(self, launches: int) -> None:
        self._enqueue_on_side(self._gemm, launches)

    def time_gemm(self) -> float:
        return self._median_launch_s(self._gemm, self.side_stream)

    def agree(self, value: int) -> int:
        """Rank 0's integer on every rank (a broadcast; the value only matters on rank 0 before)."""
        if self.world == 1:
            return value
        t = self.torch.tensor([value], dtype=self.torch.int64, device="cuda")
        self.torch.distributed.broadcast(t, src=0)
        return int(t.item())


def measure(
    sizes: list[int], repeats: int, warmup: int, interferences: list[str], bench: _Bench
) -> list[dict[str, Any]]:
    """Rows of every size x direction x pinned x interference (rank 0 returns them; other ranks an empty list)."""
    torch = bench.torch
    rows: list[dict[str, Any]] = []
    lead = bench.rank == 0
    hbm_launch_s = bench.time_hbm_launch() if lead and "hbm_d2d" in interferences else None
    allreduce_s = bench.time_allreduce() if "nccl_allreduce" in interferences else None
    loopback_s = bench.time_loopback() if "nccl_loopback" in interferences else None
    if loopback_s is not None:
        bench.nccl_kernels = bench.loopback_kernel_names()
    gemm_s = bench.time_gemm() if lead and "gemm" in interferences else None
    for nbytes in sizes:
        for direction in DIRECTIONS:
            for pinned in (True, False):
                alone_s = None
                for interference in interferences:
                    times: list[float] = []
                    detail: dict[str, Any] = {}
                    for i in range(warmup + repeats):
                        works = []
                        if interference == "nccl_allreduce":
                            launches = bench.agree(interfering_launches(alone_s or 0.0, allreduce_s) if lead else 0)
                            detail = {
                                "allreduce_bytes": ALLREDUCE_BYTES,
                                "allreduce_alone_s": allreduce_s,
                                "launches": launches,
                                "world_size": bench.world,
                            }
                            works = bench.enqueue_allreduce(launches)
                        if lead:
                            if interference == "hbm_d2d":
                                launches = interfering_launches(alone_s or 0.0, hbm_launch_s)
                                detail = {
                                    "d2d_copy_bytes": HBM_BUFFER_BYTES,
                                    "d2d_copy_alone_s": hbm_launch_s,
                                    "launches": launches,
                                }
                                bench.enqueue_hbm(launches)
                            elif interference == "nccl_loopback":
                                launches = interfering_launches(alone_s or 0.0, loopback_s)
                                detail = {
                                    "loopback_bytes": ALLREDUCE_BYTES,
                                    "loopback_alone_s": loopback_s,
                                    "launches": launches,
                                    "kernels": bench.nccl_kernels,
                                }
                                works = bench.enqueue_loopback(launches)
                            elif interference == "gemm":
                                launches = interfering_launches(alone_s or 0.0, gemm_s)
                                detail = {"gemm_dim": GEMM_DIM, "gemm_alone_s": gemm_s, "launches": launches}
                                bench.enqueue_gemm(launches)
                            seconds = bench.time_copy(direction, pinned, nbytes)
                            if i >= warmup:
                                times.append(seconds)
                        for w in works:
                            w.wait()
                        torch.cuda.synchronize()
                    if not lead:
                        continue
                    median_s = statistics.median(times)
                    if interference == "none":
                        alone_s = median_s
                    rows.append(
                        {
                            "direction": direction,
                            "pinned": pinned,
                            "nbytes": nbytes,
                            "interference": interference,
                            "interference_detail": detail,
                            "time_ms": _stats_ms([t * 1e3 for t in times]),
                            "gbps": nbytes / median_s / 1e9,
                        }
                    )
    return rows


def host_copy_table(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The calibration file's `host_copy` entries: one per measured row (median GB/s, 1e9 bytes/s)."""
    return [
        {k: r[k] for k in ("direction", "pinned", "nbytes", "interference")}
        | {"gbps": r["gbps"], "time_ms": r["time_ms"]["median"]}
        for r in rows
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out-dir", required=True)
    parser.add_argument("--max-gib", type=float, default=16.0, help="largest copy, bounded by free memory")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument(
        "--interference",
        default="none,hbm_d2d,nccl_allreduce,nccl_loopback,gemm",
        help=f"comma-separated from {INTERFERENCES}",
    )
    args = parser.parse_args(argv)
    from ..launch import append_record, exit_with_owner
    from ..launch.environment import environment

    exit_with_owner()
    import datetime as dt

    import torch

    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    wanted = [x for x in args.interference.split(",") if x]
    bad = [x for x in wanted if x not in INTERFERENCES]
    if bad:
        raise SystemExit(f"unknown interference {bad[0]!r}; allowed: {', '.join(INTERFERENCES)}")
    interferences = runnable_interferences(wanted, world)
    if world > 1 or "nccl_loopback" in interferences:
        if world == 1:  # run without torchrun: a one-rank rendezvous on this host
            os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
            os.environ.setdefault("MASTER_PORT", str(_free_port()))
            os.environ.setdefault("RANK", "0")
            os.environ.setdefault("WORLD_SIZE", "1")
        torch.distributed.init_process_group(backend="nccl", timeout=dt.timedelta(seconds=600))
    skipped = [x for x in wanted if x not in interferences]
    free, _ = torch.cuda.mem_get_info()
    reserve = 2 * HBM_BUFFER_BYTES + 2 * ALLREDUCE_BYTES + 2 * GEMM_DIM**2 * 2
    max_bytes = max_copy_bytes(int(args.max_gib * GIB), host_available_bytes(), free - reserve)
    sizes = copy_sizes(max_bytes)
    bench = _Bench(torch, max(sizes), world, rank)
    bench.prepare(interferences)
    rows = measure(sizes, args.repeats, args.warmup, interferences, bench)
    out = Path(args.out_dir) / "copy_bandwidth"
    if rank == 0:
        env = environment("cuda")
        out.mkdir(parents=True, exist_ok=True)
        for row in rows:
            append_record(out / "rank_0.jsonl", {"env": env, "world_size": world, **row})
        summary = {
            "env": env,
            "world_size": world,
            "max_bytes": max(sizes),
            "sizes": sizes,
            "interferences": interferences,
            "interferences_not_run": {x: NOT_RUN_REASON[x] for x in skipped},
            "host_available_bytes": host_available_bytes(),
            "device_free_bytes": free,
            "host_copy": host_copy_table(rows),
        }
        (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
        for r in rows:
            print(
                f"{r['direction']} {'pinned  ' if r['pinned'] else 'pageable'} {r['nbytes'] / MIB:>8.0f} MiB "
                f"{r['interference']:<15} {r['gbps']:7.2f} GB/s",
                flush=True,
            )
    if torch.distributed.is_initialized():
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
