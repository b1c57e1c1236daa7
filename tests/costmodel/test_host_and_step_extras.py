"""The eager-MoE host floor and the per-step memory-bound work (gradient scaling, optimizer)."""

import re
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from megatron_autotuner.costmodel import CostOptions, calibration_from_dict, estimate
from megatron_autotuner.costmodel import defaults as d
from megatron_autotuner.costmodel.calibration import MoeHostFloor
from megatron_autotuner.errors import ConfigError
from megatron_autotuner.specs import ParallelConfig, Workload, get_gpu_spec, load_model_spec
from megatron_autotuner.testbench.calibration import moe_host_floors_from_records
from megatron_autotuner.testbench.results import all_records, latest_by_case

ROOT = Path(__file__).resolve().parents[2]
H200 = get_gpu_spec("H200")
MOE = replace(load_model_spec("Qwen3-30B-A3B"), num_layers=4)
DENSE = replace(load_model_spec("Qwen3-8B"), num_layers=4)


def _step(model, parallel, workload, **options):
    return estimate(model, parallel, workload, H200, CostOptions(**options))


def _moe_block_records() -> list[dict]:
    records = all_records(ROOT / "benchmarks/results/testbench_h200_x2/rerun/moe_block")
    return [r for r in latest_by_case(records, 0).values() if r["status"] == "ok"]


def test_host_floor_constants_are_the_testbench_moe_block():
    """MOE_HOST_FLOOR_* are what the calibration writer fits to the committed testbench MoE block (128 / 64 local
    experts on 2x H200): the defaults and a machine's own calibration come from the same rule."""
    (floor,) = moe_host_floors_from_records(_moe_block_records())
    assert floor["precision"] == "bf16" and all(p["host_bound"] for p in floor["cases"])
    assert floor["fwd_s"] == pytest.approx(d.MOE_HOST_FLOOR_FWD_S, rel=0.02)
    assert floor["bwd_s"] == pytest.approx(d.MOE_HOST_FLOOR_BWD_S, rel=0.02)
    assert floor["bwd_per_local_expert_s"] == pytest.approx(d.MOE_HOST_FLOOR_BWD_PER_LOCAL_EXPERT_S, rel=0.02)
    # measured 3.5-5.5x the modelled GPU time of the whole layer (the unfused dispatcher kernels the block ran, at
    # their measured rates, the EP 2 all-to-all included): the host, not the GPU, sets the pace
    assert all(
        p["fwd_ms"] > 3.5 * p["layer_gpu_fwd_ms"] and p["bwd_ms"] > 3.5 * p["layer_gpu_bwd_ms"] for p in floor["cases"]
    )


def test_host_floor_fit_leaves_out_gpu_bound_cases_and_scales_one_expert_count():
    records = _moe_block_records()
    gpu_bound = [dict(r, real=dict(r["real"], fwd_ms={"median": 1.0}, bwd_ms={"median": 2.0})) for r in records]
    assert moe_host_floors_from_records(gpu_bound) == []  # no host-bound case: nothing said of the host
    one = [r for r in records if r["case"]["ep"] == 1]
    fast_host = [dict(r, real=dict(r["real"], bwd_ms={"median": r["real"]["bwd_ms"]["median"] / 2})) for r in one]
    (floor,) = moe_host_floors_from_records(fast_host)
    assert all(how.startswith("default line scaled") for how in floor["fit"].values())
    assert floor["bwd_s"] + 128 * floor["bwd_per_local_expert_s"] == pytest.approx(
        one[0]["real"]["bwd_ms"]["median"] * 5e-4
    )
    fp8 = [dict(r, case=dict(r["case"], dtype="fp8")) for r in records]
    tensorwise = [dict(r, case=dict(r["case"], dtype="fp8", fp8_recipe="tensorwise")) for r in records]
    floors = moe_host_floors_from_records(records + fp8 + tensorwise)
    assert [(f["precision"], f.get("fp8_recipe")) for f in floors] == [
        ("bf16", None),
        ("fp8", "delayed"),
        ("fp8", "tensorwise"),
    ]
    # a least-squares line that would start below zero goes through the origin: no negative host time
    bwd_ms = {1: 30.0, 2: 10.0}  # 128 / 64 local experts: the line would cross zero at 32
    steep = [dict(r, real=dict(r["real"], bwd_ms={"median": bwd_ms[r["case"]["ep"]]})) for r in records]
    (floor,) = moe_host_floors_from_records(steep)
    assert floor["bwd_s"] == 0 and floor["bwd_per_local_expert_s"] > 0 and "origin" in floor["fit"]["bwd"]


