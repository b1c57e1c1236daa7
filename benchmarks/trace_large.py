"""Benchmark: load + summarize a large synthetic Kineto trace; report wall time and peak RSS.

Usage: python benchmarks/trace_large.py [--size-mb 500] [--gzip] [--keep] [--out benchmarks/results/trace_large.json]

The trace is generated into /tmp (Kineto's pretty-printed layout, kernel names and stream counts
like the shipped TE userbuffers traces: CPU ops, runtime launches, ac2g flows, kernels on 16
streams, memcpys, gpu_user_annotations). Loading and summarizing run in a fresh child process,
so the reported peak RSS (ru_maxrss) is that of `load_trace` + `summarize` alone.
Targets (issue): 500 MB in under 60 s and under 3 GB RSS on a 2-core machine.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

KERNELS = [
    ("nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT", 250.0),
    ("nvjet_sm90_tst_128x192_64x5_4x1_v_bz_coopB_TNN", 120.0),
    (
        "void userbuffers_fp16_sum_inplace_gpu_rr_rs_oop<2>(int, int, int, int, int, int, int, int, int, void**, int, "
        "unsigned long)",
        60.0,
    ),
    ("kuserbuffers_pushsend(int*, int*, int4*, int4*, int)", 4.0),
    ("kuserbuffers_pushrecv(int, int, int, int, int*, int*, int, unsigned long, int*, int*)", 30.0),
    ("ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)", 150.0),
    ("cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_7_64x128x128_4x1x1_cga1x1x1_kernel0_0", 900.0),
    (
        "void transformer_engine::normalization::rmsnorm_fwd_tuned_kernel<transformer_engine::normalization::"
        "Kernel_traits<__nv_bfloat16, __nv_bfloat16, __nv_bfloat16, float, unsigned int, 4096u, 1u, 1u, 4u, 16u, "
        "transformer_engine::normalization::Kernel_traits_base<4096u, __nv_bfloat16, __nv_bfloat16, __nv_bfloat16, "
        "float, unsigned int, 128u> > >(transformer_engine::normalization::ForwardKernelParams)",
        20.0,
    ),
    (
        "void at::native::vectorized_elementwise_kernel<8, at::native::CUDAFunctor_add<c10::BFloat16>, "
        "std::array<char*, 3ul> >(int, at::native::CUDAFunctor_add<c10::BFloat16>, std::array<char*, 3ul>)",
        25.0,
    ),
    ("Memcpy PtoP (Device -> Device)", 88.0),
    ("Memcpy DtoD (Device -> Device)", 17.0),
]
CPU_OPS = ["_LayerNormLinear", "aten::empty", "aten::view", "_Linear", "aten::add", "FusedAttnFunc", "aten::copy_"]


def _header(rank: int) -> str:
    top = {
        "schemaVersion": 1,
        "deviceProperties": [{"id": 0, "name": "NVIDIA H200", "totalGlobalMem": 150109880320, "numSms": 132}],
        "distributedInfo": {"backend": "nccl", "rank": rank, "world_size": 2, "pg_count": 1, "pg_config": []},
        "displayTimeUnit": "ms",
        "baseTimeNanoseconds": 1790857026000000000,
    }
    body = json.dumps(top, indent=2)[:-2]  # drop the closing "\n}"
    return body + ',\n  "traceEvents": [\n'


def generate(path: Path, size_bytes: int, compress: bool) -> dict[str, int]:
    """Write a synthetic trace of about `size_bytes` uncompressed; return event counts."""
    opener = gzip.open(path, "wt", compresslevel=1) if compress else open(path, "w")  # noqa: SIM115
    ts = 4480427510000.0
    corr = 1
    written = 0
    n_events = n_gpu = 0
    with opener as f:
        head = _header(0)
        f.write(head)
        written += len(head)
        first = True
        batch: list[str] = []
        i = 0
        while written < size_bytes:
            name, dur = KERNELS[i % len(KERNELS)]
            op = CPU_OPS[i % len(CPU_OPS)]
            stream = 7 if i % 3 == 0 else 145 + (i % 16)
            cat = "gpu_memcpy" if name.startswith("Memcpy") else "kernel"
            k_ts = ts + 40.0 + (i % 5) * 3.1
            parts = [
                f'  {{\n    "ph": "X", "cat": "cpu_op", "name": "{op}", "pid": 1897, "tid": 1897,\n'
                f'    "ts": {ts:.3f}, "dur": 12.5,\n'
                f'    "args": {{\n      "External id": {corr}, "Record function id": 0, "Ev Idx": {i}\n    }}\n  }}',
                f'  {{\n    "ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1897, "tid": 1897,\n'
                f'    "ts": {ts + 2.0:.3f}, "dur": 5.2,\n'
                f'    "args": {{\n      "External id": {corr}, "cbid": 211, "correlation": {corr}\n    }}\n  }}',
                f'  {{\n    "ph": "s", "id": {corr}, "pid": 1897, "tid": 1897, "ts": {ts + 2.0:.3f},\n'
                f'    "cat": "ac2g", "name": "ac2g"\n  }}',
                f'  {{\n    "ph": "X", "cat": "{cat}", "name": "{name}", "pid": 0, "tid": {stream},\n'
                f'    "ts": {k_ts:.3f}, "dur": {dur:.3f},\n'
                f'    "args": {{\n      "External id": {corr}, "queued": 0, "device": 0, "context": 1,\n'
                f'      "stream": {stream}, "correlation": {corr}, "registers per thread": 168,\n'
                f'      "shared memory": 213248, "blocks per SM": 1.0, "warps per SM": 12.0,\n'
                f'      "grid": [132, 1, 1], "block": [384, 1, 1], "est. achieved occupancy %": 19\n    }}\n  }}',
                f'  {{\n    "ph": "f", "id": {corr}, "pid": 0, "tid": {stream}, "ts": {k_ts:.3f},\n'
                f'    "cat": "ac2g", "name": "ac2g", "bp": "e"\n  }}',
            ]
            n_events += 5
            n_gpu += 1
            if i % 50 == 0:
                parts.append(
                    f'  {{\n    "ph": "X", "cat": "gpu_user_annotation", "name": "fc1 fprop", "pid": 0, "tid": 7,\n'
                    f'    "ts": {k_ts:.3f}, "dur": 300.0,\n    "args": {{\n      "External id": {corr}\n    }}\n  }}'
                )
                n_events += 1
            text = ",\n".join(parts)
            if not first:
                text = ",\n" + text
            first = False
            batch.append(text)
            written += len(text)
            if len(batch) >= 2000:
                f.write("".join(batch))
                batch.clear()
            ts += 25.0
            corr += 1
            i += 1
        f.write("".join(batch))
        f.write('\n  ],\n  "traceName": "synthetic"\n}\n')
    return {"events": n_events, "gpu_events": n_gpu, "uncompressed_bytes": written}


def measure(path: str) -> None:
    """Child process: load + summarize, print one JSON line with times and peak RSS."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
    from megatron_autotuner.trace import load_trace, summarize

    t0 = time.perf_counter()
    trace = load_trace(path)
    t1 = time.perf_counter()
    summary = summarize(trace)
    t2 = time.perf_counter()
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(
        json.dumps(
            {
                "load_s": t1 - t0,
                "summarize_s": t2 - t1,
                "total_s": t2 - t0,
                "peak_rss_bytes": peak_kib * 1024,
                "gpu_events_loaded": len(trace.gpu_events),
                "cpu_ranges_loaded": len(trace.cpu_ranges),
                "overlap_us": summary.overlap.overlap_us,
                "comm_us": summary.overlap.comm_us,
                "unmatched_kernels": len(summary.unmatched_kernels),
            }
        )
    )


