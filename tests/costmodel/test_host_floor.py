"""The dense host floor: an eager megatron-core layer's phase never takes less than its host's issue time."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from megatron_autotuner.costmodel import CostOptions, calibration_from_dict, estimate
from megatron_autotuner.costmodel import defaults as d
from megatron_autotuner.costmodel.calibration import DEFAULT_DENSE_HOST_FLOOR, DenseHostFloor
from megatron_autotuner.costmodel.estimate import host_issue_ramp_s
from megatron_autotuner.costmodel.layer import (
    LayerContext,
    captured_host_share,
    dense_host_s,
    empty_queue_forward_s,
    forward_issue_groups_s,
    layer_cost,
)
from megatron_autotuner.errors import ConfigError
from megatron_autotuner.specs import ParallelConfig, Workload, load_model_spec
from megatron_autotuner.specs.hardware import ClusterSpec, get_gpu_spec
from megatron_autotuner.specs.parallel import CudaGraphConfig

H100 = get_gpu_spec("H100-SXM")
SMALL, LARGE = load_model_spec("Qwen3-0.6B"), load_model_spec("Llama-3.1-8B")


def _ctx(**kw) -> LayerContext:
    return LayerContext(cluster=ClusterSpec(H100, 1), **({"tokens": 4096.0, "seq_length": 4096} | kw))


def test_small_layer_carries_its_host_time_and_large_layers_the_same():
    """A layer's GPU phases stay GPU time; its host issue time rides along for the stage to compare."""
    eager, gpu_only = layer_cost(SMALL, 0, _ctx()), layer_cost(SMALL, 0, _ctx(host_floor=False))
    assert eager.fwd == gpu_only.fwd and eager.bwd == gpu_only.bwd
    assert (eager.host_fwd_s, eager.host_bwd_s) == pytest.approx((d.DENSE_HOST_FLOOR_FWD_S, d.DENSE_HOST_FLOOR_BWD_S))
    assert (gpu_only.host_fwd_s, gpu_only.host_bwd_s) == (0.0, 0.0)
    forward = layer_cost(SMALL, 0, _ctx(training=False))
    assert forward.host_bwd_s == 0.0
    assert forward.host_fwd_s == pytest.approx(d.DENSE_HOST_FLOOR_FWD_S * d.NO_GRAD_FWD_HOST_RATIO)
    assert forward.host_fwd_s < d.DENSE_HOST_FLOOR_FWD_S


def test_small_model_micro_batch_is_its_host_time_large_one_its_gpu_time():
    """Qwen3-0.6B at micro-batch 1: 28 layers of host time exceed the micro-batch's GPU work (output layer and loss
    included), which the host runs ahead of, and the step is its host's issue time: the layers, the work around
    them, then the optimizer step's; Llama-3.1-8B at 8k tokens stays GPU-bound."""
    p = ParallelConfig(num_gpus=1)
    w = Workload(4096, 1, 1)
    eager = estimate(SMALL, p, w, H100, CostOptions())
    gpu = estimate(SMALL, p, w, H100, CostOptions(host_floor=False))
    host = SMALL.num_layers * (d.DENSE_HOST_FLOOR_FWD_S + d.DENSE_HOST_FLOOR_BWD_S)
    optimizer = gpu.time.breakdown["optimizer"]
    assert gpu.step_time_s - optimizer < host
    microbatch, step = DEFAULT_DENSE_HOST_FLOOR.outside_layers_s()
    assert step > optimizer  # the optimizer's host work outlasts its kernels here
    assert eager.step_time_s == pytest.approx(host + microbatch + step)
    assert eager.time.breakdown["host_bound"] == pytest.approx(eager.step_time_s - gpu.step_time_s)
    large = Workload(8192, 1, 1)
    assert estimate(LARGE, p, large, H100, CostOptions()).step_time_s == pytest.approx(
        estimate(LARGE, p, large, H100, CostOptions(host_floor=False)).step_time_s
    )


