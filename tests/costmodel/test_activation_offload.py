"""Activation offloading in the cost model: where the copies hide behind compute and where they cannot."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from megatron_autotuner.costmodel.activation_offload import (
    UNIT_ORDER,
    backward_windows_s,
    exposed_s,
    fine_grained_layer_time,
    layer_level_exposed_s,
    offload_copy_gbps,
)
from megatron_autotuner.costmodel.estimate import CostOptions, estimate
from megatron_autotuner.errors import ConfigError
from megatron_autotuner.specs import ParallelConfig, Workload, load_model_spec
from megatron_autotuner.specs.hardware import GPU_PRESETS, PCIE_GEN5_X16_GBPS
from megatron_autotuner.specs.parallel import ActivationOffloadConfig
from megatron_autotuner.theory.memory import OffloadGroup

H100 = GPU_PRESETS["H100-SXM"]


@given(copy=st.floats(0, 10), window=st.floats(0, 10))
def test_exposed_is_the_copy_the_window_does_not_cover(copy, window):
    assert exposed_s(copy, window) == max(0.0, copy - window)
    assert exposed_s(copy, window) <= copy


def test_layer_level_schedule_by_hand():
    """4 layers of 10 s forward and backward. N=3 leaves no window (TE warns): each copy waits in full, 3 each way.
    N=1: layer 0's copy starts with layer 1 and must end before layer 3 (20 s of forward); its reload starts with
    layer 2's backward and is needed at layer 0's (20 s): a 25 s copy exposes 5 s each way, a 20 s copy nothing."""
    ten = [10.0] * 4
    assert layer_level_exposed_s(ten, ten, [1.0] * 4, [1.0] * 4, 3, 0.0) == (3.0, 3.0)
    assert layer_level_exposed_s(ten, ten, [25.0] * 4, [25.0] * 4, 1, 0.0) == (5.0, 5.0)
    assert layer_level_exposed_s(ten, ten, [20.0] * 4, [20.0] * 4, 1, 0.0) == (0.0, 0.0)
    assert layer_level_exposed_s(ten, ten, [0.0] * 4, [0.0] * 4, 2, 0.0) == (0.0, 0.0)
    with pytest.raises(ConfigError):
        layer_level_exposed_s(ten, ten, [1.0] * 4, [1.0] * 4, 4, 0.0)


def test_backward_windows_follow_the_one_group_prefetch():
    """A reload is issued when the next offloaded group's backward ends and waited where its own begins: one module
    has the whole layer's backward but its own; adjacent modules (attn_proj right after core_attn) leave core_attn
    none."""
    units = dict.fromkeys(UNIT_ORDER, 1.0)
    units["core_attn"] = 5.0
    assert backward_windows_s(("core_attn",), units) == {"core_attn": sum(units.values()) - 5.0}
    windows = backward_windows_s(("core_attn", "attn_proj"), units)
    assert windows["core_attn"] == 0.0
    assert windows["attn_proj"] == sum(units.values()) - 5.0 - 1.0


def test_fine_grained_layer_time_hides_or_exposes_linearly():
    groups = (OffloadGroup("core_attn", 2e9, 1.5e9), OffloadGroup("attn_proj", 1e9, 1e9))
    units = dict.fromkeys(UNIT_ORDER, 0.0)
    units["other"] = 1.0  # attn_proj's window; core_attn has none
    hidden = fine_grained_layer_time(groups, 10.0, units, 100.0, 100.0)
    assert hidden.exposed_fwd_s == 0.0  # 30 ms of D2H under a 10 s forward
    assert hidden.exposed_bwd_s == pytest.approx(0.02)  # core_attn's reload (2 GB / 100 GB/s) waits in full
    slow = fine_grained_layer_time(groups, 0.0, dict.fromkeys(UNIT_ORDER, 0.0), 1.0, 1.0)
    slower = fine_grained_layer_time(groups, 0.0, dict.fromkeys(UNIT_ORDER, 0.0), 0.5, 0.5)
    assert (slow.exposed_fwd_s, slow.exposed_bwd_s) == pytest.approx((3.0, 3.0))
    assert (slower.exposed_fwd_s, slower.exposed_bwd_s) == pytest.approx((6.0, 6.0))


def test_copy_bandwidth_sources():
    spec = (PCIE_GEN5_X16_GBPS, "spec peak (H100-SXM host link, not measured)")
    assert offload_copy_gbps(H100, None, "d2h", 1e9) == spec
    assert offload_copy_gbps(H100, None, "h2d", 1e9, concurrent_copy_gbps=40.0)[0] == 40.0

    from megatron_autotuner.costmodel import calibration_from_dict

    def calibration(rows):
        doc = {"kind": "megatron-autotuner-calibration", "schema_version": 1, "gpu": "H100-SXM", "ops": []}
        return calibration_from_dict(doc | {"host_copy": rows}, source="cal.json")

    alone = {"direction": "d2h", "pinned": True, "nbytes": 2**30, "gbps": 50.0, "interference": "none"}
    beside = alone | {"gbps": 49.5, "interference": "gemm"}
    assert offload_copy_gbps(H100, calibration([alone]), "d2h", 1e9) == (50.0, "measured alone (cal.json)")
    assert offload_copy_gbps(H100, calibration([alone, beside]), "d2h", 1e9) == (
        49.5,
        "measured beside GEMMs (cal.json)",
    )
    assert offload_copy_gbps(H100, calibration([alone]), "h2d", 1e9)[0] == PCIE_GEN5_X16_GBPS
    with pytest.raises(ConfigError):
        offload_copy_gbps(H100, None, "both", 1e9)


def _estimate(offload, gbps=None, pp=1, layers_model="Llama-3.1-8B"):
    model = load_model_spec(layers_model)
    w = Workload(seq_length=4096, micro_batch_size=1, global_batch_size=8, activation_offload=offload)
    return estimate(model, ParallelConfig(num_gpus=pp, pp=pp), w, H100, CostOptions(concurrent_copy_gbps=gbps))


def test_estimate_reports_offload_separately_and_saves_memory():
    base = _estimate(ActivationOffloadConfig())
    off = _estimate(ActivationOffloadConfig(modules=("core_attn", "attn_proj")))
    assert "offload" not in base.time.breakdown and "offloaded_to_host" not in base.memory_breakdown_gib
    b = off.time.breakdown
    assert b["offload"] > 0  # core_attn's reload right after attn_proj's backward cannot hide
    # and the hooks' host time where the host shows (the launch-queue ramp of a host-bound forward)
    host_added = b["host_bound"] - base.time.breakdown["host_bound"]
    assert host_added >= 0.0
    assert b["total"] == pytest.approx(base.time.breakdown["total"] + b["offload"] + host_added)
    saved = base.memory_breakdown_gib["activations"] - off.memory_breakdown_gib["activations"]
    assert saved == pytest.approx(off.memory_breakdown_gib["offloaded_to_host"])
    assert off.to_dict()["inputs"]["workload"]["activation_offload"]["modules"] == ("core_attn", "attn_proj")


@pytest.mark.parametrize(
    "offload",
    [ActivationOffloadConfig(modules=("core_attn",)), ActivationOffloadConfig(num_layers=8)],
)
def test_offload_is_hidden_when_compute_dominates(offload):
    """A copy link far faster than the compute: nothing is exposed (core_attn alone: its reload has most of a layer's
    backward; 8 of 32 layers: 23 layers of window each way)."""
    assert _estimate(offload, gbps=1e6).time.breakdown["offload"] == 0.0
    assert _estimate(offload).time.breakdown["offload"] == 0.0  # and at the PCIe Gen5 spec peak too


@settings(max_examples=5, deadline=None)
@given(st.sampled_from([ActivationOffloadConfig(modules=("qkv_linear", "core_attn", "attn_proj")),
                        ActivationOffloadConfig(num_layers=31)]))  # fmt: skip
def test_offload_grows_linearly_with_bytes_when_copies_dominate(offload):
    """With a slow link every copy is exposed beyond its (fixed) window, so the exposed time grows linearly in
    bytes / bandwidth: halving the bandwidth twice adds twice as much the second time."""
    e = [_estimate(offload, gbps=g).time.breakdown["offload"] for g in (0.5, 0.25, 0.125)]
    assert e[0] > 0
    assert e[2] - e[1] == pytest.approx(2 * (e[1] - e[0]), rel=1e-6)


def test_layer_level_offload_with_pipeline_parallelism_is_refused():
    with pytest.raises(ConfigError, match="pipeline parallelism"):
        _estimate(ActivationOffloadConfig(num_layers=2), pp=2)