def measure_json_load(path: str) -> None:
    """Child process: the naive alternative, `json.load` of the whole file (no analysis)."""
    opener = gzip.open if path.endswith(".gz") else open
    t0 = time.perf_counter()
    with opener(path, "rt") as f:
        doc = json.load(f)
    elapsed = time.perf_counter() - t0
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(
        json.dumps({"json_load_s": elapsed, "json_load_peak_rss_bytes": peak_kib * 1024, "n": len(doc["traceEvents"])})
    )


def _child(flag: str, path: Path) -> dict:
    child = subprocess.run([sys.executable, __file__, flag, str(path)], capture_output=True, text=True, check=False)
    if child.returncode != 0:
        sys.stderr.write(child.stderr)
        raise SystemExit(1)
    return json.loads(child.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=float, default=500.0, help="uncompressed size in MB (10**6 bytes)")
    parser.add_argument("--gzip", action="store_true", help="write the synthetic trace gzip-compressed")
    parser.add_argument("--keep", action="store_true", help="keep the generated trace in /tmp")
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "trace_large.json"))
    parser.add_argument("--compare-json-load", action="store_true", help="also time a plain json.load of the file")
    parser.add_argument("--measure", help=argparse.SUPPRESS)
    parser.add_argument("--measure-json-load", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        measure(args.measure)
        return 0
    if args.measure_json_load:
        measure_json_load(args.measure_json_load)
        return 0

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
    from megatron_autotuner import SCHEMA_VERSION, __version__

    suffix = ".json.gz" if args.gzip else ".json"
    fd, name = tempfile.mkstemp(prefix="mat_trace_large_", suffix=suffix, dir="/tmp")
    os.close(fd)
    path = Path(name)
    try:
        t0 = time.perf_counter()
        counts = generate(path, int(args.size_mb * 1e6), args.gzip)
        gen_s = time.perf_counter() - t0
        result = _child("--measure", path)
        baseline = _child("--measure-json-load", path) if args.compare_json_load else {}
        baseline.pop("n", None)
        file_bytes = path.stat().st_size
    finally:
        if not args.keep:
            path.unlink(missing_ok=True)
    report = {
        "schema_version": SCHEMA_VERSION,
        "tool_version": __version__,
        "benchmark": "trace_large",
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": {
            "platform": platform.platform(),
            "python": platform.python_version(),
            "cpu_count": os.cpu_count(),
        },
        "inputs": {"size_mb": args.size_mb, "gzip": args.gzip, "file_bytes": file_bytes, **counts},
        "generate_s": gen_s,
        **result,
        **baseline,
        "targets": {"total_s_max": 60.0, "peak_rss_bytes_max": 3 * 2**30},
        "meets_targets": result["total_s"] < 60.0 and result["peak_rss_bytes"] < 3 * 2**30,
    }
    print(
        f"{file_bytes / 1e6:.0f} MB file ({counts['uncompressed_bytes'] / 1e6:.0f} MB JSON, "
        f"{counts['events']:,} events): "
        f"load {result['load_s']:.1f} s + summarize {result['summarize_s']:.1f} s = {result['total_s']:.1f} s, "
        f"peak RSS {result['peak_rss_bytes'] / 2**30:.2f} GiB"
    )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    return 0 if report["meets_targets"] else 1


if __name__ == "__main__":
    sys.exit(main())
