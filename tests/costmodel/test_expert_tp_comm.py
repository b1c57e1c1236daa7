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


HOLDOUT = ROOT / "benchmarks/results/etp_holdout_h200_x4"


def _holdout() -> dict[str, dict]:
    """label -> prediction written before the lease, measured step and peak, and the rank-0 trace summary."""
    predicted = json.loads((HOLDOUT / "predicted.json").read_text())
    runs = [json.loads(line) for line in (HOLDOUT / "results.jsonl").read_text().splitlines()]
    assert predicted["predicted_at"] < min(r["env"]["date"] for r in runs)
    before = {row["label"]: row["predicted"] for row in predicted["layouts"]}
    out = {}
    for run in runs:
        summary = json.loads((HOLDOUT / "traces" / f"{run['layout_id']}.summary.json").read_text())["traces"][0]
        out[run["label"]] = {
            "step_err": before[run["label"]]["step_time_s"] / run["measured"]["step_time_s"] - 1,
            "peak_err": before[run["label"]]["peak_memory_gib"] / run["measured"]["peak_gib"] - 1,
            "trace": summary["overlap"],
        }
    return out


def test_the_held_out_expert_tp_layouts_as_they_ran():
    """Blind, on 4x H200: where few experts are local (Mixtral, 4 per rank at EP 2) or expert TP is off, the step
    and peak came within 5%. With all 128 of Qwen3-30B-A3B's small experts on every rank, expert TP runs slower than
    the gather / scatter volume says: at etp 2 the GPU idled 46% of the step (an eager MoE block of 128 local experts
    the host cannot keep up with), at etp 4 the expert-TP reduce-scatters took 56% of it (each waits for the last
    rank of the group to arrive). The model charges neither: these stay visible as known misses."""
    runs = _holdout()
    for label in ("etp e8 tp2 etp2 ep2", "etp e128 tp2 etp1 ep2"):
        assert abs(runs[label]["step_err"]) < 0.05 and abs(runs[label]["peak_err"]) < 0.05, label
    etp2, etp4 = runs["etp e128 tp2 etp2"], runs["etp e128 tp4 etp4"]
    assert etp2["step_err"] < -0.15 and etp2["trace"]["idle_us"] > 0.4 * etp2["trace"]["span_us"]
    reduce_scatter = next(c for c in etp4["trace"]["by_collective"] if c["name"] == "reduce_scatter")
    assert etp4["step_err"] < -0.5 and reduce_scatter["exposed_us"] > 0.5 * etp4["trace"]["span_us"]
    assert abs(etp2["peak_err"]) < 0.05 and -0.08 < etp4["peak_err"] < -0.05


def test_the_held_out_ep_and_etp_run_with_the_all_to_all_on_the_dispatched_rows():
    """The held-out run with both EP and expert TP (Mixtral tp 2 etp 2 ep 2): today's model, which all-to-alls a
    rank's own top-k rows before the expert-TP gather (`ModelSpec.dispatched_tokens`), puts it +2.5% over the
    measured step; counted on the gathered rows (etp x the bytes) it was +3.4% (docs/megatron_launches.md)."""
    from megatron_autotuner.validate.layout import Layout
    from megatron_autotuner.validate.predict import predict

    run = next(
        r for r in map(json.loads, (HOLDOUT / "results.jsonl").read_text().splitlines())
        if r["label"] == "etp e8 tp2 etp2 ep2"
    )  # fmt: skip
    now = predict(Layout.from_dict(run["layout"]), "H200", gradient_accumulation_fusion=False)["step_time_s"]
    assert 0.02 < now / run["measured"]["step_time_s"] - 1 < 0.03
