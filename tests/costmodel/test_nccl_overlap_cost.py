"""The compute an NVLink collective slows while the cost model hides it (`defaults.NCCL_OVERLAP_COST`), against the
4x H200 measurements it comes from (benchmarks/nccl_interference.py) and the scaling pairs that showed it
(benchmarks/scaling_pairs.py)."""

from __future__ import annotations

import importlib.util
import json
import statistics
from pathlib import Path

import pytest

from megatron_autotuner.costmodel import defaults
from megatron_autotuner.costmodel.collectives import hidden_collective_cost_s
from megatron_autotuner.specs import get_gpu_spec
from megatron_autotuner.specs.hardware import ClusterSpec

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks/results"
NAMES = {"reduce_scatter_fp32": "reduce_scatter", "all_gather_bf16": "all_gather", "all_reduce_bf16": "all_reduce",
         "sendrecv_bf16": "send_recv", "all_to_all_bf16": "all_to_all"}  # fmt: skip


def _script(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / f"benchmarks/{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_each_cost_is_the_median_of_its_measurements():
    runs = [json.loads(p.read_text()) for p in sorted((RESULTS / "nccl_interference_h200").glob("nccl_*.json"))]
    assert {(r["ranks"], r["cuda_device_max_connections"]) for r in runs} == {(2, "1"), (4, "1"), (4, None)}
    for coll, name in NAMES.items():
        shares = [
            (r["interleaved"][coll]["pair_ms"] - r["interleaved"][coll]["gemm_alone_ms"])
            / r["interleaved"][coll]["collective_alone_ms"]
            for r in runs
        ]
        assert defaults.NCCL_OVERLAP_COST[name] == pytest.approx(statistics.median(shares), abs=0.006)


def test_only_nvlink_collectives_that_run_hidden_cost_anything():
    cluster = ClusterSpec(get_gpu_spec("H100-SXM"), 16)
    assert hidden_collective_cost_s("reduce_scatter", 4, cluster, 1, 0.010) == pytest.approx(0.0038)
    assert hidden_collective_cost_s("reduce_scatter", 1, cluster, 1, 0.010) == 0.0
    assert hidden_collective_cost_s("reduce_scatter", 4, cluster, 1, 0.0) == 0.0
    # 4 ranks 8 apart leave the node: not measured, nothing charged
    assert hidden_collective_cost_s("reduce_scatter", 4, cluster, 8, 0.010) == 0.0


def test_the_scaling_pairs_report_is_what_the_script_makes_of_the_runs():
    committed = json.loads((RESULTS / "scaling_pairs.json").read_text())
    module = _script("scaling_pairs")
    kind_dir = RESULTS / "scaling_pairs_h200_x4"
    predicted = json.loads((kind_dir / "predicted.json").read_text())
    sides = {r["name"]: module.side_report(r, module._measured(kind_dir), predicted["gpu"]) for r in predicted["rows"]}
    pairs = [module.pair_report(pair, sides[small], sides[large]) for pair, small, large in module.PAIRS]
    (host,) = committed["hosts"]
    assert pairs == host["pairs"]


def test_the_dense_pairs_on_4_gpus_are_within_5_percent_with_the_cost():
    """One GPU was within 1.2% and stays so (no collective); every dense layout on 2-4 GPUs was 2-7% under before the
    cost was charged, and is within 5% with it, nearer the measurement than the prediction made before the runs."""
    (host,) = json.loads((RESULTS / "scaling_pairs.json").read_text())["hosts"]
    dense = [p for p in host["pairs"] if not p["pair"].startswith("moe")]
    for p in dense:
        for side in (p["small"], p["large"]):
            now = side["predicted_now_step_time_s"] / side["measured_step_time_s"] - 1
            before = side["predicted_step_time_s"] / side["measured_step_time_s"] - 1
            assert abs(now) <= 0.05, side["label"]
            assert abs(now) <= abs(before) + 1e-9, side["label"]
            if " 1 gpu " in side["label"]:
                assert now == pytest.approx(before) and abs(now) <= 0.012
