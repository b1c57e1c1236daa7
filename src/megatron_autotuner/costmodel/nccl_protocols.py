"""NCCL's choice of algorithm and protocol for a collective inside one NVLink domain, and its time.

Source: NVIDIA/nccl tag v2.28.9-1 (the NCCL of the committed 2x H200 traces, torch 2.11.0+cu130):
- src/graph/tuning.cc `ncclTunerConstantsDefaults` (lines 142-199): base latencies per (algorithm,
  protocol), NVLink hardware latencies per hop, LL's bandwidth cap `llMaxBws`, LL128's per-channel cap
  `perChMaxRingLL128Bws`, Tree's `perChMaxTreeBws`;
- tuning.cc `ncclTopoTuneModel` (lines 267-404): bus bandwidth per (algorithm, protocol) =
  nChannels x bwIntra, then LL x 0.5 (capped by llMaxBw), LL128 x 0.92 (120 of 128 bytes per line,
  capped per channel), Tree all-reduce x 0.92 and LL / 3.8, LL128 x 7/9 on one node; algorithm
  bandwidth = bus bandwidth x nRanks / nsteps (Ring; nsteps 2(n-1) all-reduce, n-1 all-gather /
  reduce-scatter) or x 0.5 (Tree); latency = base + nsteps x hop (Ring), base + 2(n-1) x hop (Tree);
- tuning.cc `ncclTopoGetAlgoTime` (lines 584-601): time_us = latency + nBytes / (1000 x algBw_GBps), with
  Tree's size-dependent `treeCorrectionFactor`; enqueue.cc `topoGetAlgoInfo` takes the fastest;
- src/graph/search.cc (lines 976-1160, `ncclTopoDupChannels` 961-974) and topo.h (`SM90_NVLINK_BW 20.6`):
  the ring graph of an NVSwitch node. Each GPU reaches the switches over links x per-link bandwidth
  (H100/H200: 18 x 20.6 = 370.8 GB/s); the search takes the highest speed of its speed array that gives
  the most nChannels x speed (60 GB/s x 6 = 360 on Hopper), then duplicates channels (12 x 30). The
  traces agree: every NCCL kernel of a large message ran 24 blocks (`ncclTopoPostset` doubles the 12
  graph channels into 24 communicator channels).

Allowed here: Ring and Tree (all-reduce only) with LL, LL128 and Simple. NVLS (NVLink SHARP) is off in this
project: NVLink multicast is disabled on its machines (NCCL_NVLS_ENABLE=0, /work/.library/device/KINDS.md),
so NCCL never selects it. PAT needs one GPU per node (tuning.cc `ncclPatEnable`), CollNet a network
plugin: neither applies inside one node. LL128 is on by default on Hopper / Blackwell NVLink (tuning.cc
lines 478-494).

Reading the traces: a kernel's name does not give its protocol. NCCL compiles one specialised kernel per
collective and data type, named after RING_LL, which runs every algorithm / protocol through a function
table (src/device/generate.py `best_kernel`, lines 145-156): `ncclDevKernel_AllGather_RING_LL` ran
Simple for the large messages. The block size tells: Simple adds a sync warp to 512 threads (544;
enqueue.cc lines 1898-1903), LL uses at most 512, LL128 640. The sequence-parallel all-gathers and
reduce-scatters of the traces ran 544 threads: Simple, as this model selects; the small all-reduces
(4 B - 151 kB) ran 512 or fewer: LL, as selected.

NCCL's own estimate is the time it selects by, not the time a call takes. `achieved_time_s` adds what was
measured (defaults.NCCL_*): LL calls took what NCCL estimates, Simple calls a fixed overhead more and a
fraction of the modelled bandwidth that depends on the ring size (0.75 in the 2x H200 traces, 1.0 in published
8x H100 nccl-tests plateaus; `chunked_bw_fraction`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

from ..specs.hardware import GPUSpec
from . import defaults as d

NCCL_VERSION = "2.28.9"
ALGORITHMS = ("ring", "tree")
PROTOCOLS = ("LL", "LL128", "Simple")
COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter")

# tuning.cc lines 143-148: baseLatencies (us), (LL, LL128, Simple)
BASE_LATENCY_US = {"tree": (6.8, 14.0, 8.4), "ring": (6.6, 14.0, 8.4)}
# tuning.cc lines 151: hwLatencies[NVLINK] (us per hop), (LL, LL128, Simple)
NVLINK_HOP_LATENCY_US = {"tree": (0.6, 1.25, 4.0), "ring": (0.6, 1.9, 3.4)}
# tuning.cc lines 169-198, one node (index2 = 0) by architecture
LL_MAX_BW_GBPS = {"ampere": 87.7, "hopper": 141.0, "blackwell": 282.0}
PER_CHANNEL_RING_LL128_GBPS = {"ampere": 20.0, "hopper": 36.7, "blackwell": 73.4}
PER_CHANNEL_TREE_LL128_GBPS = {"ampere": 20.0, "hopper": 36.7, "blackwell": 55.6}
PER_CHANNEL_TREE_GBPS = {"ampere": 24.0, "hopper": 38.7, "blackwell": 70.0}
# tuning.cc lines 578-582: Tree all-reduce bandwidth factor per power of two of nBytes/64 (LL, LL128, Simple)
TREE_CORRECTION = (
    (1.0, 1.0, 1.0, 1.0, 0.9, 0.8, 0.7, 0.7, 0.7, 0.7, 0.6, 0.5, 0.4, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.0, 1.0, 1.0),
    (1.0, 1.0, 1.0, 1.0, 1.0, 0.9, 0.8, 0.8, 0.8, 0.7, 0.6, 0.6, 0.6, 0.6, 0.6, 0.6, 0.8, 0.9, 0.9, 0.9, 0.9, 1.0, 1.0),
    (0.9, 0.9, 0.9, 0.9, 0.9, 0.9, 0.9, 0.8, 0.7, 0.6, 0.6, 0.5, 0.5, 0.5, 0.5, 0.6, 0.7, 0.8, 0.7, 0.7, 0.8, 0.9, 0.9),
)
# topo.h: NCCL's bandwidth per NVLink link (GB/s) by architecture (SM80 20.0, SM90 20.6, SM100 40.1), and the
# link's spec rate per direction that divides a GPU's NVLink bandwidth into links (NVLink 3 and 4: 25 GB/s per
# link, 12 links on A100 and 18 on H100 / H200; NVLink 5: 50 GB/s, 18 links on B200; NVIDIA NVLink pages).
NCCL_NVLINK_BW_PER_LINK_GBPS = {"ampere": 20.0, "hopper": 20.6, "blackwell": 40.1}
NVLINK_SPEC_PER_LINK_GBPS = {"ampere": 25.0, "hopper": 25.0, "blackwell": 50.0}
# search.cc lines 976-986: the ring search's intra-node speeds (GB/s per channel), highest first
SPEED_ARRAY_INTRA = {
    "ampere": (40.0, 30.0, 20.0, 18.0, 15.0, 12.0, 10.0, 9.0, 7.0, 6.0, 5.0, 4.0, 3.0),
    "hopper": (60.0, 50.0, 40.0, 30.0, 24.0, 20.0, 15.0, 12.0, 11.0, 6.0, 3.0),
    "blackwell": (90.0, 80.0, 70.0, 60.0, 50.0, 40.0, 30.0, 24.0, 20.0, 19.0, 18.0),
}
MAX_RING_CHANNELS = 32  # init.cc: ringGraph->maxChannels = MAXCHANNELS / 2 (device.h MAXCHANNELS 64)
CC_MIN = {"ampere": 80, "hopper": 90, "blackwell": 100}


def architecture(gpu: GPUSpec) -> str:
    """NCCL's architecture class of `gpu`: by preset name, else by NVLink generation (per-direction GB/s)."""
    name = gpu.name.upper()
    if name.startswith(("A100", "A800")):
        return "ampere"
    if name.startswith(("H100", "H200", "H800", "H20")):
        return "hopper"
    if name.startswith(("B200", "GB200", "B300", "GB300")):
        return "blackwell"
    return "blackwell" if gpu.nvlink_gbps >= 900 else "hopper" if gpu.nvlink_gbps >= 450 else "ampere"


