"""TP collectives on NVLink: predicted time per message size vs the 2x H200 traces and published 8-GPU plateaus.

    python benchmarks/nccl_curves.py [--out benchmarks/results/nccl_curves.json] [--write-fixtures]

Prints, per collective and size, what `costmodel.nccl_protocols` predicts (NCCL 2.28.9's algorithm / protocol
choice, NCCL's own estimate, the achieved time with the measured corrections) next to the measured NCCL kernel
durations of the committed traces and the alpha-beta model this replaced; refits the 2-rank Simple-protocol
correction from the traces; compares the 8-GPU plateaus with published nccl-tests numbers; and compares TE userbuffers'
curves with the userbuffers kernels of the TP=2 reference trace.
"""

# Evidence used:
# - NCCL kernels in the committed rank traces (2x H200, NCCL 2.28.9, TE 2.20.2, megatron-core 0.19.2): message
#   size from the kernel's "In/Out msg nelems" and dtype, protocol from its block size (544 threads = Simple
#   with the ring's sync warp, 640 = LL128, <= 512 = LL; see costmodel/nccl_protocols.py). A call counts as
#   clean when less than 5% of it overlaps another (non-NCCL) kernel: concurrent GEMMs slow NCCL down.
# - Published nccl-tests bus bandwidths of 8x H100 (NVLink 4, one node, ring, no NVLS): reduce-scatter 360 GB/s,
#   all-gather 350 GB/s (https://github.com/NVIDIA/nccl/issues/1281); all-reduce 330 GB/s with
#   NCCL_NVLS_ENABLE=0, 430 with NVLS (https://github.com/NVIDIA/nccl/issues/1221, NCCL 2.19.3); all-gather and
#   all-reduce ~360 GB/s at 128 MB - 16 GB, which NCCL's maintainer calls "exactly what we'd expect on H100"
#   (https://github.com/NVIDIA/nccl-tests/issues/326). These are large-message plateaus; their median sets the
#   8-rank entry of defaults.NCCL_CHUNKED_BW_FRACTION. No public per-size H100 / H200 table was found in this
#   workplace's corpora.
# - TE userbuffers kernels and copies of /work/shared/reference/traces/h200_te_layer_tp2_userbuffers_rank0
#   (copied, reduced, into tests/fixtures/ub_h200_tp2_kernels.json).

from __future__ import annotations

import argparse
import gzip
import json
import statistics
from pathlib import Path
from typing import Any

from megatron_autotuner import SCHEMA_VERSION, __version__
from megatron_autotuner.costmodel import defaults as d
from megatron_autotuner.costmodel.collectives import userbuffers_time_s
from megatron_autotuner.costmodel.nccl_protocols import (
    COLLECTIVES,
    NCCL_VERSION,
    achieved_time_s,
    crossover_bytes,
    nccl_choice,
    nccl_model,
    ring_graph,
)
from megatron_autotuner.specs import get_gpu_spec
from megatron_autotuner.theory.comm import wire_factor

ROOT = Path(__file__).resolve().parent.parent
TRACE_GLOBS = (
    "benchmarks/results/validation_h200_x2/traces/*.json.gz",
    "benchmarks/results/validation_h200_x2/moe_gpu/traces/*.json.gz",
    "benchmarks/results/testbench_h200_x2/profile/torch_profiler/*/rank_*.json.gz",
)
UB_TRACE = ROOT.parent / "shared/reference/traces/h200_te_layer_tp2_userbuffers_rank0.json.gz"
CALLS_FIXTURE = ROOT / "tests/fixtures/nccl_h200_x2_calls.json"
UB_FIXTURE = ROOT / "tests/fixtures/ub_h200_tp2_kernels.json"
COLL_NAMES = {"AllGather": "all_gather", "ReduceScatter": "reduce_scatter", "AllReduce": "all_reduce"}
DTYPE_BYTES = {"BFloat16": 2, "Float": 4, "Half": 2}
PUBLISHED_8GPU = (
    ("reduce_scatter", 360.0, "https://github.com/NVIDIA/nccl/issues/1281", "8x H100, nccl-tests busbw plateau"),
    ("all_gather", 350.0, "https://github.com/NVIDIA/nccl/issues/1281", "8x H100, nccl-tests busbw plateau"),
    ("all_reduce", 330.0, "https://github.com/NVIDIA/nccl/issues/1221", "8x H100, NCCL_NVLS_ENABLE=0, 2.19.3"),
    ("all_gather", 360.0, "https://github.com/NVIDIA/nccl-tests/issues/326", "8x H100, -g 8, 128 MB-16 GB plateau"),
    ("all_reduce", 360.0, "https://github.com/NVIDIA/nccl-tests/issues/326", "8x H100, -g 8, 128 MB-16 GB plateau"),
)
CLEAN = 0.05