def _calibration(floors: list[dict]):
    return calibration_from_dict(
        {
            "kind": "megatron-autotuner-calibration",
            "schema_version": 1,
            "gpu": "H200",
            "ops": [],
            "moe_host_floor": floors,
        }
    )


def test_a_calibrated_host_floor_replaces_the_default():
    """A machine whose host runs the eager MoE block in half the time: the step loses half its host-bound time;
    fp8 without an entry of its own uses the bf16 floor of the same host."""
    p, w = ParallelConfig(8, ep=2), Workload(2048, 1, 16)
    half = MoeHostFloor(
        d.MOE_HOST_FLOOR_FWD_S / 2, d.MOE_HOST_FLOOR_BWD_S / 2, d.MOE_HOST_FLOOR_BWD_PER_LOCAL_EXPERT_S / 2
    )
    cal = _calibration([half.to_dict()])
    assert cal.moe_host_floor("fp8") == cal.moe_host_floor("bf16") == half
    tensorwise = MoeHostFloor(0.02, 0.02, 3e-4, precision="fp8", fp8_recipe="tensorwise")
    both = _calibration([half.to_dict(), tensorwise.to_dict()])
    assert both.moe_host_floor("fp8", "tensorwise") == both.moe_host_floor("fp8", "delayed") == tensorwise
    assert both.moe_host_floor("bf16") == half
    default = _step(MOE, p, w, moe_host_bound=True)
    calibrated = _step(MOE, p, w, moe_host_bound=True, calibration=cal)
    assert 0 < calibrated.time.breakdown["host_bound"] < 0.6 * default.time.breakdown["host_bound"]
    tuned = _step(MOE, p, w, moe_host_bound=False, calibration=cal)
    assert tuned.step_time_s == _step(MOE, p, w, moe_host_bound=False).step_time_s  # tuned MoE: no floor
    assert _calibration([]).moe_host_floor("bf16") is None


@pytest.mark.parametrize(
    "floors, field",
    [
        ([{"fwd_s": 0.01, "bwd_s": 0.01}], "moe_host_floor[0].bwd_per_local_expert_s"),
        ([{"fwd_s": -1, "bwd_s": 0.01, "bwd_per_local_expert_s": 0}], "moe_host_floor[0].fwd_s"),
        ([{"fwd_s": 0, "bwd_s": 0, "bwd_per_local_expert_s": 0, "precision": "fp4"}], "moe_host_floor[0].precision"),
        ([MoeHostFloor().to_dict()] * 2, "moe_host_floor"),
        ([{"fwd_s": 0, "bwd_s": 0, "bwd_per_local_expert_s": 0, "fp8_recipe": "tensorwise"}], "[0].fp8_recipe"),
        ({"fwd_s": 0.01}, "moe_host_floor"),
    ],
)
def test_bad_host_floor_names_the_field(floors, field):
    with pytest.raises(ConfigError, match=re.escape(field)):
        _calibration(floors)


