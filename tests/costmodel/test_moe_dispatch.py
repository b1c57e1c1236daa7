"""The MoE dispatcher's token movement (`layer.moe_dispatch_work`) against megatron-core's real permute / sort /
unpermute kernels timed on H200 (benchmarks/moe_permute.py), and the NVLink efficiency against the NCCL sweep."""

from __future__ import annotations

import importlib.util
import json
import statistics
from dataclasses import replace
from pathlib import Path

import pytest

from megatron_autotuner.costmodel import defaults
from megatron_autotuner.costmodel.compute import memory_bound_time_s
from megatron_autotuner.costmodel.layer import LayerContext, moe_dispatch_work
from megatron_autotuner.specs import get_gpu_spec, load_model_spec
from megatron_autotuner.specs.hardware import ClusterSpec

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks/results"
H200 = get_gpu_spec("H200")
RUN = json.loads((RESULTS / "moe_permute_h200/moe_permute.json").read_text())


def _script(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / f"benchmarks/{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _fraction(bytes_per_unit: float, ps_per_unit: float) -> float:
    """A kernel's rate as the fraction of the H200's 4.8 TB/s that the cost model takes."""
    return bytes_per_unit / (ps_per_unit * 1e-12) / (defaults.FRACTION_MEASURED_ON_HBM_GBPS * 1e9)


def test_the_atomic_and_routing_map_rates_are_the_benchmarks_fit():
    assert RUN["env"]["device"] == "NVIDIA H200" and RUN["env"]["megatron_core"] == "0.19.2"
    fit = _script("moe_permute").fit(RUN["rows"])
    # 4 bytes per permuted element (read + write of bf16); 1 byte per routing-map entry
    expected = {
        "MOE_INDEX_ADD_HBM_EFFICIENCY": _fraction(4, fit["permute.bwd.unfused"]["permuted_ps"]),
        "MOE_SCATTER_ADD_HBM_EFFICIENCY": _fraction(4, fit["unpermute.fwd.unfused"]["permuted_ps"]),
        "MOE_ROUTING_MAP_UNFUSED_HBM_EFFICIENCY": _fraction(1, fit["permute.fwd.unfused"]["routing_map_ps"]),
        "MOE_ROUTING_MAP_FUSED_HBM_EFFICIENCY": _fraction(1, fit["permute.fwd.fused"]["routing_map_ps"]),
    }
    for name, fraction in expected.items():
        assert getattr(defaults, name) == pytest.approx(fraction, rel=0.03), name
    # the atomic fits are lines: every shape within a few percent
    assert fit["permute.bwd.unfused"]["max_error"] < 0.05 and fit["unpermute.fwd.unfused"]["max_error"] < 0.05


def _model_seconds(row: dict) -> tuple[float, float]:
    """The cost model's forward and backward seconds for one benchmark shape's three steps (EP 2 ranks' sort)."""
    base = load_model_spec("Qwen3-30B-A3B")
    model = replace(base, hidden_size=row["hidden"], num_moe_experts=row["experts"], moe_router_topk=row["topk"])
    ctx = LayerContext(cluster=ClusterSpec(H200, 2), ep=2, tokens=float(row["tokens"]), moe_permute_fusion=row["fused"])
    work = moe_dispatch_work(model, ctx, float(row["tokens"]), float(row["tokens"] * row["topk"]))
    fwd = sum(memory_bound_time_s(f, H200, 0, eff) for f, _, _, eff in work.values())
    bwd = sum(memory_bound_time_s(b, H200, 0, eff) for _, b, _, eff in work.values())
    return fwd, bwd


@pytest.mark.parametrize("fused", [False, True])
def test_the_dispatchers_time_is_its_kernels_time_on_every_large_shape(fused):
    """Kernel time (launch overheads apart) of permute + sort + unpermute, forward and backward, within 20% on every
    shape of at least 128 M permuted elements; the gathers and copies are not fitted (default HBM fraction)."""
    errors = []
    for row in RUN["rows"]:
        if row["fused"] != fused or row["tokens"] * row["topk"] * row["hidden"] < 2**27:
            continue
        model_fwd, model_bwd = _model_seconds(row)
        steps = row["steps"].values()
        measured = {p: sum(sum(s["kernel_us"][p].values()) for s in steps) * 1e-6 for p in ("fwd", "bwd")}
        errors += [model_fwd / measured["fwd"] - 1, model_bwd / measured["bwd"] - 1]
    assert len(errors) >= 20
    assert max(abs(e) for e in errors) < 0.2, errors
    assert abs(statistics.median(errors)) < 0.1


def test_the_atomic_index_add_of_the_4_gpu_trace_is_what_the_model_charges():
    """The same kernel inside a real 4-GPU training step (round 2's E32 layout, 32 k tokens, top-8, h 2048): 4.98 ms per
    layer in the trace's summary, 11% over the benchmark's rate: in the step it shares the GPU with the data-parallel
    collectives (charged apart, `NCCL_OVERLAP_COST`)."""
    name = "Qwen3-30B-A3B-E32.L12.g4.tp1.pp1.cp1.ep1.s8192.b4.none.train.04738182f3.summary.json"
    summary = json.loads((RESULTS / "plan_regret_h200_x4_r2/moe_traces" / name).read_text())
    (kernel,) = [k for k in summary["traces"][0]["top_kernels"] if "indexFuncLargeIndex" in k["name"]]
    model = load_model_spec("benchmarks/validation/models/Qwen3-30B-A3B-E32.json")
    ctx = LayerContext(cluster=ClusterSpec(H200, 4), tokens=32768.0, moe_host_bound=True)
    (_, atomic_bytes, _, eff) = moe_dispatch_work(model, ctx, 32768.0, 32768.0 * 8)["moe_permute_atomic"]
    assert memory_bound_time_s(atomic_bytes, H200, 0, eff) == pytest.approx(kernel["mean_us"] * 1e-6, rel=0.15)


def test_nvlink_efficiency_is_the_measured_all_to_all_and_send_recv_bandwidth():
    fits = json.loads((RESULTS / "nccl_sweep_fit.json").read_text())["fits"]
    busbw = [
        gbps
        for f in fits
        if f["collective"] in ("all_to_all", "sendrecv")
        for size, gbps in f["wire_gbps_by_bytes"].items()
        if int(size) >= 64 * 2**20
    ]
    assert len(busbw) == 12
    assert defaults.LINK_EFFICIENCY["nvlink"] == pytest.approx(statistics.median(busbw) / H200.nvlink_gbps, abs=0.005)
