"""Does a GPU slow down once it has run flat out for a while (power / thermal limits)?

    python benchmarks/validation/sustained_gemm.py --seconds 90 --out sustained_gemm.json

Runs back-to-back square bf16 matrix products (m = n = k, default 8192) for `--seconds` and
records the achieved TFLOP/s of every ~1 s window (CUDA events), while `nvidia-smi` samples the
SM clock, power draw and temperature every 250 ms. Short benchmarks (a few seconds) see the boost
clock; a training run lasting hours sees what the power limit leaves. The JSON has one row per
window and the GPU samples, so both curves can be plotted against time.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import subprocess
import time
from datetime import datetime, timezone
from pathlib import Path

SMI_FIELDS = "timestamp,clocks.sm,power.draw,temperature.gpu,clocks_event_reasons.active"


def main() -> int:
    import torch

    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=90.0)
    parser.add_argument("--size", type=int, default=8192)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    if args.seconds <= 0 or args.size <= 0:
        parser.error("--seconds and --size must be > 0")
    n = args.size
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    flops = 2.0 * n**3
    for _ in range(5):
        a @ b
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(20):
        a @ b
    end.record()
    end.synchronize()
    per_window = max(1, int(1000.0 / (start.elapsed_time(end) / 20)))  # products per ~1 s window

    smi = subprocess.Popen(
        ["nvidia-smi", "-i", "0", f"--query-gpu={SMI_FIELDS}", "--format=csv,noheader,nounits", "-lms", "250"],
        stdout=subprocess.PIPE,
        text=True,
    )
    t0 = time.time()
    windows = []
    while time.time() - t0 < args.seconds:
        start.record()
        for _ in range(per_window):
            a @ b
        end.record()
        end.synchronize()
        ms = start.elapsed_time(end)
        windows.append({"t_s": time.time() - t0, "tflops": per_window * flops / (ms * 1e-3) / 1e12})
    smi.terminate()
    samples = []
    for row in csv.reader(io.StringIO(smi.communicate()[0])):
        if len(row) < 5:
            continue
        try:
            samples.append(
                {
                    "time": row[0].strip(),
                    "sm_clock_mhz": float(row[1]),
                    "power_w": float(row[2]),
                    "temperature_c": float(row[3]),
                    "clock_event_reasons": row[4].strip(),
                }
            )
        except ValueError:
            continue
    first = [w["tflops"] for w in windows[:5]]
    last = [w["tflops"] for w in windows[-10:]]
    doc = {
        "kind": "sustained-gemm",
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "m_n_k": n,
        "dtype": "bf16",
        "products_per_window": per_window,
        "first_5_windows_tflops": sum(first) / len(first),
        "last_10_windows_tflops": sum(last) / len(last),
        "windows": windows,
        "gpu_samples": samples,
    }
    Path(args.out).write_text(json.dumps(doc, indent=1) + "\n")
    print(
        f"{doc['device']}: {n}^3 bf16 {doc['first_5_windows_tflops']:.0f} TFLOP/s in the first 5 s, "
        f"{doc['last_10_windows_tflops']:.0f} in the last 10 s of {args.seconds:.0f} s"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
