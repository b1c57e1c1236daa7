"""How many kernel launches can the host queue ahead of the GPU before a launch blocks?

    python benchmarks/launch_queue.py --out benchmarks/results/reserved_memory_h200_x4/launch_queue.json  # one GPU

A GPU-bound eager training step lets the host run ahead of the GPU until CUDA's launch queue is full; while it is
ahead, a tensor freed with a use on another stream (the caching allocator's deferred free: `free_requested` before
`free_completed` in its history) cannot be reused, so the queue's depth bounds how much such memory is in flight
(`theory.memory.pending_wgrad_bytes`). Measured here: back-to-back `torch.cuda._sleep` kernels of about 1 ms on one
stream, each launch timed on the host; the launches return in microseconds until the queue is full, then each one
waits for a kernel to finish. The depth is the number of launches that returned fast, over repeats and with
CUDA_DEVICE_MAX_CONNECTIONS as set (../shared/gpu's env.sh sets 1, as TE's userbuffers need). A second stream, and
launches of a real op (`torch.add` on a 64 MiB tensor), check that the depth is the queue's, not the kernel's.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from datetime import datetime, timezone
from pathlib import Path

KERNEL_MS = 1.0
LAUNCHES = 4096
REPEATS = 3


def _cycles_per_ms(torch) -> float:
    """Calibrate `torch.cuda._sleep`'s cycles to milliseconds on this GPU."""
    torch.cuda._sleep(1000)
    torch.cuda.synchronize()
    cycles = 10_000_000
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    torch.cuda._sleep(cycles)
    end.record()
    end.synchronize()
    return cycles / start.elapsed_time(end)


def _depth(launch, kernel_s: float) -> dict:
    """Launch `LAUNCHES` kernels back to back; the depth is the count that returned in under half a kernel's time."""
    import torch

    torch.cuda.synchronize()
    times = []
    for _ in range(LAUNCHES):
        t = time.perf_counter()
        launch()
        times.append(time.perf_counter() - t)
    torch.cuda.synchronize()
    slow = [i for i, dt in enumerate(times) if dt > kernel_s / 2]
    first_slow = slow[0] if slow else None
    return {
        "depth": first_slow,
        "fast_launch_us_median": statistics.median(times[: first_slow or LAUNCHES]) * 1e6,
        "blocked_launch_ms_median": statistics.median(times[s] for s in slow) * 1e3 if slow else None,
        "blocked_launches": len(slow),
    }


def measure() -> dict:
    import torch

    cycles = int(_cycles_per_ms(torch) * KERNEL_MS)
    kernel_s = KERNEL_MS / 1e3
    x = torch.empty(32 * 2**20, dtype=torch.bfloat16, device="cuda")
    side = torch.cuda.Stream()

    def on_side() -> None:
        with torch.cuda.stream(side):
            torch.cuda._sleep(cycles)

    cases = {"sleep_1ms": lambda: torch.cuda._sleep(cycles), "sleep_1ms_side_stream": on_side}
    rows = {name: [_depth(fn, kernel_s) for _ in range(REPEATS)] for name, fn in cases.items()}
    # a real op: an in-place add of 64 MiB (~30 us on H100/H200 HBM) behind one long kernel that keeps the queue full;
    # warmed first (the committed run of 2026-11-27 was not: its first add loaded the kernel, waited out the 2 s
    # kernel, and read depth 1)
    x.add_(1)
    torch.cuda.synchronize()
    torch.cuda._sleep(int(cycles * 2000))  # ~2 s of GPU work ahead of the adds
    times = []
    for _ in range(LAUNCHES):
        t = time.perf_counter()
        x.add_(1)
        times.append(time.perf_counter() - t)
    torch.cuda.synchronize()
    slow = [i for i, dt in enumerate(times) if dt > 0.5e-3]
    rows["add_64mib_behind_2s"] = [{"depth": (slow[0] + 1) if slow else None, "blocked_launches": len(slow)}]
    return {"cycles_per_kernel": cycles, "cases": rows}


def main() -> int:
    import torch

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    result = measure()
    depths = [r["depth"] for rows in result["cases"].values() for r in rows if r["depth"] is not None]
    doc = {
        "kind": "launch-queue-depth",
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cuda_device_max_connections": os.environ.get("CUDA_DEVICE_MAX_CONNECTIONS"),
        "kernel_ms": KERNEL_MS,
        "launches": LAUNCHES,
        **result,
        "depth_median": statistics.median(depths) if depths else None,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=1) + "\n")
    print(json.dumps(doc, indent=1))
    return 0 if depths else 1


if __name__ == "__main__":
    raise SystemExit(main())