@settings(max_examples=12, deadline=None)
@given(ep=st.sampled_from([1, 2, 4, 8]), seq=st.sampled_from([1024, 4096, 16384]))
def test_host_floor_bounds_moe_layers_only(ep, seq):
    p = ParallelConfig(8, ep=ep)
    w = Workload(seq, 1, 16)
    # the MoE floor alone: no dense floor, no host work outside the layers (`host_floor`)
    eager = _step(MOE, p, w, moe_host_bound=True, host_floor=False)
    tuned = _step(MOE, p, w, moe_host_bound=False, moe_permute_fusion=True, host_floor=False)
    assert eager.step_time_s >= tuned.step_time_s
    assert tuned.time.breakdown["host_bound"] == 0.0
    # the step grows by the reported host-bound time and the unfused dispatcher's extra kernels (the eager block runs
    # without permute fusion), less DP communication the longer backward now hides
    grown, host = eager.step_time_s - tuned.step_time_s, eager.time.breakdown["host_bound"]
    unfused = eager.time.breakdown["compute"]["memory_bound"] - tuned.time.breakdown["compute"]["memory_bound"]
    assert unfused > 0
    assert host - tuned.time.breakdown["exposed_comm"]["dp"] - 1e-9 <= grown <= host + unfused + 1e-9
    # per micro-batch, each MoE layer takes at least its floor
    m = eager.time.num_microbatches
    floor = d.MOE_HOST_FLOOR_FWD_S + d.MOE_HOST_FLOOR_BWD_S + 128 // ep * d.MOE_HOST_FLOOR_BWD_PER_LOCAL_EXPERT_S
    assert eager.step_time_s >= m * MOE.num_layers * floor
    # dense models are not affected
    dense = ParallelConfig(8)
    assert _step(DENSE, dense, w, moe_host_bound=True).step_time_s == _step(DENSE, dense, w).step_time_s
    assert _step(DENSE, dense, w, moe_host_bound=True, host_floor=False).step_time_s == pytest.approx(
        _step(DENSE, dense, w, host_floor=False).step_time_s
    )


def test_fewer_local_experts_lower_the_floor():
    w = Workload(2048, 1, 16)
    steps = [_step(MOE, ParallelConfig(8, ep=ep), w, moe_host_bound=True) for ep in (1, 2, 4, 8)]
    hosts = [s.time.breakdown["host_bound"] for s in steps]
    assert hosts == sorted(hosts, reverse=True) and hosts[-1] > 0


def test_gradient_scaling_only_with_data_parallel_replicas():
    """Megatron scales gradients by 1/(dp*cp) in place before the reduce-scatter: 8 B per local
    parameter when dp*cp > 1, nothing with one replica."""
    w = Workload(4096, 1, 8)
    tp2 = _step(DENSE, ParallelConfig(2, tp=2, sequence_parallel=True), w)
    dp2 = _step(DENSE, ParallelConfig(2), w)
    cp2 = _step(DENSE, ParallelConfig(2, cp=2), w)

    def parts(est):
        return est.time.stages[0].step_extra["optimizer"]

    from megatron_autotuner.costmodel.compute import memory_bound_time_s
    from megatron_autotuner.costmodel.estimate import padded_vocab, stage_parameter_counts

    for est, replicas in ((tp2, 1), (dp2, 2), (cp2, 2)):
        counts = stage_parameter_counts(DENSE, est.parallel, 0, padded_vocab(DENSE, est.parallel.tp))
        shard = counts.total / replicas
        expected = memory_bound_time_s(d.OPTIMIZER_BYTES_PER_PARAM * shard, H200, 10, d.OPTIMIZER_HBM_EFFICIENCY)
        expected += memory_bound_time_s(d.GRAD_ZERO_BYTES_PER_PARAM * counts.total, H200, 1)
        if replicas > 1:
            expected += memory_bound_time_s(d.GRAD_SCALE_BYTES_PER_PARAM * counts.total, H200, 1)
        assert parts(est) == pytest.approx(expected)


@settings(max_examples=15, deadline=None)
@given(
    layout=st.sampled_from([dict(num_gpus=2), dict(num_gpus=4, tp=2, sequence_parallel=True), dict(num_gpus=4, pp=2)]),
    accumulation_fusion=st.booleans(),
    distributed=st.booleans(),
)
def test_bf16_main_grads_never_slow_a_step(layout, accumulation_fusion, distributed):
    """--grad-reduce-in-bf16: the DP reduce-scatter / all-reduce moves half the bytes and the main-grad passes
    (zero, 1/dp scale, unfused accumulation) stream fewer; the optimizer adds the fp32 cast of its shard. A
    training step is never slower, its exposed DP time never longer; forward-only steps do not change."""
    w = Workload(4096, 1, 8)
    opts = dict(gradient_accumulation_fusion=accumulation_fusion, overlap_grad_reduce=False)
    p32 = ParallelConfig(**layout, use_distributed_optimizer=distributed)
    p16 = p32.replace(grad_reduce_in_fp32=False)
    fp32, bf16 = _step(DENSE, p32, w, **opts), _step(DENSE, p16, w, **opts)
    assert bf16.step_time_s < fp32.step_time_s
    assert bf16.time.breakdown["exposed_comm"]["dp"] < fp32.time.breakdown["exposed_comm"]["dp"]
    fwd = w.replace(mode="forward")
    assert _step(DENSE, p16, fwd).step_time_s == _step(DENSE, p32, fwd).step_time_s


