"""`mat hardware`: list GPU presets (and user-defined GPUs from a yaml file)."""

from __future__ import annotations

import argparse

from ..argspec.argtypes import non_empty_path
from ..specs import GPU_PRESETS, load_gpu_specs_yaml
from .output import console, make_table, print_json


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "hardware",
        help="list GPU presets",
        description="The GPU presets (dense peak TFLOP/s, HBM size and bandwidth, NVLink and scale-out bandwidth), "
        "with those a --hardware-file adds or overrides.",
        epilog="examples:\n  mat hardware\n  mat hardware --json",
    )
    p.add_argument(
        "--hardware-file",
        type=non_empty_path,
        help="yaml with extra or overridden GPU definitions (default: the shipped presets only)",
    )
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    gpus = dict(GPU_PRESETS)
    if args.hardware_file:
        gpus.update(load_gpu_specs_yaml(args.hardware_file))
    if args.json:
        print_json({"gpus": [g.to_dict() for g in gpus.values()]})
        return 0
    columns = [
        "name",
        "bf16 TFLOP/s",
        "fp8 TFLOP/s",
        "HBM GiB",
        "HBM GB/s",
        "NVLink GB/s",
        "scale-out GB/s",
        "GPUs/node",
    ]
    rows = [
        [
            g.name,
            g.bf16_tflops,
            g.fp8_tflops or "-",
            round(g.hbm_gib, 1),
            g.hbm_gbps,
            g.nvlink_gbps,
            g.scale_out_gbps,
            g.gpus_per_node,
        ]
        for g in gpus.values()
    ]
    console().print(make_table("GPU presets (dense peaks; bandwidths per direction)", columns, rows))
    return 0