@settings(max_examples=25, deadline=None)
@given(
    mbs=st.sampled_from([1, 2, 4, 8]),
    tp=st.sampled_from([1, 2, 4]),
    mode=st.sampled_from(["train", "forward"]),
)
def test_step_is_the_longer_of_host_and_gpu(mbs, tp, mode):
    p = ParallelConfig(num_gpus=tp, tp=tp, sequence_parallel=tp > 1)
    w = Workload(4096, mbs, mbs, mode=mode)
    eager = estimate(SMALL, p, w, H100, CostOptions())
    gpu = estimate(SMALL, p, w, H100, CostOptions(host_floor=False))
    ctx = _ctx(tp=tp, sequence_parallel=tp > 1, training=mode == "train")
    host_fwd, host_bwd = dense_host_s(ctx)
    train = mode == "train"
    # one micro-batch's host: its layers and the work around them; then, training, the optimizer step's
    microbatch, step = DEFAULT_DENSE_HOST_FLOOR.outside_layers_s()
    host = SMALL.num_layers * (host_fwd + (host_bwd if train else 0.0)) + microbatch
    extra = gpu.time.breakdown["optimizer"] + gpu.time.breakdown["exposed_comm"]["dp"]
    ramp = eager.time.stages[0].step_extra.get("host_ramp", 0.0)
    gpu_path = max(gpu.step_time_s, host + extra) + ramp
    host_path = host + (step if train else 0.0)
    assert eager.step_time_s == pytest.approx(max(gpu_path, host_path), rel=1e-9)
    assert "host_ramp" not in gpu.time.stages[0].step_extra  # no host, no queue


def _fifo_finish_s(items: list[tuple[float, float]]) -> float:
    """When the GPU finishes `items` (host issue s, GPU s), issued in order by one host thread into a queue
    that never fills and run in order by the GPU: each starts once issued and once the previous one is done."""
    issued = gpu_free = 0.0
    for host_s, gpu_s in items:
        issued += host_s
        gpu_free = max(gpu_free, issued) + gpu_s
    return gpu_free


@settings(max_examples=200, deadline=None)
@given(
    layers=st.integers(1, 40),
    h_f=st.floats(0.1, 5.0),
    h_b=st.floats(0.1, 5.0),
    g_f=st.floats(0.1, 5.0),
    g_b=st.floats(0.1, 10.0),
    head=st.floats(0.0, 20.0),
)
def test_ramp_is_what_a_launch_queue_adds_to_the_longer_of_host_and_gpu(layers, h_f, h_b, g_f, g_b, head):
    """One micro-batch: `layers` forward items, the output layer and loss (GPU only), `layers` backward items.
    The queue simulation finishes at max(host, GPU) + the ramp, within one layer's time (the ramp is computed at
    layer granularity: where inside a layer the maximum falls is left out)."""
    items = [(h_f, g_f)] * layers + [(0.0, head)] + [(h_b, g_b)] * layers
    host, gpu = layers * (h_f + h_b), layers * (g_f + g_b) + head
    ramp = host_issue_ramp_s(layers * h_f, layers * h_b, layers * g_f, gpu)
    assert ramp >= 0.0
    assert _fifo_finish_s(items) == pytest.approx(max(host, gpu) + ramp, abs=max(g_f, g_b, h_f, h_b) + 1e-9)


def test_tp_adds_the_host_of_its_collectives():
    floor = DenseHostFloor(fwd_s=3e-3, bwd_s=2e-3)
    fwd_sp, bwd_sp = floor.at(4, True)
    assert fwd_sp == pytest.approx(3e-3 + 4 * d.TP_COLLECTIVE_HOST_S)  # 2 all-gathers + 2 reduce-scatters
    assert bwd_sp == pytest.approx(2e-3 + 6 * d.TP_COLLECTIVE_HOST_S)
    assert floor.at(2, False) == pytest.approx((3e-3 + 2 * d.TP_COLLECTIVE_HOST_S, 2e-3 + 2 * d.TP_COLLECTIVE_HOST_S))
    measured_tp2 = DenseHostFloor(fwd_s=3.5e-3, bwd_s=2.5e-3, tp=2, sequence_parallel=True)
    assert measured_tp2.at(2, True) == (3.5e-3, 2.5e-3)  # measured where asked: as measured
    assert measured_tp2.at(1, False)[0] == pytest.approx(3.5e-3 - 4 * d.TP_COLLECTIVE_HOST_S)


