"""How long the CUDA caching allocator takes to get, zero and give back large blocks (4 / 8 / 12 GiB, 3 times
each): the offload round trip re-allocates and zeroes its param and grad buffers on every reload and returns them
with empty_cache() on every offload, so this bounds what those steps can cost.

    python benchmarks/validation/device_alloc_probe.py OUT.json      (on the GPU machine)
"""

from __future__ import annotations

import gc
import json
import sys
import time


def main(out: str) -> int:
    import torch

    torch.empty(1, device="cuda")  # CUDA context first, outside the timings
    rows = []
    for gib in (4, 8, 12):
        for _ in range(3):
            torch.cuda.empty_cache()
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            block = torch.empty(gib << 30, dtype=torch.uint8, device="cuda")
            torch.cuda.synchronize()
            t1 = time.perf_counter()
            block.zero_()
            torch.cuda.synchronize()
            t2 = time.perf_counter()
            del block
            gc.collect()
            torch.cuda.synchronize()
            t3 = time.perf_counter()
            torch.cuda.empty_cache()
            torch.cuda.synchronize()
            t4 = time.perf_counter()
            rows.append({"gib": gib, "alloc_s": t1 - t0, "zero_s": t2 - t1, "free_to_os_s": t4 - t3})
    doc = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows}
    with open(out, "w") as f:
        json.dump(doc, f, indent=1)
    print(rows[-1])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
