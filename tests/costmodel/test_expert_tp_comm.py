"""The MoE dispatcher's token movement over the expert-tensor-parallel group (`layer.expert_tp_comm_s`) against the
profiled 4x H200 step that showed it (benchmarks/results/plan_regret_h200_x4_r4/etp_trace: Qwen3-235B-A22B, 4
layers, tp = etp = 2 with sequence parallelism, no EP, micro-batch 8 x 4096 tokens, 2 micro-batches)."""

from __future__ import annotations

import gzip
import json
import statistics
from dataclasses import replace
from pathlib import Path

import pytest

from megatron_autotuner.costmodel.layer import LayerContext, expert_tp_comm_s, layer_cost
from megatron_autotuner.specs import get_gpu_spec, load_model_spec
from megatron_autotuner.specs.hardware import ClusterSpec

ROOT = Path(__file__).resolve().parents[2]
TRACE = (
    ROOT
    / "benchmarks/results/plan_regret_h200_x4_r4/etp_trace"
    / "Qwen3-235B-A22B.L4.g4.tp2.pp1.cp1.ep1.s4096.b8.none.train.93028a028c.rank_0.json.gz"
)
H200 = get_gpu_spec("H200")
MODEL = load_model_spec("Qwen3-235B-A22B")
TOKENS = 8 * 4096


def _ctx(**kw) -> LayerContext:
    base = dict(cluster=ClusterSpec(H200, 4), tp=2, etp=2, sequence_parallel=True, tokens=float(TOKENS))
    return LayerContext(**{**base, **kw})


def _expert_tp_collectives() -> dict[str, list[dict]]:
    """The trace's NCCL kernels on the expert-TP group, by collective, with their message sizes."""
    trace = json.loads(gzip.decompress(TRACE.read_bytes()))
    out: dict[str, list[dict]] = {}
    for e in trace["traceEvents"]:
        args = e.get("args") or {}
        if e.get("cat") == "kernel" and args.get("Process Group Description") == "EXPERT_TENSOR_PARALLEL_GROUP":
            out.setdefault(args["Collective name"], []).append({"ms": e["dur"] / 1e3, **args})
    return out


def test_the_trace_moves_what_the_dispatcher_model_says():
    calls = _expert_tp_collectives()
    # the routed tokens' gather: each rank's sequence-parallel share x top-k rows, hidden-wide, bf16 (the probs' and
    # their gradients' small collectives ride the same group)
    rows_per_rank = TOKENS // 2 * MODEL.moe_router_topk
    big_ag = [c for c in calls["all_gather"] if c["In msg nelems"] == rows_per_rank * MODEL.hidden_size]
    big_rs = [c for c in calls["reduce_scatter"] if c["Out msg nelems"] == rows_per_rank * MODEL.hidden_size]
    # one gather and one reduce-scatter per MoE layer, micro-batch and pass: 4 layers x 2 micro-batches x fwd / bwd
    assert len(big_ag) == len(big_rs) == 4 * 2 * 2
    measured_s = (statistics.median(c["ms"] for c in big_ag) + statistics.median(c["ms"] for c in big_rs)) / 1e3
    assert expert_tp_comm_s(MODEL, _ctx()) == pytest.approx(measured_s, rel=0.15)


def test_nothing_moves_without_expert_tensor_parallelism():
    assert expert_tp_comm_s(MODEL, _ctx(etp=1)) == 0.0
    # a MoE layer without shared experts and etp = 1: its only TP collectives are the attention's
    moe_layer = next(i for i in range(MODEL.num_layers) if MODEL.is_moe_layer(i))
    dense = replace(MODEL, num_moe_experts=0, moe_router_topk=0)
    moe_tp = layer_cost(MODEL, moe_layer, _ctx(etp=1)).fwd.parts.get("tp", 0.0)
    dense_tp = layer_cost(dense, 0, _ctx(etp=1)).fwd.parts.get("tp", 0.0)
    assert 0 < moe_tp < dense_tp


def test_the_gather_grows_with_top_k_and_lands_on_the_expert_collectives():
    top2 = replace(MODEL, moe_router_topk=2)
    assert expert_tp_comm_s(MODEL, _ctx()) > 3 * expert_tp_comm_s(top2, _ctx())
    moe_layer = next(i for i in range(MODEL.num_layers) if MODEL.is_moe_layer(i))
    with_etp = layer_cost(MODEL, moe_layer, _ctx()).fwd.parts.get("ep", 0.0)
    without = layer_cost(MODEL, moe_layer, _ctx(etp=1)).fwd.parts.get("ep", 0.0)
    assert with_etp - without == pytest.approx(expert_tp_comm_s(MODEL, _ctx()), rel=1e-9)