def test_cuda_graphs_take_the_captured_share_off_the_host():
    eager = _ctx()
    whole = _ctx(cuda_graph_impl="transformer_engine")  # no scope: the whole layer
    attn = _ctx(cuda_graph_impl="transformer_engine", cuda_graph_scope=("attn",))
    both = _ctx(cuda_graph_impl="transformer_engine", cuda_graph_scope=("attn", "mlp"))
    router = _ctx(cuda_graph_impl="transformer_engine", cuda_graph_scope=("moe_router",))
    assert captured_host_share(eager) == 0.0
    assert captured_host_share(whole) == captured_host_share(both) == 1.0
    assert captured_host_share(attn) == d.ATTN_HOST_SHARE
    assert captured_host_share(router) == 0.0
    assert dense_host_s(whole) == (d.CUDA_GRAPH_REPLAY_HOST_FWD_S, d.CUDA_GRAPH_REPLAY_HOST_BWD_S)
    assert dense_host_s(eager)[0] > dense_host_s(attn)[0] > dense_host_s(whole)[0]
    # a whole graphed small model is back to its GPU time
    p, w = ParallelConfig(num_gpus=1), Workload(4096, 1, 1)
    graphed = w.replace(cuda_graph=CudaGraphConfig(impl="transformer_engine"))
    assert estimate(SMALL, p, graphed, H100, CostOptions()).time.breakdown["host_bound"] == 0.0
    assert estimate(SMALL, p, w, H100, CostOptions()).time.breakdown["host_bound"] > 0.0


def test_calibration_floor_replaces_the_default_and_steps_follow():
    doc = {"kind": "megatron-autotuner-calibration", "schema_version": 1, "gpu": "H100-SXM", "ops": []}
    fast = calibration_from_dict(doc | {"dense_host_floor": [{"precision": "bf16", "fwd_s": 1e-3, "bwd_s": 1e-3}]})
    slow = calibration_from_dict(doc | {"dense_host_floor": [{"precision": "bf16", "fwd_s": 6e-3, "bwd_s": 5e-3}]})
    p, w = ParallelConfig(num_gpus=1), Workload(4096, 1, 8)
    steps = [estimate(SMALL, p, w, H100, CostOptions(calibration=c)).step_time_s for c in (fast, None, slow)]
    assert steps[0] < steps[1] < steps[2]
    off = estimate(SMALL, p, w, H100, CostOptions(host_floor=False)).step_time_s
    assert off <= steps[0]
    # fp8 without its own entry takes the bf16 one (same host)
    assert fast.dense_host_floor("fp8", "tensorwise", 1).fwd_s == 1e-3


@pytest.mark.parametrize(
    "rows, field",
    [
        ({"precision": "bf16", "fwd_s": -1, "bwd_s": 1e-3}, "fwd_s"),
        ({"precision": "bf16", "fwd_s": 1e-3, "bwd_s": 1e-3, "tp": 0}, "tp"),
        ({"precision": "fp4", "fwd_s": 1e-3, "bwd_s": 1e-3}, "precision"),
    ],
)
def test_bad_dense_floor_entries_name_their_field(rows, field):
    doc = {"kind": "megatron-autotuner-calibration", "schema_version": 1, "gpu": "H100-SXM", "ops": []}
    with pytest.raises(ConfigError, match=field):
        calibration_from_dict(doc | {"dense_host_floor": [rows]})


