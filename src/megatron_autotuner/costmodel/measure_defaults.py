"""Measure the numbers behind the cost model's default efficiency curves on one GPU (needs torch + CUDA).

    python -m megatron_autotuner.costmodel.measure_defaults OUT.json [--quick]

Writes a calibration file (schema of `costmodel.calibration`) with generic entries:
- op "gemm", precision bf16 / fp8 (torch.matmul; torch._scaled_mm with per-tensor scales),
  phase "fwd", shape keys m, n, k: a sweep of square and transformer-layer shapes;
- op "core_attention" (torch scaled_dot_product_attention with the cuDNN and flash backends),
  phase "fwd" and "bwd", keys seq_length, heads, head_dim, causal, backend;
- op "hbm_copy" / "hbm_add": achieved HBM bandwidth of a device copy and an elementwise add.
Timing: CUDA events around repeated calls after warm-up, random bf16 data. torch is imported
inside `main` only: the analytical package never needs it.
"""

from __future__ import annotations

import argparse
import json
import sys
import time


def _timeit(fn, min_time_s: float = 0.05, warmup: int = 3) -> float:
    import torch

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    torch.cuda.synchronize()
    once_ms = max(start.elapsed_time(end), 1e-3)
    reps = max(3, min(200, int(min_time_s * 1e3 / once_ms)))
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / reps


