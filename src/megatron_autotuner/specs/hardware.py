"""`GPUSpec` and `ClusterSpec`: the hardware numbers the analytical model divides by.

Every preset number cites its source. Peak TFLOP/s are *dense* (no 2:4 sparsity) tensor-core rates.
Bandwidths in GB/s are decimal (1 GB = 1e9 bytes), per direction; memory sizes are GiB (2**30 bytes).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import ConfigError, SpecNotFoundError
from ..files import CONFIG_LIMIT_BYTES, read_yaml_bounded

MIB = 2**20
GIB = 2**30


@dataclass(frozen=True)
class GPUSpec:
    """One GPU model: compute peaks, memory and links."""

    name: str
    bf16_tflops: float  # dense bf16 tensor-core peak
    fp8_tflops: float  # dense fp8 tensor-core peak; 0 where the GPU has no fp8 tensor cores
    hbm_gib: float  # device memory a process can see (GiB)
    hbm_gbps: float  # HBM bandwidth, GB/s
    nvlink_gbps: float  # NVLink bandwidth per GPU per direction, GB/s
    scale_out_gbps: float  # inter-node (InfiniBand / RoCE) bandwidth per GPU per direction, GB/s
    gpus_per_node: int = 8  # GPUs in one NVLink domain
    fp32_tflops: float = 0.0  # non-tensor fp32 peak (memory-bound ops do not use it; informative)
    # GPU <-> host (CPU memory) link per direction, GB/s: a spec peak (PCIe lanes x rate, or NVLink-C2C), not a
    # measurement; None = unknown. Host copies (verl's CPU offload) use a measured calibration table when there is
    # one, else this.
    host_link_gbps: float | None = None

    def __post_init__(self) -> None:
        # finite: an infinite bandwidth or peak (yaml's .inf) overflowed when the cost model rounded a time (#39)
        for name in ("bf16_tflops", "hbm_gib", "hbm_gbps", "nvlink_gbps", "scale_out_gbps"):
            if not 0 < getattr(self, name) < math.inf:
                raise ConfigError(f"gpu.{name}", f"must be a finite number > 0, got {getattr(self, name)!r}")
        if not 0 <= self.fp8_tflops < math.inf:
            raise ConfigError("gpu.fp8_tflops", "must be a finite number >= 0 (0 = no fp8 support)")
        # an integer: .inf GPUs per node made the search's node counts exhaust memory (#39)
        if isinstance(self.gpus_per_node, bool) or not isinstance(self.gpus_per_node, int) or self.gpus_per_node < 1:
            raise ConfigError("gpu.gpus_per_node", f"must be an integer >= 1, got {self.gpus_per_node!r}")
        if self.host_link_gbps is not None and not (
            isinstance(self.host_link_gbps, (int, float)) and 0 < self.host_link_gbps < math.inf
        ):
            raise ConfigError("gpu.host_link_gbps", f"must be > 0 GB/s (or left out), got {self.host_link_gbps!r}")

    def peak_tflops(self, precision: str) -> float:
        """Dense tensor-core peak for `precision` ('bf16' or 'fp8')."""
        if precision == "bf16":
            return self.bf16_tflops
        if precision == "fp8":
            if not self.fp8_tflops:
                raise ConfigError("precision", f"fp8 is not supported by {self.name} (no fp8 tensor cores)")
            return self.fp8_tflops
        raise ConfigError("precision", f"must be bf16 or fp8, got {precision!r}")

    @property
    def hbm_bytes(self) -> float:
        return self.hbm_gib * GIB

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


# Sources:
#  A100: NVIDIA A100 Tensor Core GPU datasheet (2021): BF16 312 TFLOPS dense; 40GB HBM2 1,555 GB/s;
#        80GB HBM2e 2,039 GB/s (SXM); NVLink 600 GB/s bidirectional. DGX A100: 8x 200 Gb/s HDR per node.
#        Memory seen by CUDA: 40,536 MiB and 81,251 MiB (cudaGetDeviceProperties on DGX A100).
#  H100 SXM: NVIDIA H100 Tensor Core GPU datasheet: BF16 989 TFLOPS, FP8 1,979 TFLOPS dense (half the
#        "with sparsity" figures); 80GB HBM3 3.35 TB/s; NVLink 900 GB/s bidirectional. DGX H100:
#        8x ConnectX-7 400 Gb/s. Memory seen by CUDA: 81,559 MiB (nvidia-smi on an H100 80GB HBM3).
#  H200 SXM: NVIDIA H200 datasheet: same compute as H100 SXM; 141GB HBM3e 4.8 TB/s; NVLink 900 GB/s.
#        Memory seen by CUDA: 143,771 MiB (nvidia-smi on an H200).
#  B200: NVIDIA HGX B200 datasheet: FP16/BF16 4.5 PFLOPS and FP8 9 PFLOPS *with sparsity* per GPU
#        -> 2,250 / 4,500 dense; 180 GB HBM3e (DGX B200: 1,440 GB total), 8 TB/s; NVLink 5 1.8 TB/s
#        bidirectional; DGX B200 8x ConnectX-7 400 Gb/s.
#  GB200: NVIDIA GB200 NVL72 datasheet, per GPU: FP16/BF16 5 PFLOPS and FP8 10 PFLOPS with sparsity
#        -> 2,500 / 5,000 dense; 186 GB HBM3e, 8 TB/s; NVLink 5 1.8 TB/s bidirectional in a 72-GPU
#        NVLink domain; ConnectX-8 800 Gb/s per GPU.
# Host link (`host_link_gbps`, per direction, spec peaks -- none of these is a measurement):
#  PCIe Gen5 x16: 32 GT/s x 16 lanes / 8 bits x 128/130 encoding = 63.0 GB/s per direction (PCI-SIG PCIe 5.0
#        base specification); NVIDIA's H100 and H200 datasheets list "PCIe Gen5: 128 GB/s" (both directions).
#        B200 (HGX B200) attaches over PCIe Gen5 x16 as well.
#  PCIe Gen4 x16: 16 GT/s x 16 / 8 x 128/130 = 31.5 GB/s per direction; the A100 datasheet lists "PCIe Gen4:
#        64 GB/s" (both directions).
#  GB200: NVLink-C2C to the Grace CPU, 900 GB/s bidirectional (GB200 NVL72 datasheet) = 450 per direction.
#  Pinned copies reach most of these peaks; pageable copies are staged through a pinned bounce buffer and reach
#  much less -- only a measured table (`Calibration.host_copy_gbps`) tells how much.
PCIE_GEN4_X16_GBPS = 16e9 * 16 / 8 * 128 / 130 / 1e9
PCIE_GEN5_X16_GBPS = 32e9 * 16 / 8 * 128 / 130 / 1e9
NVLINK_C2C_GBPS = 450.0
GPU_PRESETS: dict[str, GPUSpec] = {
    spec.name: spec
    for spec in (
        GPUSpec("A100-40GB", 312.0, 0.0, 40536 * MIB / GIB, 1555.0, 300.0, 25.0, 8, 19.5, PCIE_GEN4_X16_GBPS),
        GPUSpec("A100-80GB", 312.0, 0.0, 81251 * MIB / GIB, 2039.0, 300.0, 25.0, 8, 19.5, PCIE_GEN4_X16_GBPS),
        GPUSpec("H100-SXM", 989.0, 1979.0, 81559 * MIB / GIB, 3350.0, 450.0, 50.0, 8, 67.0, PCIE_GEN5_X16_GBPS),
        GPUSpec("H200", 989.0, 1979.0, 143771 * MIB / GIB, 4800.0, 450.0, 50.0, 8, 67.0, PCIE_GEN5_X16_GBPS),
        GPUSpec("B200", 2250.0, 4500.0, 180e9 / GIB, 8000.0, 900.0, 50.0, 8, 80.0, PCIE_GEN5_X16_GBPS),
        GPUSpec("GB200", 2500.0, 5000.0, 186e9 / GIB, 8000.0, 900.0, 100.0, 72, 80.0, NVLINK_C2C_GBPS),
    )
}

_GPU_ALIASES = {
    "a100": "A100-80GB",
    "a100-40g": "A100-40GB",
    "a100-80g": "A100-80GB",
    "h100": "H100-SXM",
    "h100-80gb": "H100-SXM",
    "h100-sxm5": "H100-SXM",
    "h200-sxm": "H200",
    "h200-141gb": "H200",
}


def _gpu_from_mapping(data: dict[str, Any], source: str) -> GPUSpec:
    base_name = data.get("base")
    if base_name is not None and not isinstance(base_name, str):
        raise ConfigError(f"{source}: base", f"must be the name of a GPU preset, got {base_name!r}")
    base = get_gpu_spec(base_name).to_dict() if base_name else {}
    fields = {f.name for f in dataclasses.fields(GPUSpec)}
    unknown = sorted(str(k) for k in set(data) - fields - {"base"})
    if unknown:
        raise ConfigError(f"{source}: {unknown[0]}", f"is not a GPU field (allowed: base, {', '.join(sorted(fields))})")
    merged = {**base, **{k: v for k, v in data.items() if k != "base"}}
    missing = sorted(fields - set(merged) - {"gpus_per_node", "fp32_tflops", "host_link_gbps"})
    if missing:
        raise ConfigError(f"{source}: {missing[0]}", "is required (or name a preset in 'base' to inherit from)")
    try:
        return GPUSpec(**merged)
    except (TypeError, ValueError, ArithmeticError) as exc:
        if isinstance(exc, ConfigError):
            raise
        raise ConfigError(source, f"bad GPU entry: {exc}") from exc


def load_gpu_specs_yaml(path: str | Path) -> dict[str, GPUSpec]:
    """Read user GPU definitions: a yaml mapping name -> fields (optionally `base: <preset>`)."""
    p = Path(path)
    data = read_yaml_bounded(p, "hardware_file", CONFIG_LIMIT_BYTES)
    if not isinstance(data, dict) or not data:
        raise ConfigError(str(p), "must be a yaml mapping of GPU name -> fields")
    specs = {}
    for name, fields in data.items():
        if not isinstance(fields, dict):
            raise ConfigError(f"{p}: {name}", "must be a mapping of fields")
        specs[str(name)] = _gpu_from_mapping({"name": str(name), **fields}, f"{p}: {name}")
    return specs


def get_gpu_spec(name: str, hardware_file: str | Path | None = None) -> GPUSpec:
    """A GPU by preset name (case-insensitive, common aliases accepted) or from a user yaml."""
    if hardware_file is not None:
        user = load_gpu_specs_yaml(hardware_file)
        if name in user:
            return user[name]
    by_lower = {k.lower(): k for k in GPU_PRESETS}
    key = by_lower.get(name.lower()) or _GPU_ALIASES.get(name.lower())
    if key is None:
        raise SpecNotFoundError(
            f"unknown GPU {name!r}; known: {', '.join(GPU_PRESETS)} (or define it in --hardware-file)"
        )
    return GPU_PRESETS[key]


@dataclass(frozen=True)
class ClusterSpec:
    """`num_gpus` GPUs of one type, `gpu.gpus_per_node` to an NVLink domain."""

    gpu: GPUSpec
    num_gpus: int

    def __post_init__(self) -> None:
        if self.num_gpus < 1:
            raise ConfigError("num_gpus", f"must be >= 1, got {self.num_gpus}")

    @property
    def gpus_per_node(self) -> int:
        return min(self.gpu.gpus_per_node, self.num_gpus)

    @property
    def num_nodes(self) -> int:
        return -(-self.num_gpus // self.gpu.gpus_per_node)

    def link_gbps(self, group_size: int, stride: int = 1) -> float:
        """Per-GPU bus bandwidth of a ring collective over `group_size` ranks spaced `stride` apart.

        Megatron orders ranks tp-fastest, so a group whose span (group_size x stride) fits in one
        node talks over NVLink. A larger group crosses the scale-out network, one NIC per GPU: its
        k = gpus_per_node / stride members in each node (the node's other `stride` groups run at the
        same time on the other NICs) carry k parallel rings (NCCL channels), one NIC each, so the
        bus bandwidth is min(k x NIC, NVLink). NCCL measures 192 GB/s all-reduce bus bandwidth across
        DGX A100 nodes with 8 x 200 Gb/s NICs (NVIDIA/nccl#812, k = 8); a group with one member per
        node (k = 1) gets one NIC.
        """
        if group_size <= 1:
            return float("inf")
        per_node = self.gpu.gpus_per_node
        if group_size * stride <= per_node:
            return self.gpu.nvlink_gbps
        members_per_node = max(1, min(group_size, per_node // max(stride, 1)))
        return min(members_per_node * self.gpu.scale_out_gbps, self.gpu.nvlink_gbps)