def test_forward_only_passes_use_the_no_grad_forward_where_measured():
    """A forward-only pass runs the layer under torch.no_grad(): a calibration's `fwd_no_grad_s` is its floor, the
    training forward's `fwd_s` times the measured no-grad ratio stands in where it was not measured; training never
    reads it."""
    doc = {"kind": "megatron-autotuner-calibration", "schema_version": 1, "gpu": "H100-SXM", "ops": []}
    row = {"precision": "bf16", "fwd_s": 3e-3, "bwd_s": 2e-3}
    plain = calibration_from_dict(doc | {"dense_host_floor": [row]})
    no_grad = calibration_from_dict(doc | {"dense_host_floor": [row | {"fwd_no_grad_s": 2e-3}]})
    assert dense_host_s(_ctx(training=False, calibration=no_grad))[0] == pytest.approx(2e-3)
    assert dense_host_s(_ctx(training=False, calibration=plain))[0] == pytest.approx(3e-3 * d.NO_GRAD_FWD_HOST_RATIO)
    assert dense_host_s(_ctx(training=True, calibration=no_grad))[0] == pytest.approx(3e-3)
    assert no_grad.to_summary()["dense_host_floor"][0]["fwd_no_grad_s"] == 2e-3
    p, w = ParallelConfig(num_gpus=1), Workload(4096, 1, 8, mode="forward")
    fwd = [estimate(SMALL, p, w, H100, CostOptions(calibration=c)).step_time_s for c in (no_grad, plain)]
    assert fwd[0] < fwd[1]
    with pytest.raises(ConfigError, match="fwd_no_grad_s"):
        calibration_from_dict(doc | {"dense_host_floor": [row | {"fwd_no_grad_s": "fast"}]})


@settings(max_examples=25, deadline=None)
@given(
    model=st.sampled_from(["Qwen3-0.6B", "Qwen3-8B", "Llama-3.1-8B"]),
    tp=st.sampled_from([1, 2, 4]),
    seq=st.sampled_from([1024, 4096, 8192]),
    host_ms=st.floats(0.0, 20.0),
)
def test_empty_queue_forward_lies_between_the_longer_and_the_sum_of_host_and_gpu(model, tp, seq, host_ms):
    """From an empty queue the forward takes at least its GPU time and its host time and at most both in a row; its
    issue groups add up to the layer's forward; with no host time it is the GPU time, with a host far slower than
    the GPU it is the host time (the call returns after the last launch, whose work is done by then)."""
    spec = load_model_spec(model)
    ctx = LayerContext(ClusterSpec(H100, tp), tp=tp, sequence_parallel=tp > 1, tokens=float(seq), seq_length=seq)
    gpu = layer_cost(spec, 0, ctx).fwd.total
    groups = forward_issue_groups_s(spec, 0, ctx)
    assert len(groups) == 5 and all(g >= 0 for g in groups) and sum(groups) == pytest.approx(gpu)
    host = host_ms * 1e-3
    t = empty_queue_forward_s(spec, 0, ctx, host)
    assert max(gpu, host) - 1e-12 <= t <= gpu + host + 1e-12
    assert empty_queue_forward_s(spec, 0, ctx, 0.0) == pytest.approx(gpu)
    slow = 1e3 * gpu
    assert empty_queue_forward_s(spec, 0, ctx, slow) == pytest.approx(slow)
    # a host just slower than the GPU: the GPU waits on the late MLP launches, beyond both
    even = empty_queue_forward_s(spec, 0, ctx, gpu)
    assert even == pytest.approx(
        max(f * gpu + sum(groups[k:]) for k, f in enumerate(d.FORWARD_ISSUE_FRACTIONS[tp > 1]))
    )
    assert even > gpu


def test_empty_queue_forward_refuses_moe_layers():
    with pytest.raises(ConfigError, match="dense layers only"):
        forward_issue_groups_s(load_model_spec("Qwen3-30B-A3B"), 0, _ctx())
