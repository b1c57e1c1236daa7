"""What one 4x H200 host's NCCL sweep says of the collectives the cost model times without NCCL's own tuning model.

    python benchmarks/nccl_sweep_fit.py [--json]

Reads benchmarks/results/nccl_h200_x4/nccl_sweep_x4.json (`benchmarks/nccl_sweep.py` on nvidia-h200-x4: NCCL 2.28.9,
NVLink multicast off; each call timed alone with CUDA events, median of 10 after 5 warm-ups) and writes
benchmarks/results/nccl_sweep_fit.json:

- per (collective, ranks): the host's part of each timed call, the median time of the smallest messages (4-64 KiB)
  less the GPU time the cost model gives them (NCCL's own latency; what a training step hides, as it issues its
  collectives ahead of the GPU);
- the GPU's effective wire bandwidth at each size: bytes each rank sends ((n-1)/n of its buffer for all-to-all, all of
  it for the ring send/recv) over the measured time less that host part. `defaults.NVLINK_ALL_TO_ALL_GBPS` and
  `defaults.NVLINK_SEND_RECV_GBPS` are these, at 1 MiB .. 1 GiB;
- every row's time beside today's cost model (`costmodel.collectives.collective_time_s`), host part added.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

from megatron_autotuner import __version__
from megatron_autotuner.costmodel.collectives import collective_time_s
from megatron_autotuner.specs import get_gpu_spec
from megatron_autotuner.specs.hardware import ClusterSpec

ROOT = Path(__file__).resolve().parents[1]
SWEEP = ROOT / "benchmarks/results/nccl_h200_x4/nccl_sweep_x4.json"
OUT = ROOT / "benchmarks/results/nccl_sweep_fit.json"
SMALL = (2**12, 2**16)  # bytes: the GPU part is NCCL's latency alone
FIT_SIZES = [2**p for p in (20, 22, 24, 26, 28, 30)]
MODEL_NAME = {"sendrecv": "send_recv"}


def wire_bytes(collective: str, n: int, nbytes: int) -> float:
    """Bytes each rank sends in one call: all-to-all keeps 1/n of its buffer, the ring send/recv sends it all."""
    return nbytes * (n - 1) / n if collective == "all_to_all" else float(nbytes)


def model_s(collective: str, n: int, nbytes: int, cluster: ClusterSpec) -> float:
    ranks = 2 if collective == "sendrecv" else n
    return collective_time_s(MODEL_NAME.get(collective, collective), ranks, nbytes, cluster)


def fit(rows: list[dict[str, Any]], collective: str, n: int, cluster: ClusterSpec) -> dict[str, Any]:
    mine = sorted((r for r in rows if r["collective"] == collective and r["ranks"] == n), key=lambda r: r["bytes"])
    small = [r for r in mine if SMALL[0] <= r["bytes"] <= SMALL[1]]
    host_s = statistics.median(r["us"] * 1e-6 - model_s(collective, n, r["bytes"], cluster) for r in small)
    gbps = {}
    for r in mine:
        if r["bytes"] in FIT_SIZES:
            gbps[r["bytes"]] = wire_bytes(collective, n, r["bytes"]) / (r["us"] * 1e-6 - host_s) / 1e9
    return {
        "collective": collective,
        "ranks": n,
        "host_part_s": host_s,
        "wire_gbps_by_bytes": {str(k): v for k, v in gbps.items()},
        "rows": [
            {
                "bytes": r["bytes"],
                "measured_s": r["us"] * 1e-6,
                "model_s_plus_host": model_s(collective, n, r["bytes"], cluster) + host_s,
            }
            for r in mine
        ],
    }


def build() -> dict[str, Any]:
    sweep = json.loads(SWEEP.read_text())
    cluster = ClusterSpec(get_gpu_spec("H200"), sweep["world_size"])
    fits = [
        fit(sweep["rows"], c, n, cluster)
        for c in ("all_gather", "reduce_scatter", "all_reduce", "all_to_all", "sendrecv")
        for n in (2, 4)
    ]
    return {
        "kind": "nccl-sweep-fit",
        "tool_version": __version__,
        "sweep": str(SWEEP.relative_to(ROOT)),
        "device": sweep["device"],
        "nccl": sweep["nccl"],
        "date": sweep["date"],
        "fits": fits,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    doc = build()
    OUT.write_text(json.dumps(doc, indent=1) + "\n")
    if args.json:
        print(json.dumps(doc, indent=1))
        return
    for f in doc["fits"]:
        bw = " ".join(f"{int(k) >> 20}M:{v:.0f}" for k, v in f["wire_gbps_by_bytes"].items())
        worst = max(abs(r["model_s_plus_host"] / r["measured_s"] - 1) for r in f["rows"] if r["bytes"] >= 2**24)
        print(
            f"{f['collective']:15s} {f['ranks']} host {f['host_part_s'] * 1e6:5.1f} us  GB/s {bw}  "
            f"model off by up to {worst:.0%} at >= 16 MiB"
        )


if __name__ == "__main__":
    main()