def main(argv: list[str] | None = None) -> int:  # pragma: no cover - needs a GPU
    import torch
    import torch.nn.functional as F

    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    dev = torch.device("cuda")
    props = torch.cuda.get_device_properties(dev)
    ops: list[dict] = []
    t_start = time.time()

    sizes = [256, 512, 1024, 2048, 4096, 8192, 16384]
    shapes = [(s, s, s) for s in sizes]
    nk = [
        (6144, 4096),
        (4096, 4096),
        (28672, 4096),
        (4096, 14336),
        (2560, 8192),
        (8192, 2048),
        (14336, 8192),
        (8192, 7168),
        (1536, 2048),
        (2048, 768),
        (256, 7168),
        (4096, 1024),
    ]
    for m in [256, 1024, 2048, 4096, 8192, 16384]:
        shapes += [(m, n, k) for n, k in nk]
    for m, n, k in shapes:
        a = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
        b = torch.randn(k, n, device=dev, dtype=torch.bfloat16)
        ms = _timeit(lambda a=a, b=b: torch.matmul(a, b))
        flops = 2.0 * m * n * k
        ops.append(
            {
                "op": "gemm",
                "precision": "bf16",
                "phase": "fwd",
                "m": m,
                "n": n,
                "k": k,
                "flops": flops,
                "time_ms": ms,
                "achieved_tflops": flops / ms / 1e9,
                "tokens": m,
            }
        )
        try:
            a8 = a.to(torch.float8_e4m3fn)
            b8 = torch.randn(n, k, device=dev, dtype=torch.bfloat16).to(torch.float8_e4m3fn).t()
            one = torch.tensor(1.0, device=dev)
            ms8 = _timeit(
                lambda a8=a8, b8=b8, one=one: torch._scaled_mm(
                    a8, b8, scale_a=one, scale_b=one, out_dtype=torch.bfloat16
                )
            )
            ops.append(
                {
                    "op": "gemm",
                    "precision": "fp8",
                    "phase": "fwd",
                    "m": m,
                    "n": n,
                    "k": k,
                    "flops": flops,
                    "time_ms": ms8,
                    "achieved_tflops": flops / ms8 / 1e9,
                    "tokens": m,
                }
            )
        except Exception as exc:  # noqa: BLE001
            print("fp8 gemm failed:", m, n, k, exc, file=sys.stderr)
        del a, b
    print(f"gemm done {time.time() - t_start:.1f}s", file=sys.stderr, flush=True)

    from torch.nn.attention import SDPBackend, sdpa_kernel

    backends = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION}
    heads = 32
    for backend_name, backend in backends.items():
        for d_qk, d_v in [(128, 128), (64, 64), (192, 128)]:
            for causal in (True, False):
                for s in [1024, 2048, 4096, 8192, 16384, 32768]:
                    if not causal and s > 16384:
                        continue
                    b = max(1, 16384 // s)
                    q = torch.randn(b, heads, s, d_qk, device=dev, dtype=torch.bfloat16, requires_grad=True)
                    k = torch.randn(b, heads, s, d_qk, device=dev, dtype=torch.bfloat16, requires_grad=True)
                    v = torch.randn(b, heads, s, d_v, device=dev, dtype=torch.bfloat16, requires_grad=True)
                    g = torch.randn(b, heads, s, d_v, device=dev, dtype=torch.bfloat16)

                    def fwd(q=q, k=k, v=v, causal=causal, backend=backend):
                        with sdpa_kernel(backend):
                            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

                    def fwd_bwd(q=q, k=k, v=v, g=g, causal=causal, backend=backend):
                        with sdpa_kernel(backend):
                            o = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
                        o.backward(g)

                    try:
                        with torch.no_grad():
                            t_f = _timeit(fwd)
                        t_fb = _timeit(fwd_bwd)
                    except Exception as exc:  # noqa: BLE001
                        print("attention failed:", backend_name, d_qk, causal, s, str(exc)[:200], file=sys.stderr)
                        continue
                    # work done: causal computes half of the s x s square
                    fwd_flops = 2.0 * b * heads * s * s * (d_qk + d_v) * (0.5 if causal else 1.0)
                    common = {
                        "op": "core_attention",
                        "seq_length": s,
                        "heads": heads,
                        "head_dim": d_qk,
                        "head_dim_v": d_v,
                        "causal": causal,
                        "backend": backend_name,
                        "tokens": b * s,
                        "batch": b,
                    }
                    ops.append(
                        {
                            **common,
                            "phase": "fwd",
                            "flops": fwd_flops,
                            "time_ms": t_f,
                            "achieved_tflops": fwd_flops / t_f / 1e9,
                        }
                    )
                    t_b = max(t_fb - t_f, 1e-6)
                    ops.append(
                        {
                            **common,
                            "phase": "bwd",
                            "flops": 2 * fwd_flops,
                            "time_ms": t_b,
                            "achieved_tflops": 2 * fwd_flops / t_b / 1e9,
                        }
                    )
                    del q, k, v, g
        print(f"attention {backend_name} done {time.time() - t_start:.1f}s", file=sys.stderr, flush=True)

    n = 256 * 2**20  # 512 MiB of bf16
    x = torch.randn(n, device=dev, dtype=torch.bfloat16)
    y = torch.empty_like(x)
    z = torch.randn(n, device=dev, dtype=torch.bfloat16)
    ms = _timeit(lambda: y.copy_(x))
    ops.append(
        {
            "op": "hbm_copy",
            "phase": "fwd",
            "bytes": 4.0 * n,
            "time_ms": ms,
            "achieved_gbps": 4.0 * n / ms / 1e6,
            "flops": 0.0,
            "achieved_tflops": 0.0,
            "tokens": 0,
        }
    )
    ms = _timeit(lambda: torch.add(x, z, out=y))
    ops.append(
        {
            "op": "hbm_add",
            "phase": "fwd",
            "bytes": 6.0 * n,
            "time_ms": ms,
            "achieved_gbps": 6.0 * n / ms / 1e6,
            "flops": 0.0,
            "achieved_tflops": 0.0,
            "tokens": 0,
        }
    )
    out = {
        "schema_version": 1,
        "kind": "megatron-autotuner-calibration",
        "gpu": props.name,
        "device_name": props.name,
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "versions": {
            "torch": torch.__version__,
            "cuda": torch.version.cuda,
            "cudnn": str(torch.backends.cudnn.version()),
        },
        "sm_count": props.multi_processor_count,
        "ops": ops,
    }
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)
    print(f"wrote {len(ops)} entries in {time.time() - t_start:.1f}s", file=sys.stderr)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
