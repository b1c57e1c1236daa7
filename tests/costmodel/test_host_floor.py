"""The dense host floor: an eager megatron-core layer's phase never takes less than its host's issue time."""

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from megatron_autotuner.costmodel import CostOptions, calibration_from_dict, estimate
from megatron_autotuner.costmodel import defaults as d
from megatron_autotuner.costmodel.calibration import DenseHostFloor
from megatron_autotuner.costmodel.layer import LayerContext, captured_host_share, dense_host_s, layer_cost
from megatron_autotuner.errors import ConfigError
from megatron_autotuner.specs import ParallelConfig, Workload, load_model_spec
from megatron_autotuner.specs.hardware import ClusterSpec, get_gpu_spec

H100 = get_gpu_spec("H100-SXM")
SMALL, LARGE = load_model_spec("Qwen3-0.6B"), load_model_spec("Llama-3.1-8B")


def _ctx(**kw) -> LayerContext:
    return LayerContext(cluster=ClusterSpec(H100, 1), **({"tokens": 4096.0, "seq_length": 4096} | kw))


def test_small_layer_at_micro_batch_1_is_its_host_time():
    """Qwen3-0.6B's layer at 4k tokens is well under a millisecond of GPU work each way: the host's pace sets it."""
    eager, gpu_only = layer_cost(SMALL, 0, _ctx()), layer_cost(SMALL, 0, _ctx(host_floor=False))
    assert gpu_only.fwd.total < 0.5 * d.DENSE_HOST_FLOOR_FWD_S
    assert eager.fwd.total == pytest.approx(d.DENSE_HOST_FLOOR_FWD_S)
    assert eager.bwd.total == pytest.approx(d.DENSE_HOST_FLOOR_BWD_S)
    assert eager.fwd.parts["host"] == pytest.approx(d.DENSE_HOST_FLOOR_FWD_S - gpu_only.fwd.total)


def test_large_layer_is_gpu_bound():
    """Llama-3.1-8B at 8k tokens: many milliseconds of GEMMs, the host keeps ahead and adds nothing."""
    ctx = _ctx(tokens=8192.0, seq_length=8192)
    assert layer_cost(LARGE, 0, ctx) == layer_cost(LARGE, 0, dataclasses.replace(ctx, host_floor=False))


@settings(max_examples=25, deadline=None)
@given(
    tokens=st.sampled_from([512.0, 2048.0, 4096.0, 16384.0]),
    tp=st.sampled_from([1, 2, 4, 8]),
    training=st.booleans(),
)
def test_floor_only_ever_adds_and_is_the_max_of_host_and_gpu(tokens, tp, training):
    ctx = _ctx(tokens=tokens, tp=tp, sequence_parallel=tp > 1, training=training)
    eager = layer_cost(SMALL, 0, ctx)
    gpu = layer_cost(SMALL, 0, dataclasses.replace(ctx, host_floor=False))
    host_fwd, host_bwd = dense_host_s(ctx)
    assert eager.fwd.total == pytest.approx(max(gpu.fwd.total, host_fwd))
    if training:
        assert eager.bwd.total == pytest.approx(max(gpu.bwd.total, host_bwd))


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
    assert dense_host_s(whole) == (d.CUDA_GRAPH_REPLAY_HOST_S, d.CUDA_GRAPH_REPLAY_HOST_S)
    assert dense_host_s(eager)[0] > dense_host_s(attn)[0] > dense_host_s(whole)[0]
    # a whole graphed small layer is back to its GPU time
    assert layer_cost(SMALL, 0, whole) == layer_cost(SMALL, 0, _ctx(host_floor=False))


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