@dataclass(frozen=True)
class RingGraph:
    """NCCL's intra-node ring graph: channels and bandwidth per channel (GB/s) after duplication."""

    channels: int
    bw_per_channel_gbps: float

    @property
    def bus_gbps(self) -> float:
        return self.channels * self.bw_per_channel_gbps


@lru_cache(maxsize=64)
def ring_graph(gpu: GPUSpec) -> RingGraph:
    """search.cc: the speed whose channel count gives the most bandwidth (the highest such speed on ties, as
    the search only keeps a strictly better graph), then `ncclTopoDupChannels`."""
    arch = architecture(gpu)
    links = max(1, round(gpu.nvlink_gbps / NVLINK_SPEC_PER_LINK_GBPS[arch]))
    total = links * NCCL_NVLINK_BW_PER_LINK_GBPS[arch]
    best_ch, best_bw = 1, min(s for s in SPEED_ARRAY_INTRA[arch])
    for speed in SPEED_ARRAY_INTRA[arch]:
        if speed > total:
            continue
        ch = min(MAX_RING_CHANNELS, int(total // speed))
        if ch * speed > best_ch * best_bw:
            best_ch, best_bw = ch, speed
    if best_bw >= 25.0 and not (CC_MIN[arch] > 80 and best_bw < 50.0 and best_ch > 4):
        dup = min(2 * best_ch, MAX_RING_CHANNELS)
        best_bw /= -(-dup // best_ch)
        best_ch = dup
    return RingGraph(best_ch, best_bw)


def _nsteps(collective: str, n: int) -> int:
    return 2 * (n - 1) if collective == "all_reduce" else n - 1


@lru_cache(maxsize=4096)
def nccl_model(collective: str, algorithm: str, protocol: str, n: int, gpu: GPUSpec) -> tuple[float, float] | None:
    """(latency_us, algorithm bandwidth GB/s) NCCL's tuner assigns, or None where NCCL does not allow it."""
    if collective not in COLLECTIVES:
        raise ValueError(f"unknown collective {collective!r}")
    if algorithm == "tree" and collective != "all_reduce":
        return None
    arch, graph = architecture(gpu), ring_graph(gpu)
    p = PROTOCOLS.index(protocol)
    nsteps = _nsteps(collective, n)
    bus = graph.bus_gbps
    if algorithm == "ring":
        if protocol == "LL":
            bus = min(LL_MAX_BW_GBPS[arch], bus * 0.5)
        elif protocol == "LL128":
            bus = min(bus * 0.92, graph.channels * PER_CHANNEL_RING_LL128_GBPS[arch])
        alg_bw = bus * n / nsteps
        latency = BASE_LATENCY_US["ring"][p] + nsteps * NVLINK_HOP_LATENCY_US["ring"][p]
    else:
        bus = min(bus * 0.92, graph.channels * PER_CHANNEL_TREE_GBPS[arch])
        if protocol == "LL":
            bus = min(bus / 3.8, LL_MAX_BW_GBPS[arch])
        elif protocol == "LL128":
            bus = min(bus * 7.0 / 9.0, graph.channels * PER_CHANNEL_TREE_LL128_GBPS[arch])
        alg_bw = bus * 0.5
        latency = BASE_LATENCY_US["tree"][p] + 2 * (n - 1) * NVLINK_HOP_LATENCY_US["tree"][p]
    return latency, alg_bw


def nccl_estimate_us(collective: str, algorithm: str, protocol: str, n: int, nbytes: float, gpu: GPUSpec) -> float:
    """ncclTopoGetAlgoTime: latency + nBytes / (1000 x algBw), inf where not allowed."""
    model = nccl_model(collective, algorithm, protocol, n, gpu)
    if model is None:
        return float("inf")
    latency, bw = model
    if algorithm == "tree":
        log_size = int(nbytes // 64).bit_length() - 1
        if 0 <= log_size < 23:
            bw *= TREE_CORRECTION[PROTOCOLS.index(protocol)][log_size]
    return latency + nbytes / (1000.0 * bw)


@lru_cache(maxsize=65536)
def nccl_choice(collective: str, n: int, nbytes: float, gpu: GPUSpec) -> tuple[str, str, float]:
    """(algorithm, protocol, NCCL's estimate in us) NCCL picks for `nbytes` (the full buffer: all-gather
    output, reduce-scatter input, all-reduce buffer; enqueue.cc `getAlgoInfo`)."""
    options = [(nccl_estimate_us(collective, a, p, n, nbytes, gpu), a, p) for a in ALGORITHMS for p in PROTOCOLS]
    t, a, p = min(options)
    return a, p, t


def chunked_bw_fraction(n: int) -> float:
    """The fraction of NCCL's modelled bandwidth LL128 / Simple achieve on a ring of `n` ranks
    (`defaults.NCCL_CHUNKED_BW_FRACTION`, measured or published at 2 and 8 ranks): linear in log2(n) between
    measured ring sizes, the nearest measured value outside them."""
    table = sorted(d.NCCL_CHUNKED_BW_FRACTION.items())
    if n <= table[0][0]:
        return table[0][1]
    for (n0, f0), (n1, f1) in zip(table, table[1:], strict=False):
        if n <= n1:
            return f0 + (f1 - f0) * (math.log2(n) - math.log2(n0)) / (math.log2(n1) - math.log2(n0))
    return table[-1][1]


def achieved_time_s(collective: str, n: int, nbytes: float, gpu: GPUSpec) -> float:
    """Seconds one call takes with the algorithm / protocol NCCL picks, from NCCL's estimate and measurements:
    LL as NCCL estimates; LL128 and Simple (which stream in chunks through the FIFO buffers) with
    `defaults.NCCL_CHUNKED_EXTRA_LATENCY_S` more and `chunked_bw_fraction(n)` of the modelled bandwidth (LL128
    is not measured here and shares Simple's correction)."""
    if n <= 1 or nbytes <= 0:
        return 0.0
    algorithm, protocol, _ = nccl_choice(collective, n, nbytes, gpu)
    latency_us, bw = nccl_model(collective, algorithm, protocol, n, gpu)  # type: ignore[misc]
    if algorithm == "tree":
        log_size = int(nbytes // 64).bit_length() - 1
        if 0 <= log_size < 23:
            bw *= TREE_CORRECTION[PROTOCOLS.index(protocol)][log_size]
    if protocol == "LL":
        return latency_us * 1e-6 + nbytes / (bw * 1e9)
    return latency_us * 1e-6 + d.NCCL_CHUNKED_EXTRA_LATENCY_S + nbytes / (bw * 1e9 * chunked_bw_fraction(n))


def crossover_bytes(collective: str, n: int, gpu: GPUSpec, lo: float = 64.0, hi: float = 2.0**33) -> list[tuple]:
    """Message sizes (powers of two from `lo` to `hi`) where NCCL's choice changes: [(bytes, algo, proto)]."""
    out: list[tuple] = []
    size = lo
    last = None
    while size <= hi:
        a, p, _ = nccl_choice(collective, n, size, gpu)
        if (a, p) != last:
            out.append((size, a, p))
            last = (a, p)
        size *= 2
    return out
