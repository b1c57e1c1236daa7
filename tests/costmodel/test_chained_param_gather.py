"""Expert-parameter all-gathers that megatron-core's forward pre-hooks chain with no compute between
(`theory.comm.chained_expert_param_gathers`), against the profiled 4x H200 step that showed them
(benchmarks/results/plan_regret_h200_x4_r5/moonlight_traces: Moonlight-16B-A3B, 8 layers, dp 4 with all 64 experts
on every rank, micro-batch 8 x 4096 tokens, one micro-batch, distributed optimizer with overlapped gathers)."""

from __future__ import annotations

import bisect
import gzip
import importlib
import json
import statistics
from dataclasses import replace
from pathlib import Path

import pytest

from megatron_autotuner.costmodel.collectives import collective_time_s
from megatron_autotuner.costmodel.defaults import DDP_BUCKET_PARAMS
from megatron_autotuner.costmodel.estimate import CostOptions, estimate, stage_parameter_counts
from megatron_autotuner.specs import get_gpu_spec, load_model_spec
from megatron_autotuner.specs.hardware import ClusterSpec
from megatron_autotuner.specs.parallel import ParallelConfig, Workload
from megatron_autotuner.theory.comm import chained_expert_param_gathers

ROOT = Path(__file__).resolve().parents[2]
TRACES = ROOT / "benchmarks/results/plan_regret_h200_x4_r5/moonlight_traces"
TRACE = TRACES / "Moonlight-16B-A3B.L8.g4.tp1.pp1.cp1.ep1.s4096.b8.none.train.11a8580e02.rank_0.json.gz"
H200 = get_gpu_spec("H200")
MODEL = load_model_spec("Moonlight-16B-A3B").with_num_layers(8)
WORKLOAD = Workload(seq_length=4096, micro_batch_size=8, global_batch_size=32)


def _chained(parallel: ParallelConfig, model=MODEL) -> float:
    padded = model.vocab_size
    counts = stage_parameter_counts(model, parallel, 0, padded)
    return chained_expert_param_gathers(model, parallel, counts, DDP_BUCKET_PARAMS)


def _gather_runs() -> list[list[dict]]:
    """The trace's parameter all-gathers, grouped into runs with no compute kernel between one and the next."""
    trace = json.loads(gzip.decompress(TRACE.read_bytes()))
    kernels = sorted((e for e in trace["traceEvents"] if e.get("cat") == "kernel"), key=lambda e: e["ts"])
    compute_starts = [e["ts"] for e in kernels if "nccl" not in e["name"].lower()]
    gathers = [e for e in kernels if (e.get("args") or {}).get("Collective name", "").startswith("allgather")]
    runs = [[gathers[0]]]
    for prev, cur in zip(gathers, gathers[1:], strict=False):
        i = bisect.bisect_left(compute_starts, prev["ts"] + prev["dur"])
        if i < len(compute_starts) and compute_starts[i] < cur["ts"]:
            runs.append([cur])
        else:
            runs[-1].append(cur)
    return runs


def test_the_trace_chains_as_many_gathers_as_the_model_counts():
    chains = [run for run in _gather_runs() if len(run) > 1]
    measured = sum(len(run) for run in chains)  # 100 in the committed trace
    assert _chained(ParallelConfig(num_gpus=4)) == pytest.approx(measured, rel=0.10)  # 96.9


def test_a_chained_gather_takes_one_buckets_all_gather():
    """Past its first gather (which also waits for the other ranks to arrive), a chain's gathers run back to back
    at the model's all-gather time of one 40 M-parameter bf16 bucket over 4 ranks."""
    chains = [run for run in _gather_runs() if len(run) > 1]
    followers_ms = statistics.median(e["dur"] / 1e3 for run in chains for e in run[1:])
    bucket_bytes = 2 * 7 * 2 * MODEL.moe_ffn_hidden_size * MODEL.hidden_size  # 7 fc1 weights: 40.37 M bf16
    model_ms = collective_time_s("all_gather", 4, bucket_bytes, ClusterSpec(H200, 4)) * 1e3
    assert model_ms == pytest.approx(followers_ms, rel=0.15)  # 0.23 ms either way


def test_no_chain_without_a_gather_over_expert_data_parallel_ranks():
    assert _chained(ParallelConfig(num_gpus=4, ep=4)) == 0.0  # edp 1: nothing to gather
    assert _chained(ParallelConfig(num_gpus=4, use_distributed_optimizer=False)) == 0.0  # all-reduce, no gather
    # interleaving: Megatron-LM aligns the gathers (every bucket of a chunk dispatched at once)
    deep = MODEL.with_num_layers(16)
    assert _chained(ParallelConfig(num_gpus=4, pp=2, vpp=2), deep) == 0.0
    assert _chained(ParallelConfig(num_gpus=4, pp=2), deep) > 0.0
    # one local expert per module weight: each bucket boundary falls between modules, none inside one
    one_each = replace(MODEL, num_moe_experts=2, moe_router_topk=2)
    assert _chained(ParallelConfig(num_gpus=4, ep=2), one_each) == 0.0


def test_the_chain_grows_with_local_experts_and_is_exposed_in_the_step(monkeypatch):
    assert _chained(ParallelConfig(num_gpus=4)) > _chained(ParallelConfig(num_gpus=4, ep=2)) > 0.0
    options = CostOptions(gradient_accumulation_fusion=False)

    def exposed_dp_s() -> float:
        return estimate(MODEL, ParallelConfig(num_gpus=4), WORKLOAD, H200, options).time.stages[0].step_extra["dp"]

    with_chain = exposed_dp_s()
    monkeypatch.setattr(
        importlib.import_module("megatron_autotuner.costmodel.estimate"), "chained_expert_param_gathers", lambda *a: 0.0
    )
    without = exposed_dp_s()
    bucket_s = collective_time_s("all_gather", 4, 2 * DDP_BUCKET_PARAMS, ClusterSpec(H200, 4))
    # the chained buckets are exposed in full, less the overlap cost they no longer pay hidden
    assert with_chain - without > 0.4 * _chained(ParallelConfig(num_gpus=4)) * bucket_s
    no_overlap = CostOptions(gradient_accumulation_fusion=False, overlap_param_gather=False)
    serial = estimate(MODEL, ParallelConfig(num_gpus=4), WORKLOAD, H200, no_overlap).time.stages[0].step_extra["dp"]
    assert with_chain <= serial