def test_bf16_main_grads_optimizer_step_bytes():
    """The step-end memory-bound work with bf16 main grads, byte by byte (`defaults`): the optimizer's fp32
    kernels plus the cast of the bf16 shard, zeroing 2 B and scaling 4 B per local parameter."""
    from megatron_autotuner.costmodel.compute import memory_bound_time_s
    from megatron_autotuner.costmodel.estimate import padded_vocab, stage_parameter_counts

    est = _step(DENSE, ParallelConfig(2, grad_reduce_in_fp32=False), Workload(4096, 1, 8))
    counts = stage_parameter_counts(DENSE, est.parallel, 0, padded_vocab(DENSE, 1))
    opt_bytes = d.OPTIMIZER_BYTES_PER_PARAM + d.OPTIMIZER_GRAD_CAST_BYTES_PER_PARAM_BF16
    expected = memory_bound_time_s(opt_bytes * counts.total / 2, H200, 10, d.OPTIMIZER_HBM_EFFICIENCY)
    expected += memory_bound_time_s(d.GRAD_ZERO_BYTES_PER_PARAM_BF16 * counts.total, H200, 1)
    expected += memory_bound_time_s(d.GRAD_SCALE_BYTES_PER_PARAM_BF16 * counts.total, H200, 1)
    assert est.time.stages[0].step_extra["optimizer"] == pytest.approx(expected)


@settings(max_examples=12, deadline=None)
@given(
    layout=st.sampled_from([dict(num_gpus=2), dict(num_gpus=2, tp=2, sequence_parallel=True), dict(num_gpus=4, pp=2)]),
    mode=st.sampled_from(["train", "forward"]),
)
def test_tensorwise_fp8_is_never_faster_than_delayed(layout, mode):
    """Per-tensor current scaling reads every tensor once more for its amax before the cast: the memory-bound
    time grows, the GEMMs do not change (on the GPU: the host floor, the same for both recipes, is left out)."""
    p = ParallelConfig(**layout)
    w = Workload(4096, 1, 8, precision="fp8", mode=mode)
    delayed = _step(DENSE, p, w, host_floor=False)
    tensorwise = _step(DENSE, p, w.replace(fp8_recipe="tensorwise"), host_floor=False)
    assert tensorwise.step_time_s > delayed.step_time_s
    assert tensorwise.time.breakdown["compute"]["gemm"] == delayed.time.breakdown["compute"]["gemm"]
    assert tensorwise.time.breakdown["compute"]["memory_bound"] > delayed.time.breakdown["compute"]["memory_bound"]


def test_fp8_cast_bytes_per_layer():
    """Each TE GEMM input (forward) and output gradient (backward) is cast once per micro-batch: the difference
    between the recipes is 2 bytes per element of exactly those tensors (`defaults.FP8_CAST_BYTES_PER_ELEMENT`)."""
    from megatron_autotuner.costmodel.compute import memory_bound_time_s
    from megatron_autotuner.costmodel.layer import LayerContext, gemm_shapes, layer_cost
    from megatron_autotuner.specs.hardware import ClusterSpec

    ctx = LayerContext(cluster=ClusterSpec(H200, 1), tokens=4096.0, seq_length=4096, precision="fp8")
    shapes = gemm_shapes(DENSE, 0, ctx)
    inputs = sum(m * k * g for op, (m, n, k, g) in shapes.items() if op != "router")
    out_grads = sum(m * n * g for op, (m, n, k, g) in shapes.items() if op != "router")
    costs = {r: layer_cost(DENSE, 0, replace(ctx, fp8_recipe=r)) for r in ("delayed", "tensorwise")}
    kernels = {r: d.FP8_CAST_KERNELS[r] * len([op for op in shapes if op != "router"]) for r in costs}
    for phase, elements in (("fwd", inputs), ("bwd", out_grads)):
        grown = (
            getattr(costs["tensorwise"], phase).parts["memory_bound"]
            - getattr(costs["delayed"], phase).parts["memory_bound"]
        )
        expected = memory_bound_time_s(6.0 * elements, H200, kernels["tensorwise"]) - memory_bound_time_s(
            4.0 * elements, H200, kernels["delayed"]
        )
        assert grown == pytest.approx(expected)


