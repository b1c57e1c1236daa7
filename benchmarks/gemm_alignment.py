"""bf16 GEMMs whose row length is not a multiple of 16 bytes, against their aligned twins, on one H200.

Hopper's fast GEMM kernels load tiles with the Tensor Memory Accelerator, whose tensor maps need every stride to be
a multiple of 16 bytes (CUDA driver API, cuTensorMapEncodeTiled: globalStrides "must be a multiple of 16"); a bf16
matrix whose rows hold a multiple of 8 elements qualifies. Qwen2.5-VL's vision MLP is 3420 wide (6840 bytes a
row), so its fc2 GEMMs cannot use them: the testbench's trace of one tower block (results/vision_tower_h200)
shows cuBLAS running them with sm80 `cutlass_80_tensorop` kernels at 15-25% of the bf16 peak, where the block's
other GEMMs ran sm90 `nvjet` kernels. This measures that rate: each shape as `F.linear(x[m, k], w[n, k])` (the
forward GEMM of a linear layer: x's rows are k long, the output's n long), k or n unaligned, and the twin with both
rounded up to a multiple of 8, timed with CUDA events (median of 20 after 5 warm-ups), with the kernel cuBLAS
picked (torch.profiler).

    python benchmarks/gemm_alignment.py predict           -> results/gemm_alignment_h200/predicted.json (before)
    python benchmarks/gemm_alignment.py measure OUT_DIR   -> on the GPU machine: OUT_DIR/measured.json
    python benchmarks/gemm_alignment.py                   -> results/gemm_alignment_h200/summary.json
"""

from __future__ import annotations

import datetime as dt
import json
import statistics
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent
LEASE = ROOT / "results/gemm_alignment_h200"
GPU = "H200"
# (m, n, k): Qwen2.5-VL's fc2 forward / dgrad / wgrad shapes at 16k and 64k patches, and two more widths
UNALIGNED = (
    (65536, 1280, 3420),
    (65536, 3420, 1280),
    (1280, 3420, 65536),
    (16384, 1280, 3420),
    (16384, 3420, 1280),
    (1280, 3420, 16384),
    (32768, 4096, 4100),
    (32768, 4100, 4096),
    (16384, 2052, 2048),
    (16384, 2048, 2052),
)


def aligned(shape: tuple[int, int, int]) -> tuple[int, int, int]:
    m, n, k = shape
    return m, -(-n // 8) * 8, -(-k // 8) * 8


def shapes() -> list[tuple[int, int, int]]:
    return [s for u in UNALIGNED for s in (u, aligned(u))]


def predict() -> None:
    from megatron_autotuner import __version__
    from megatron_autotuner.costmodel.compute import gemm_time_s
    from megatron_autotuner.specs import get_gpu_spec

    gpu = get_gpu_spec(GPU)
    rows = [{"m": m, "n": n, "k": k, "predicted_ms": gemm_time_s(m, n, k, gpu) * 1e3} for m, n, k in shapes()]
    LEASE.mkdir(parents=True, exist_ok=True)
    doc = {"tool_version": __version__, "date": _now(), "gpu": GPU, "rows": rows}
    (LEASE / "predicted.json").write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {(LEASE / 'predicted.json').relative_to(ROOT.parent)}")


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


def _kernel(run, *args) -> str:
    import torch

    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        run(*args)
        torch.cuda.synchronize()
    names = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    return max(names, key=len) if names else ""


def measure(out_dir: str) -> None:
    import torch
    import torch.nn.functional as F

    rows = []
    for m, n, k in shapes():
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
        for _ in range(5):
            F.linear(x, w)
        times = []
        for _ in range(20):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            F.linear(x, w)
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end))
        ms = statistics.median(times)
        rows.append(
            {
                "m": m,
                "n": n,
                "k": k,
                "ms": ms,
                "tflops": 2 * m * n * k / ms / 1e9,
                "kernel": _kernel(F.linear, x, w),
            }
        )
        print(rows[-1], flush=True)
        del x, w
    versions = {"torch": torch.__version__, "cuda": torch.version.cuda, "device": torch.cuda.get_device_name()}
    doc = {"date": _now(), "versions": versions, "rows": rows}
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    (Path(out_dir) / "measured.json").write_text(json.dumps(doc, indent=1) + "\n")


def summary() -> dict[str, Any]:
    """Per unaligned shape: measured time and fraction of the bf16 peak, the aligned twin's, the kernels, and the
    prediction written before the lease; the median fraction of peak over the unaligned shapes."""
    from megatron_autotuner.specs import get_gpu_spec

    peak = get_gpu_spec(GPU).bf16_tflops
    measured = {(r["m"], r["n"], r["k"]): r for r in json.loads((LEASE / "measured.json").read_text())["rows"]}
    predicted = {(r["m"], r["n"], r["k"]): r for r in json.loads((LEASE / "predicted.json").read_text())["rows"]}
    rows = []
    for shape in UNALIGNED:
        slow, fast = measured[shape], measured[aligned(shape)]
        rows.append(
            {
                "m": shape[0], "n": shape[1], "k": shape[2],
                "ms": slow["ms"], "fraction_of_peak": slow["tflops"] / peak, "kernel": slow["kernel"],
                "aligned_ms": fast["ms"], "aligned_fraction_of_peak": fast["tflops"] / peak,
                "aligned_kernel": fast["kernel"],
                "predicted_before_ms": predicted[shape]["predicted_ms"],
            }
        )  # fmt: skip
    return {
        "gpu": GPU,
        "lease": str(LEASE.relative_to(ROOT.parent)),
        "median_unaligned_fraction_of_peak": statistics.median(r["fraction_of_peak"] for r in rows),
        "median_aligned_fraction_of_peak": statistics.median(r["aligned_fraction_of_peak"] for r in rows),
        "rows": rows,
    }


if __name__ == "__main__":
    command = sys.argv[1] if len(sys.argv) > 1 else "summary"
    if command == "predict":
        predict()
    elif command == "measure":
        measure(sys.argv[2])
    else:
        doc = summary()
        (LEASE / "summary.json").write_text(json.dumps(doc, indent=1) + "\n")
        for r in doc["rows"]:
            print(
                f"m{r['m']} n{r['n']} k{r['k']}: {r['ms']:.3f} ms ({r['fraction_of_peak']:.1%} of peak, "
                f"{r['kernel'][:40]}) vs aligned {r['aligned_ms']:.3f} ms ({r['aligned_fraction_of_peak']:.1%}); "
                f"predicted before {r['predicted_before_ms']:.3f} ms"
            )
        print(f"median unaligned: {doc['median_unaligned_fraction_of_peak']:.1%} of the bf16 peak")