def _events(path: Path) -> list[dict]:
    with gzip.open(path, "rt") as f:
        data = json.load(f)
    return data["traceEvents"] if isinstance(data, dict) else data


def protocol_from_threads(threads: int) -> str:
    """NCCL's protocol from a kernel's block size (enqueue.cc: Simple ring adds a sync warp to 512 threads)."""
    return "Simple" if threads == 544 else "LL128" if threads == 640 else "LL"


def extract_nccl_calls(path: Path) -> list[dict[str, Any]]:
    """Collective NCCL kernels of one trace: collective, ranks, full message bytes, protocol, us, clean."""
    kernels = [e for e in _events(path) if e.get("ph") == "X" and e.get("cat") == "kernel"]
    others = [(e["ts"], e["ts"] + e["dur"]) for e in kernels if "nccl" not in e["name"].lower()]
    out = []
    groups_seen: set[str] = set()
    for e in sorted(kernels, key=lambda k: k["ts"]):
        name = e["name"]
        if not name.startswith("ncclDevKernel_") or e["dur"] <= 0:
            continue
        kind = name.removeprefix("ncclDevKernel_").split("_")[0]
        a = e["args"]
        if kind not in COLL_NAMES or a.get("dtype") not in DTYPE_BYTES:
            continue
        nbytes = max(a.get("In msg nelems", 0), a.get("Out msg nelems", 0)) * DTYPE_BYTES[a["dtype"]]
        if nbytes <= 0:
            continue
        s, t = e["ts"], e["ts"] + e["dur"]
        overlap = sum(max(0.0, min(t, b) - max(s, x)) for x, b in others if b > s and x < t)
        # a group's first call in the trace also waits for the other ranks to arrive
        group = str(a.get("Process Group Name"))
        first = group not in groups_seen
        groups_seen.add(group)
        out.append(
            {
                "collective": COLL_NAMES[kind],
                "ranks": int(a["Group size"]),
                "bytes": int(nbytes),
                "protocol": protocol_from_threads(int(a["block"][0])),
                "channels": int(a["grid"][0]),
                "us": round(float(e["dur"]), 3),
                "clean": overlap / e["dur"] < CLEAN and not first,
                "first_in_group": first,
                "trace": str(path.relative_to(ROOT)),
            }
        )
    return out


def collect_calls() -> list[dict[str, Any]]:
    calls: list[dict[str, Any]] = []
    for pattern in TRACE_GLOBS:
        for path in sorted(ROOT.glob(pattern)):
            calls.extend(extract_nccl_calls(path))
    return calls


def extract_ub_kernels(path: Path) -> list[dict[str, Any]]:
    """Userbuffers kernels and peer copies of the TP=2 userbuffers trace: name, SM blocks, bytes, us."""
    out = []
    for e in _events(path):
        if e.get("ph") != "X" or e.get("cat") not in ("kernel", "gpu_memcpy"):
            continue
        name = e["name"]
        if "userbuffers" not in name and "Memcpy PtoP" not in name:
            continue
        out.append(
            {
                "name": name.split("(")[0].strip(),
                "blocks": (e["args"].get("grid") or [None])[0],
                "bytes": e["args"].get("bytes"),
                "us": round(float(e["dur"]), 3),
            }
        )
    return out


