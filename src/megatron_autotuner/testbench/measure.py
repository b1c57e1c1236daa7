"""Time and memory of one built operator: CUDA events, torch.cuda memory statistics.

Timing: `warmup` forward+backward iterations, then `repeats` iterations each timed with CUDA events
around the forward and around the backward; median, min, max and standard deviation are reported.
Memory (one extra iteration after warm-up, gradients cleared first):
- weights: bytes allocated by building the module (and exact parameter bytes);
- activations kept for backward: allocated after forward - before forward - output + saved input
  (the op's input is kept for its backward; in a model it is the previous layer's output);
- forward transient: peak during forward - allocated after forward;
- backward peak: peak during backward above the pre-forward level.
Host time (CUDA): the same timed iterations also take the wall time of the forward call and of the backward call
(`host_fwd_ms`, `host_bwd_ms`). Each iteration starts after a synchronize, so the launch queue is empty and one
layer's few hundred launches never fill it (the CUDA driver queues about a thousand): the call returns as soon as
the host has issued its work, and its wall time is the host's cost of issuing one layer, whatever the GPU does.
`backward()` returns once autograd has run every node on the host, not when the GPU is done.
Forward-only (`fwd_no_grad_ms`, `host_fwd_no_grad_ms`): the same forward under `torch.no_grad()`, as a
forward-only pass (RLHF log-prob, reference model) runs it: autograd records no graph and TE's autograd functions
save nothing for backward, so the host may issue the layer faster than the training forward.
On a CPU device (tests only) wall-clock time replaces CUDA events and memory is not measured.
"""

from __future__ import annotations

import gzip
import shutil
import statistics
import time
from pathlib import Path
from typing import Any

from .operators import Operator


def _stats(values: list[float]) -> dict[str, float]:
    return {
        "median": statistics.median(values),
        "min": min(values),
        "max": max(values),
        "std": statistics.pstdev(values) if len(values) > 1 else 0.0,
        "n": len(values),
    }


def _clear_grads(module: Any) -> None:
    for p in module.parameters():
        p.grad = None


def measure_operator(
    op: Operator, warmup: int = 3, repeats: int = 10, device: str = "cuda", weights_allocated_bytes: int | None = None
) -> dict[str, Any]:
    import torch

    cuda = device == "cuda"
    params = list(op.module.parameters())
    real: dict[str, Any] = {
        "weight_params": sum(p.numel() for p in params),
        "weight_bytes": sum(p.numel() * p.element_size() for p in params),
    }
    if weights_allocated_bytes is not None:
        real["weight_allocated_bytes"] = weights_allocated_bytes
    for _ in range(warmup):
        _clear_grads(op.module)
        op.backward(op.forward())
    if cuda:
        torch.cuda.synchronize()
        _clear_grads(op.module)
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        out = op.forward()
        torch.cuda.synchronize()
        after_fwd = torch.cuda.memory_allocated()
        peak_fwd = torch.cuda.max_memory_allocated()
        out_bytes = op.output_bytes(out)
        op.backward(out)
        torch.cuda.synchronize()
        peak_bwd = torch.cuda.max_memory_allocated()
        del out
        real.update(
            activation_bytes=after_fwd - before - out_bytes + op.saved_input_bytes,
            activation_raw_delta_bytes=after_fwd - before,
            output_bytes=out_bytes,
            forward_transient_bytes=peak_fwd - after_fwd,
            backward_peak_over_start_bytes=peak_bwd - before,
            peak_allocated_bytes=peak_bwd,
            peak_reserved_bytes=torch.cuda.max_memory_reserved(),
        )
    fwd_ms: list[float] = []
    bwd_ms: list[float] = []
    host_fwd_ms: list[float] = []
    host_bwd_ms: list[float] = []
    steps_ms: dict[str, list[float]] = {name: [] for name in (op.host_steps_s or {})}
    for _ in range(repeats):
        _clear_grads(op.module)
        for name in steps_ms:
            op.host_steps_s[name] = 0.0
        if cuda:
            start, mid, end = (torch.cuda.Event(enable_timing=True) for _ in range(3))
            torch.cuda.synchronize()
            start.record()
            t0 = time.perf_counter()
            out = op.forward()
            t1 = time.perf_counter()
            mid.record()
            op.backward(out)
            t2 = time.perf_counter()
            end.record()
            end.synchronize()
            fwd_ms.append(start.elapsed_time(mid))
            bwd_ms.append(mid.elapsed_time(end))
            host_fwd_ms.append((t1 - t0) * 1e3)
            host_bwd_ms.append((t2 - t1) * 1e3)
        else:
            t0 = time.perf_counter()
            out = op.forward()
            t1 = time.perf_counter()
            op.backward(out)
            t2 = time.perf_counter()
            fwd_ms.append((t1 - t0) * 1e3)
            bwd_ms.append((t2 - t1) * 1e3)
        for name, values in steps_ms.items():
            values.append(op.host_steps_s[name] * 1e3)
        del out
    fwd_no_grad_ms, host_fwd_no_grad_ms = _time_forward_no_grad(op, repeats, cuda)
    total = [f + b for f, b in zip(fwd_ms, bwd_ms, strict=True)]
    real["fwd_ms"] = _stats(fwd_ms)
    real["bwd_ms"] = _stats(bwd_ms)
    real["fwd_bwd_ms"] = _stats(total)
    real["fwd_no_grad_ms"] = _stats(fwd_no_grad_ms)
    if host_fwd_ms:
        real["host_fwd_ms"] = _stats(host_fwd_ms)
        real["host_bwd_ms"] = _stats(host_bwd_ms)
        real["host_fwd_no_grad_ms"] = _stats(host_fwd_no_grad_ms)
    if steps_ms:
        # host time inside each forward step (a MoE block's router, dispatcher, experts ...), median per step
        real["host_fwd_steps_ms"] = {name: statistics.median(values) for name, values in steps_ms.items()}
    return real


