"""The MoE host floor (`validate.host_floor.measure_host_floor`: the testbench `moe` cases, three processes each) of
a layouts file's MoE layouts, measured on the one GPU CUDA_VISIBLE_DEVICES names, optionally bound to that GPU's
NUMA node's CPUs first (the cases' processes inherit the binding). x2_rank_pace.sh runs one per GPU at once, to see
whether the floor differs between the GPUs of one host and with the binding.

    CUDA_VISIBLE_DEVICES=1 python benchmarks/validation/moe_floor_on_gpu.py LAYOUTS OUT_DIR [--bind]

Writes OUT_DIR/host_floor.calibration.json (the floor) and OUT_DIR/placement.json (where the process could run).
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from megatron_autotuner.validate.affinity import bind_to_gpu_numa_node, cpu_placement
from megatron_autotuner.validate.host_floor import measure_host_floor
from megatron_autotuner.validate.layout import load_layouts_file


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("layouts", type=Path)
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--bind", action="store_true", help="bind to the GPU's NUMA node's CPUs first")
    args = parser.parse_args()
    layouts, extra = load_layouts_file(args.layouts)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    if args.bind:
        import torch

        torch.cuda.set_device(0)
        binding = bind_to_gpu_numa_node()
    else:
        binding = "inherit"
    placement = {"gpu": os.environ.get("CUDA_VISIBLE_DEVICES"), "binding": binding, **cpu_placement()}
    (args.out_dir / "placement.json").write_text(json.dumps(placement) + "\n")
    print(json.dumps(placement))
    measure_host_floor(layouts, extra.get("gpu", "H200"), args.out_dir, num_gpus=1)


if __name__ == "__main__":
    main()