# defaults.LINK_EFFICIENCY["nvlink"] when NCCL's protocol curves replaced the alpha-beta model for ring collectives (it
# was an assumption then; the all-to-all / send-recv sweep measured 0.64 since)
REPLACED_NVLINK_EFFICIENCY = 0.8


def alpha_beta_old_s(collective: str, n: int, nbytes: float, nvlink_gbps: float) -> float:
    """The NVLink alpha-beta model this module replaced (defaults COLLECTIVE_BASE_LATENCY_S / HOP_LATENCY_S, and the
    NVLink efficiency of that time, `REPLACED_NVLINK_EFFICIENCY`)."""
    steps = 2 * (n - 1) if collective == "all_reduce" else n - 1
    alpha = d.COLLECTIVE_BASE_LATENCY_S + steps * d.HOP_LATENCY_S["nvlink"]
    return alpha + nbytes * wire_factor(collective, n) / (nvlink_gbps * 1e9 * REPLACED_NVLINK_EFFICIENCY)


def fit_simple(calls: list[dict[str, Any]], gpu) -> dict[str, Any]:
    """Least squares in relative error of t - NCCL latency = extra + wire / (fraction x NCCL bus bandwidth)
    over the clean Simple calls, one point per (collective, ranks, bytes): the median of its calls."""
    groups: dict[tuple, list[float]] = {}
    for c in calls:
        if c["protocol"] == "Simple" and c["clean"]:
            groups.setdefault((c["collective"], c["ranks"], c["bytes"]), []).append(c["us"])
    pts = []
    for (coll, n, nbytes), us in groups.items():
        latency_us, _ = nccl_model(coll, "ring", "Simple", n, gpu)
        t = statistics.median(us)
        pts.append((nbytes * wire_factor(coll, n), t - latency_us, t))
    # minimise sum(((a + b w) - y) / t)^2 for a (us) and b (us per byte)
    sw = sum(1 / t**2 for _, _, t in pts)
    sx = sum(w / t**2 for w, _, t in pts)
    sxx = sum(w * w / t**2 for w, _, t in pts)
    sy = sum(y / t**2 for _, y, t in pts)
    sxy = sum(w * y / t**2 for w, y, t in pts)
    det = sw * sxx - sx * sx
    a = (sy * sxx - sx * sxy) / det
    b = (sw * sxy - sx * sy) / det
    bus = 1e-3 / b  # GB/s: bytes / (b us per byte) -> 1e-3 GB/s per (byte/us)
    return {
        "sizes": len(pts),
        "calls": sum(len(v) for v in groups.values()),
        "extra_latency_us": a,
        "achieved_bus_gbps": bus,
        "bw_fraction_of_nccl_model": bus / ring_graph(gpu).bus_gbps,
        "wire_bytes_range": [min(p[0] for p in pts), max(p[0] for p in pts)],
    }


def compare_calls(calls: list[dict[str, Any]], gpu) -> list[dict[str, Any]]:
    groups: dict[tuple, list[float]] = {}
    for c in calls:
        if c["clean"]:
            groups.setdefault((c["collective"], c["ranks"], c["bytes"], c["protocol"]), []).append(c["us"])
    rows = []
    for (coll, n, nbytes, proto), us in sorted(groups.items()):
        measured = statistics.median(us)
        algo, chosen, nccl_us = nccl_choice(coll, n, nbytes, gpu)
        new = achieved_time_s(coll, n, nbytes, gpu) * 1e6
        old = alpha_beta_old_s(coll, n, nbytes, gpu.nvlink_gbps) * 1e6
        rows.append(
            {
                "collective": coll,
                "ranks": n,
                "bytes": nbytes,
                "calls": len(us),
                "measured_protocol": proto,
                "predicted_protocol": f"{algo}/{chosen}",
                "measured_us": measured,
                "measured_bus_gbps": nbytes * wire_factor(coll, n) / measured / 1e3,
                "nccl_estimate_us": nccl_us,
                "predicted_us": new,
                "error": new / measured - 1,
                "alpha_beta_us": old,
                "alpha_beta_error": old / measured - 1,
            }
        )
    return rows