def _time_forward_no_grad(op: Operator, repeats: int, cuda: bool) -> tuple[list[float], list[float]]:
    """(GPU or wall ms, host ms) of `repeats` forward calls under torch.no_grad(), each from an empty launch queue
    after one untimed call (a forward-only pass can take other kernels, e.g. TE's inference paths)."""
    import torch

    gpu_ms: list[float] = []
    host_ms: list[float] = []
    with torch.no_grad():
        op.forward()
        for _ in range(repeats):
            if cuda:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                torch.cuda.synchronize()
                start.record()
                t0 = time.perf_counter()
                out = op.forward()
                t1 = time.perf_counter()
                end.record()
                end.synchronize()
                gpu_ms.append(start.elapsed_time(end))
                host_ms.append((t1 - t0) * 1e3)
            else:
                t0 = time.perf_counter()
                out = op.forward()
                gpu_ms.append((time.perf_counter() - t0) * 1e3)
            del out
    return gpu_ms, host_ms


def add_rates(real: dict[str, Any], estimated: dict[str, float], peak_tflops: float | None) -> dict[str, Any]:
    """Achieved TFLOP/s (estimated FLOPs over measured median time) and MFU against `peak_tflops`."""
    for phase, flops_key in (("fwd", "fwd_flops"), ("bwd", "bwd_flops"), ("fwd_bwd", "fwd_bwd_flops")):
        ms = real[f"{phase}_ms"]["median"]
        flops = estimated.get(flops_key, 0.0)
        tflops = flops / (ms * 1e-3) / 1e12 if ms > 0 and flops else 0.0
        real[f"{phase}_tflops"] = tflops
        if peak_tflops:
            real[f"{phase}_mfu"] = tflops / peak_tflops
    return real


def ratios(real: dict[str, Any], estimated: dict[str, float]) -> dict[str, float]:
    out = {}
    for key in ("weight_bytes", "activation_bytes"):
        if key in real and estimated.get(key):
            out[key] = real[key] / estimated[key]
    return out


def export_trace_gz(prof: Any, gz_path: Path) -> Path:
    """Write a finished `torch.profiler.profile`'s Kineto (chrome) trace to `gz_path` (.json.gz), gzipped."""
    gz_path.parent.mkdir(parents=True, exist_ok=True)
    raw = gz_path.with_suffix("")  # .json next to it, removed after compressing
    prof.export_chrome_trace(str(raw))
    with open(raw, "rb") as src, gzip.open(gz_path, "wb") as dst:
        shutil.copyfileobj(src, dst)
    raw.unlink()
    return gz_path