@pytest.mark.parametrize("recipe", ["delayed", "tensorwise"])
def test_fp8_params_step_extras_bytes(recipe):
    """Once per step, byte by byte (`defaults`): without fp8 parameters TE casts every bf16 TE weight (decoder
    parameters, not the embedding / output layer) at the first micro-batch; with them TE quantizes the
    optimizer's updated shard (after the bf16 copy, which stays), the transposes are rebuilt after the
    all-gather, and the all-gather moves 1 byte per TE weight."""
    from megatron_autotuner.costmodel.compute import memory_bound_time_s
    from megatron_autotuner.costmodel.estimate import padded_vocab, stage_parameter_counts

    p = ParallelConfig(2)
    w = Workload(4096, 1, 8, precision="fp8", fp8_recipe=recipe)
    counts = stage_parameter_counts(DENSE, p, 0, padded_vocab(DENSE, 1))
    base = memory_bound_time_s(d.OPTIMIZER_BYTES_PER_PARAM * counts.total / 2, H200, 10, d.OPTIMIZER_HBM_EFFICIENCY)
    base += memory_bound_time_s(d.GRAD_ZERO_BYTES_PER_PARAM * counts.total, H200, 1)
    base += memory_bound_time_s(d.GRAD_SCALE_BYTES_PER_PARAM * counts.total, H200, 1)
    cast = memory_bound_time_s(
        d.FP8_CAST_BYTES_PER_ELEMENT[recipe] * counts.decoder_dense, H200, d.FP8_CAST_KERNELS[recipe]
    )
    cached = _step(DENSE, p, w)
    assert cached.time.stages[0].step_extra["optimizer"] == pytest.approx(base + cast)
    # with fp8 params the bf16 copy stays and TE quantizes the updated shard with a slow (SM-bound) kernel: the
    # once-per-step work grows (H100 traces: +65 ms for 872 M parameters), and its shard part halves with dp
    params = _step(DENSE, p, w.replace(fp8_param=True))
    assert params.time.stages[0].step_extra["optimizer"] > cached.time.stages[0].step_extra["optimizer"]

    def shard_part(parallel):
        counts = stage_parameter_counts(DENSE, parallel, 0, padded_vocab(DENSE, 1))
        with_params = _step(DENSE, parallel, w.replace(fp8_param=True)).time.stages[0].step_extra["optimizer"]
        no_params = _step(DENSE, parallel, w).time.stages[0].step_extra["optimizer"]
        transposes = memory_bound_time_s(d.FP8_PARAM_TRANSPOSE_BYTES_PER_PARAM * counts.decoder_dense, H200, 1)
        return with_params - no_params - transposes + cast

    assert shard_part(ParallelConfig(4)) == pytest.approx(shard_part(p) / 2, rel=0.02)
    # the parameter all-gather is shorter, so exposed DP time never grows
    assert params.time.breakdown["exposed_comm"]["dp"] <= cached.time.breakdown["exposed_comm"]["dp"]


def test_fp8_forward_only_casts_write_no_transpose():
    """Under no_grad TE casts GEMM inputs without their transpose: 1 byte per element less than in training."""
    from megatron_autotuner.costmodel.compute import memory_bound_time_s
    from megatron_autotuner.costmodel.layer import LayerContext, gemm_shapes, layer_cost
    from megatron_autotuner.specs.hardware import ClusterSpec

    ctx = LayerContext(cluster=ClusterSpec(H200, 1), tokens=4096.0, seq_length=4096, precision="fp8")
    shapes = gemm_shapes(DENSE, 0, ctx)
    inputs = sum(m * k * g for op, (m, n, k, g) in shapes.items() if op != "router")
    kernels = len([op for op in shapes if op != "router"])
    train, fwd = layer_cost(DENSE, 0, ctx), layer_cost(DENSE, 0, replace(ctx, training=False))
    saved = train.fwd.parts["memory_bound"] - fwd.fwd.parts["memory_bound"]
    expected = memory_bound_time_s(4.0 * inputs, H200, kernels) - memory_bound_time_s(3.0 * inputs, H200, kernels)
    assert saved == pytest.approx(expected)