def published_plateaus(gpu) -> list[dict[str, Any]]:
    rows = []
    nbytes = 8 * 2**30  # nccl-tests' largest default size, well on the plateau
    for coll, busbw, url, what in PUBLISHED_8GPU:
        t = achieved_time_s(coll, 8, nbytes, gpu)
        pred = nbytes * wire_factor(coll, 8) / t / 1e9
        old = nbytes * wire_factor(coll, 8) / alpha_beta_old_s(coll, 8, nbytes, gpu.nvlink_gbps) / 1e9
        rows.append(
            {
                "collective": coll,
                "ranks": 8,
                "published_bus_gbps": busbw,
                "source": url,
                "setup": what,
                "predicted_bus_gbps": pred,
                "error": pred / busbw - 1,
                "alpha_beta_bus_gbps": old,
                "alpha_beta_error": old / busbw - 1,
            }
        )
    return rows


def curves(gpu) -> list[dict[str, Any]]:
    rows = []
    for coll in COLLECTIVES:
        for n in (2, 4, 8):
            for p in range(10, 32):
                nbytes = float(2**p)
                algo, proto, nccl_us = nccl_choice(coll, n, nbytes, gpu)
                row = {
                    "collective": coll,
                    "ranks": n,
                    "bytes": int(nbytes),
                    "nccl_choice": f"{algo}/{proto}",
                    "nccl_estimate_us": nccl_us,
                    "predicted_us": achieved_time_s(coll, n, nbytes, gpu) * 1e6,
                    "alpha_beta_us": alpha_beta_old_s(coll, n, nbytes, gpu.nvlink_gbps) * 1e6,
                }
                if coll != "all_reduce":
                    row["ub_ring_exchange_us"] = userbuffers_time_s("ring_exchange", coll, n, nbytes) * 1e6
                rows.append(row)
    return rows


