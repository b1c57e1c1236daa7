"""Independent helpers for the trace tests: raw JSON reading, naive classification, brute-force overlap.

Nothing here uses megatron_autotuner.trace, so the tests compare the package with separate code.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "traces"
TP1 = FIXTURES / "h200_te_layer_tp1_rank0.json.gz"
NCCL = [FIXTURES / f"h200_te_layer_tp2_nccl_rank{r}.json.gz" for r in (0, 1)]
UB = [FIXTURES / f"h200_te_layer_tp2_userbuffers_rank{r}.json.gz" for r in (0, 1)]
ALL_TRACES = [TP1, *NCCL, *UB]
GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")


def raw(path: Path) -> dict[str, Any]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        return json.load(f)


def raw_gpu_events(path: Path) -> list[dict[str, Any]]:
    return [e for e in raw(path)["traceEvents"] if e.get("ph") == "X" and e.get("cat") in GPU_CATS]


# megatron-core's distributed optimizer step with TE fused Adam: grad-norm, clip scaling, Adam
OPTIMIZER_KERNELS = ("multi_tensor_l2norm::L2Norm", "multi_tensor_scale", "multi_tensor_adam")


def raw_kernels(path: Path) -> list[dict[str, Any]]:
    """The kernel events of a trace, as recorded."""
    return [e for e in raw(path)["traceEvents"] if e.get("cat") == "kernel"]


def kernel_seconds(kernels: list[dict[str, Any]], *parts: str, min_us: float = 0.0) -> float:
    """Total time of the kernels whose name holds every one of `parts` (and that ran >= min_us)."""
    return sum(k["dur"] for k in kernels if all(p in k["name"] for p in parts) and k["dur"] >= min_us) * 1e-6


def naive_kind(name: str) -> str:
    """comm / compute / neither, by the plainest reading of the kernel families in README.md."""
    if name.startswith(("ncclDevKernel", "kuserbuffers", "void userbuffers", "Memcpy PtoP")):
        return "comm"
    if name.startswith(("Memcpy", "Memset")):
        return "neither"
    return "compute"


def brute_overlap(events: list[tuple[str, float, float]]) -> dict[str, float]:
    """events: (kind, start, end). Elementary segments between all boundaries, each tested against every event."""
    points = sorted({t for _, s, e in events for t in (s, e)})
    out = {"comm": 0.0, "compute": 0.0, "overlap": 0.0, "exposed": 0.0, "busy": 0.0}
    for a, b in zip(points, points[1:], strict=False):
        mid = (a + b) / 2
        live = {k for k, s, e in events if s <= mid < e}
        if not live:
            continue
        out["busy"] += b - a
        if "comm" in live:
            out["comm"] += b - a
            out["exposed" if "compute" not in live else "overlap"] += b - a
        if "compute" in live:
            out["compute"] += b - a
    return out


def write_trace(path: Path, events: list[dict[str, Any]], **top: Any) -> Path:
    doc = {"schemaVersion": 1, **top, "traceEvents": events}
    text = json.dumps(doc, indent=1)
    if path.suffix == ".gz":
        with gzip.open(path, "wt") as f:
            f.write(text)
    else:
        path.write_text(text)
    return path


def kernel(name: str, ts: float, dur: float, stream: int = 7, corr: int = -1, device: int = 0) -> dict[str, Any]:
    args: dict[str, Any] = {"device": device, "stream": stream}
    if corr >= 0:
        args["correlation"] = corr
    return {"ph": "X", "cat": "kernel", "name": name, "pid": device, "tid": stream, "ts": ts, "dur": dur, "args": args}


def cpu(name: str, ts: float, dur: float, tid: int = 100, cat: str = "cpu_op") -> dict[str, Any]:
    return {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": dur, "args": {}}


def launch(ts: float, corr: int, tid: int = 100) -> dict[str, Any]:
    return {
        "ph": "X",
        "cat": "cuda_runtime",
        "name": "cudaLaunchKernel",
        "pid": 1,
        "tid": tid,
        "ts": ts,
        "dur": 1.0,
        "args": {"correlation": corr},
    }
