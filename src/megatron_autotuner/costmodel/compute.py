"""Time of one kernel-level operation on one GPU: GEMMs, flash attention, memory-bound kernels.

All functions are pure and cached; times are seconds. Defaults and their sources: `defaults`.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from functools import lru_cache

from ..specs.hardware import GPUSpec
from . import defaults as d
from .calibration import Calibration


def sm_count(gpu: GPUSpec) -> int:
    return d.SM_COUNT.get(gpu.name, d.DEFAULT_SM_COUNT)


@lru_cache(maxsize=65536)
def gemm_time_s(
    m: float,
    n: float,
    k: float,
    gpu: GPUSpec,
    precision: str = "bf16",
    groups: int = 1,
    op: str = "gemm",
    phase: str = "fwd",
    calibration: Calibration | None = None,
    sm_fraction: float = 1.0,
    main_grad_bytes: int = 4,
) -> float:
    """Time of `groups` independent [m, k] x [k, n] products issued as one (grouped) kernel.

    Calibrated: t = F / (eff_cal(op, phase, F) * peak), F = 2*m*n*k*groups.
    Default (roofline with a fill rule):
        t = max(F / (peak * eff * fill), bytes / (hbm * HBM_EFFICIENCY)) + KERNEL_OVERHEAD_S
    eff = `gemm_efficiency` (GEMM_EFFICIENCY[precision]; lower for rows not 16-byte aligned on Hopper);
    fill = min(1, units / SMs) where units = groups * ceil(m/128) *
    ceil(n/128) * ksplit, ksplit = min(SMs // tiles, k // 512) when the tiles alone cannot fill the
    GPU (split-K); bytes = (e*(m*k + k*n) + o*m*n)*groups with e = 1 for fp8 operands, else 2, and
    o = 2 * main_grad_bytes for wgrad (read + write of the main grad it accumulates into: 8 fp32, 4 bf16),
    else 2.
    `sm_fraction` < 1 models SMs lent to communication kernels (TE userbuffers).
    """
    if m <= 0 or n <= 0 or k <= 0:
        return 0.0
    flops = 2.0 * m * n * k * groups
    peak = gpu.peak_tflops(precision) * 1e12
    if calibration is not None:
        eff = calibration.efficiency(op, phase, flops, precision)
        if eff is not None and eff > 0:
            return flops / (eff * peak * sm_fraction)
    sms = sm_count(gpu)
    tiles = groups * math.ceil(m / d.GEMM_TILE_M) * math.ceil(n / d.GEMM_TILE_N)
    units = tiles
    if tiles < sms:
        units = tiles * max(1, min(sms // max(tiles, 1), int(k // d.GEMM_MIN_K_SPLIT)))
    fill = min(1.0, units / sms)
    # the layer's widths: n and k forward and dgrad; m and n in wgrad (k there is the token count)
    widths = (m, n) if phase == "wgrad" else (n, k)
    compute = flops / (peak * gemm_efficiency(*widths, gpu, precision) * fill * sm_fraction)
    operand = 1 if precision == "fp8" else 2
    # wgrad accumulates into the main-grad buffer (gradient_accumulation_fusion): read + write it
    out_bytes = 2 * main_grad_bytes if phase == "wgrad" else 2
    memory = (operand * (m * k + k * n) + out_bytes * m * n) * groups / (gpu.hbm_gbps * 1e9 * d.HBM_EFFICIENCY)
    return max(compute, memory) + d.KERNEL_OVERHEAD_S


def gemm_efficiency(width_a: float, width_b: float, gpu: GPUSpec, precision: str) -> float:
    """Sustained fraction of the peak of a large GEMM of a linear layer whose input and output widths (its
    operands' and result's row lengths) are `width_a` and `width_b`: `defaults.GEMM_EFFICIENCY`, or on Hopper
    `defaults.UNALIGNED_GEMM_EFFICIENCY` for a bf16 one with a width not a multiple of 16 bytes (no TMA kernel can
    load its rows)."""
    align = d.GEMM_ALIGNMENT_ELEMENTS
    unaligned = width_a % align or width_b % align
    if precision != "fp8" and gpu.name in d.UNALIGNED_GEMM_GPUS and unaligned:
        return d.UNALIGNED_GEMM_EFFICIENCY
    return d.GEMM_EFFICIENCY[precision]


def _interp_log2(points: tuple[tuple[int, float], ...], s: float) -> float:
    xs = [p[0] for p in points]
    if s <= xs[0]:
        s_min, e_min = points[0]
        return e_min * 2 * s / (s + s_min)
    if s >= xs[-1]:
        return points[-1][1]
    i = bisect_left(xs, s)
    (x0, y0), (x1, y1) = points[i - 1], points[i]
    t = (math.log2(s) - math.log2(x0)) / (math.log2(x1) - math.log2(x0))
    return y0 + (y1 - y0) * t


@lru_cache(maxsize=4096)
def default_attention_efficiency(phase: str, seq_length: float, head_dim: int, causal: bool) -> float:
    """Measured cuDNN flash-attention efficiency (fraction of the bf16 peak) for `phase` (fwd | bwd).

    Interpolated in log2(seq) within the measured 1k-32k range (extrapolated below it, see
    `defaults`), and linearly in head dim between 64, 128 and 192 (clamped outside).
    """
    dims = sorted({hd for (c, hd) in d.ATTENTION_EFFICIENCY if c == causal})
    hd = min(max(head_dim, dims[0]), dims[-1])
    i = bisect_left(dims, hd)
    if dims[i] == hd:
        return _interp_log2(d.ATTENTION_EFFICIENCY[(causal, hd)][phase], seq_length)
    lo, hi = dims[i - 1], dims[i]
    e_lo = _interp_log2(d.ATTENTION_EFFICIENCY[(causal, lo)][phase], seq_length)
    e_hi = _interp_log2(d.ATTENTION_EFFICIENCY[(causal, hi)][phase], seq_length)
    return e_lo + (e_hi - e_lo) * (hd - lo) / (hi - lo)


@lru_cache(maxsize=16384)
def flash_attention_time_s(
    phase: str,
    flops: float,
    seq_length: float,
    head_dim: int,
    causal: bool,
    gpu: GPUSpec,
    dropout: bool = False,
    calibration: Calibration | None = None,
) -> float:
    """Fused (flash) attention time for `flops` of work actually done (causal = half the square).

    t = flops / (eff * bf16 peak) (+ kernel overhead); eff from the calibration's core_attention
    entries when present, else `default_attention_efficiency`; attention dropout multiplies by the
    measured `ATTENTION_DROPOUT_SLOWDOWN`. Attention stays in bf16 under fp8 training (TE default).
    """
    if flops <= 0:
        return 0.0
    peak = gpu.peak_tflops("bf16") * 1e12
    eff = None
    if calibration is not None:
        eff = calibration.efficiency("core_attention", phase, flops, "bf16")
    if eff is None or eff <= 0:
        eff = default_attention_efficiency(phase, seq_length, head_dim, causal)
    t = flops / (eff * peak) + d.KERNEL_OVERHEAD_S
    if dropout:
        t *= d.ATTENTION_DROPOUT_SLOWDOWN[phase]
    return t


def memory_bound_time_s(
    num_bytes: float, gpu: GPUSpec, kernels: float = 0.0, hbm_efficiency: float | None = None
) -> float:
    """Streaming kernels: bytes / bandwidth + kernels * KERNEL_OVERHEAD_S.

    bandwidth = HBM * HBM_EFFICIENCY, or for a kernel with its own measured fraction f of the H200's
    HBM: min(f * 4.8 TB/s * SMs / 132, HBM * HBM_EFFICIENCY) -- an SM-bound kernel keeps its absolute
    rate per SM, and no kernel streams faster than the generic fraction of the GPU's HBM (see
    `defaults.FRACTION_MEASURED_ON_HBM_GBPS`)."""
    if num_bytes <= 0:
        return kernels * d.KERNEL_OVERHEAD_S
    bandwidth = gpu.hbm_gbps * 1e9 * d.HBM_EFFICIENCY
    if hbm_efficiency is not None:
        sm_bound = hbm_efficiency * d.FRACTION_MEASURED_ON_HBM_GBPS * 1e9 * sm_count(gpu) / d.FRACTION_MEASURED_ON_SMS
        bandwidth = min(sm_bound, bandwidth)
    return num_bytes / bandwidth + kernels * d.KERNEL_OVERHEAD_S