def ub_comparison(kernels: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """TP=2, tensor [8192 tokens x 4096] bf16 = 67.1 MB: predicted userbuffers pieces vs the trace."""
    msg = 2 * 8192 * 4096

    def med(name: str, blocks: int | None = None) -> float:
        us = [k["us"] for k in kernels if k["name"].endswith(name) and (blocks is None or k["blocks"] == blocks)]
        return statistics.median(us)

    copy_us = med("Memcpy PtoP")
    step_us = med("kuserbuffers_pushsend") + med("kuserbuffers_pushrecv")
    rows = [
        ("ring_exchange", "all_gather", userbuffers_time_s("ring_exchange", "all_gather", 2, msg), copy_us + step_us),
        (
            "bulk",
            "all_gather",
            userbuffers_time_s("bulk", "all_gather", 2, msg),
            med("userbuffers_fp16_sum_inplace_gpu_rw_ag<2>"),
        ),
        (
            "bulk",
            "reduce_scatter",
            userbuffers_time_s("bulk", "reduce_scatter", 2, msg),
            med("userbuffers_fp16_sum_inplace_gpu_rr_rs<2>"),
        ),
        (
            "pipeline",
            "reduce_scatter",
            userbuffers_time_s("pipeline", "reduce_scatter", 2, msg),
            4 * med("userbuffers_fp16_sum_inplace_gpu_rr_rs_oop<2>", 16),
        ),
    ]
    return [
        {
            "method": m,
            "collective": c,
            "bytes": msg,
            "predicted_us": p * 1e6,
            "measured_us": meas,
            "error": p * 1e6 / meas - 1,
        }
        for m, c, p, meas in rows
    ]


def build(calls: list[dict[str, Any]], ub_kernels: list[dict[str, Any]]) -> dict[str, Any]:
    gpu = get_gpu_spec("H200")
    h100 = get_gpu_spec("H100-SXM")
    fit = fit_simple(calls, gpu)
    graph = ring_graph(gpu)
    return {
        "schema_version": SCHEMA_VERSION,
        "tool_version": __version__,
        "nccl_model_version": NCCL_VERSION,
        "inputs": {
            "traces": sorted({c["trace"] for c in calls}),
            "ub_trace": "shared/reference/traces/" + UB_TRACE.name,
        },
        "ring_graph": {"gpu": gpu.name, "channels": graph.channels, "bw_per_channel_gbps": graph.bw_per_channel_gbps},
        "crossovers": {
            f"{coll}/{n}": [[int(b), f"{a}/{p}"] for b, a, p in crossover_bytes(coll, n, gpu)]
            for coll in COLLECTIVES
            for n in (2, 4, 8)
        },
        "simple_fit": fit,
        "constants": {
            "NCCL_CHUNKED_EXTRA_LATENCY_S": d.NCCL_CHUNKED_EXTRA_LATENCY_S,
            "NCCL_CHUNKED_BW_FRACTION": d.NCCL_CHUNKED_BW_FRACTION,
        },
        "trace_calls": compare_calls(calls, gpu),
        "published_8gpu": published_plateaus(h100),
        "userbuffers_tp2": ub_comparison(ub_kernels),
        "curves_h200": curves(gpu),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/nccl_curves.json")
    parser.add_argument("--write-fixtures", action="store_true", help="refresh the tests' extracts of the traces")
    args = parser.parse_args(argv)
    calls = collect_calls()
    if args.write_fixtures:
        CALLS_FIXTURE.write_text(json.dumps(calls, indent=0) + "\n")
        if UB_TRACE.exists():
            UB_FIXTURE.write_text(json.dumps(extract_ub_kernels(UB_TRACE), indent=0) + "\n")
    ub = json.loads(UB_FIXTURE.read_text())
    report = build(calls, ub)
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    f = report["simple_fit"]
    print(
        f"Simple fit over {f['sizes']} sizes ({f['calls']} clean calls): +{f['extra_latency_us']:.1f} us, "
        f"{f['achieved_bus_gbps']:.0f} GB/s "
        f"({f['bw_fraction_of_nccl_model']:.2f} of NCCL's {report['ring_graph']['channels']} x "
        f"{report['ring_graph']['bw_per_channel_gbps']:.0f} GB/s)"
    )
    print(
        f"{'collective':15} {'n':>2} {'bytes':>12} {'proto':>8} {'measured':>9} {'pred':>9} {'err':>7} "
        f"{'old':>9} {'err':>7}"
    )
    for r in report["trace_calls"]:
        print(
            f"{r['collective']:15} {r['ranks']:2d} {r['bytes']:12d} {r['predicted_protocol']:>8} "
            f"{r['measured_us']:9.1f} {r['predicted_us']:9.1f} {r['error']:+7.1%} {r['alpha_beta_us']:9.1f} "
            f"{r['alpha_beta_error']:+7.1%}"
        )
    for r in report["published_8gpu"]:
        print(
            f"8 GPU {r['collective']:15} published {r['published_bus_gbps']:.0f} GB/s, predicted "
            f"{r['predicted_bus_gbps']:.0f} ({r['error']:+.1%}), alpha-beta {r['alpha_beta_bus_gbps']:.0f}"
        )
    for r in report["userbuffers_tp2"]:
        print(
            f"ub {r['method']:14} {r['collective']:15} measured {r['measured_us']:.1f} us, "
            f"predicted {r['predicted_us']:.1f} ({r['error']:+.1%})"
        )


if __name__ == "__main__":
    main()
