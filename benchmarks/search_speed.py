"""Time `search.plan` over the whole layout space for Llama-3.1-405B and DeepSeek-V3 on 1024 H100.

python benchmarks/search_speed.py   -> benchmarks/results/search_speed.json
"""

from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path

from megatron_autotuner import SCHEMA_VERSION, __version__
from megatron_autotuner.errors import ConfigError
from megatron_autotuner.search import plan
from megatron_autotuner.specs import get_gpu_spec, load_model_spec

CASES = [("Llama-3.1-405B", 1024, 8192, 1024), ("DeepSeek-V3", 1024, 4096, 8192)]


def main() -> int:
    gpu = get_gpu_spec("H100-SXM")
    rows = []
    for name, n, seq, gbs in CASES:
        start = time.perf_counter()
        try:
            result = plan(load_model_spec(name), gpu, n, seq, gbs)
            outcome = {
                "considered": result.considered,
                "feasible": len(result.candidates),
                "best": result.best.label,
                "best_mfu": result.best.estimate.mfu,
            }
        except ConfigError as exc:
            outcome = {"no_layout_fits": str(exc)}
        elapsed = time.perf_counter() - start
        rows.append(
            {"model": name, "num_gpus": n, "seq_length": seq, "global_batch_size": gbs, "elapsed_s": elapsed, **outcome}
        )
        print(f"{name} on {n} x H100: {elapsed:.2f} s {outcome}")
    out = {
        "schema_version": SCHEMA_VERSION,
        "tool_version": __version__,
        "cpu_count": os.cpu_count(),
        "machine": platform.processor() or platform.machine(),
        "python": platform.python_version(),
        "rows": rows,
    }
    path = Path(__file__).resolve().parent / "results" / "search_speed.json"
    path.write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
