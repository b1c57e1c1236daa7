"""Where a rank's process may run on the host's CPUs, and binding it to its GPU's NUMA node.

Megatron-LM's `pretrain` leaves the launcher's CPU affinity as it is, except with fine-grained activation offloading
(megatron/training/training.py calls megatron-core's `set_ideal_affinity_for_current_gpu`: NVML's
`nvmlDeviceSetCpuAffinity`, the CPUs of the GPU's NUMA node). NUMA-binding launchers (Slurm `--cpu-bind`,
`numactl`) do the same from outside. An unbound process may be scheduled on the socket far from its GPU; each rank's
record says where it could run (`cpu_placement`), so that a rank's host pace can be read beside it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

NUMA_NODES_DIR = Path("/sys/devices/system/node")


def bind_to_gpu_numa_node() -> str:
    """Bind this process to the CPUs of its current GPU's NUMA node (megatron-core's
    `set_ideal_affinity_for_current_gpu`). Returns "gpu numa node", or why the affinity was left as it was."""
    try:
        from megatron.core.pipeline_parallel.utils import set_ideal_affinity_for_current_gpu

        set_ideal_affinity_for_current_gpu()
    except Exception as exc:  # noqa: BLE001 - the run goes on with the process's affinity; the record says so
        return f"not set ({type(exc).__name__}: {' '.join(str(exc).split())[:200]})"
    return "gpu numa node"


def parse_cpu_list(text: str) -> set[int]:
    """The CPUs of a Linux cpulist ("0-3,8,10-11")."""
    cpus: set[int] = set()
    for part in text.strip().split(","):
        if not part:
            continue
        low, _, high = part.partition("-")
        cpus.update(range(int(low), int(high or low) + 1))
    return cpus


def numa_node_cpus(nodes_dir: Path = NUMA_NODES_DIR) -> dict[int, set[int]]:
    """CPUs per NUMA node, from sysfs (empty where the host does not expose them)."""
    nodes: dict[int, set[int]] = {}
    for cpulist in sorted(nodes_dir.glob("node[0-9]*/cpulist")):
        nodes[int(cpulist.parent.name.removeprefix("node"))] = parse_cpu_list(cpulist.read_text())
    return nodes


def cpu_placement(allowed: set[int] | None = None, nodes: dict[int, set[int]] | None = None) -> dict[str, Any]:
    """Where this process may run: how many CPUs, and on which NUMA nodes (every node any allowed CPU is on)."""
    allowed = set(os.sched_getaffinity(0)) if allowed is None else allowed
    nodes = numa_node_cpus() if nodes is None else nodes
    return {
        "allowed_cpus": len(allowed),
        "numa_nodes": sorted(node for node, cpus in nodes.items() if cpus & allowed),
    }
