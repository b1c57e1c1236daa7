"""Per-layer host timing inside a real megatron-core step (`Layout.host_timing`, `validate.host_timing`): on CPU
with megatron-core 0.16's local layers, through the real forward-backward schedule."""

import pytest

from megatron_autotuner.validate.layout import Layout

pytest.importorskip("torch")
pytest.importorskip("megatron.core")
pytestmark = pytest.mark.mcore


@pytest.fixture(scope="module")
def timed(tmp_path_factory) -> dict[str, tuple[Layout, dict]]:
    """A training and a forward-only layout of the tiny model, run one after the other in one CPU job (one start-up
    of torch and megatron-core): {mode: (layout, measured host timing)}."""
    from megatron_autotuner.validate import validate_layouts
    from tests.proc_helpers import cpu_job_env, write_tiny_model

    out = tmp_path_factory.mktemp("host_timing")
    with pytest.MonkeyPatch.context() as env:
        for name, value in cpu_job_env({}).items():
            env.setenv(name, value)
        tiny = write_tiny_model(out / "tiny.json")
        lays = [Layout(model=tiny, seq_length=32, warmup_steps=1, steps=3, use_te=False, host_timing=True, mode=mode)
                for mode in ("train", "forward")]  # fmt: skip
        rep = validate_layouts(lays, out / "run", "H200", device="cpu", layout_timeout_s=120, log=lambda *a: 0,
                               layouts_per_job=None)  # fmt: skip
    rows = {row["layout_id"]: row for row in rep.rows}
    for row in rows.values():
        assert row["status"] == "ok", row.get("error")
    return {lay.mode: (lay, rows[lay.layout_id]["measured"]["host_timing"]) for lay in lays}


def test_training_times_every_layer_forward_and_backward(timed):
    lay, timing = timed["train"]
    layers = lay.model_spec().num_layers
    assert timing["layers"] == layers
    # one forward and one backward per layer per timed step (the warm-up step is not recorded)
    assert timing["samples"] == layers * 3
    assert len(timing["fwd_ms_by_layer"]) == len(timing["bwd_ms_by_layer"]) == layers
    assert all(v is not None and v > 0 for v in timing["fwd_ms_by_layer"] + timing["bwd_ms_by_layer"])
    assert timing["fwd_ms"] > 0 and timing["bwd_ms"] > 0


def test_forward_only_has_no_backward(timed):
    lay, timing = timed["forward"]
    assert timing["bwd_ms"] is None and timing["fwd_ms"] > 0
    assert timing["samples"] == lay.model_spec().num_layers * 3


def test_off_by_default_and_out_of_the_id(tiny):
    plain = Layout(model=tiny, seq_length=32, use_te=False)
    assert plain.host_timing is False
    assert Layout(model=tiny, seq_length=32, use_te=False, host_timing=True).layout_id != plain.layout_id


def test_cli_flag_sets_it_on_every_layout(tmp_path, capsys):
    import json

    from megatron_autotuner.cli import main

    argv = ["validate", "--model", "Qwen3-0.6B", "--seq-len", "512", "--gpu", "H100-SXM", "--host-timing"]
    assert main([*argv, "--dry-run", "--output-dir", str(tmp_path)]) == 0
    (entry,) = json.loads((tmp_path / "layouts.json").read_text())["layouts"]
    assert entry["layout"]["host_timing"] is True


def test_a_layout_that_timed_nothing_says_why():
    """Under CUDA graphs no layer forward runs to be timed, nor under the all-to-all overlap if no combined layer
    step ran: the record's note says so."""
    from megatron_autotuner.validate.runner import host_timing_missing

    base = Layout(model="Mixtral-8x7B", num_layers=2, num_gpus=2, ep=2, seq_length=4096, host_timing=True)
    graphed = base.replace(cuda_graph_impl="transformer_engine", cuda_graph_scope=("attn",), warmup_steps=3)
    assert "under CUDA graphs" in host_timing_missing(graphed, None)
    assert "all-to-all overlap" in host_timing_missing(base.replace(moe_a2a_overlap=True), None)
    assert host_timing_missing(base, {"fwd_ms": 1.0}) is None
    assert host_timing_missing(base.replace(host_timing=False), None) is None


class _FakePlan:
    """Stands in for megatron-core's TransformerLayerSchedulePlan: `run` blocks `sync_ms` in a synchronize."""

    clock = None

    @staticmethod
    def run(f_layer, b_layer, f_input=None, b_grad=None, is_last_layer_in_bwd=False):
        import time

        _FakePlan.clock.blocked_s += f_layer or 0.0  # the stand-in's "blocked" seconds
        time.sleep(0.001)
        return f_input, b_grad


def test_combined_timer_times_each_kind_and_restores_the_class():
    """The all-to-all overlap's combined layer step is timed per kind (both passes, forward or backward alone),
    with the seconds blocked in syncs within each call; nothing before `start()`; the class is restored."""
    from megatron_autotuner.validate.host_timing import CombinedLayerHostTimer, SyncClock

    original = _FakePlan.__dict__["run"]
    clock = SyncClock()
    _FakePlan.clock = clock
    timer = CombinedLayerHostTimer(_FakePlan, clock)
    assert timer.summary() is None
    _FakePlan.run(0.5, "b")  # before start: not recorded
    timer.start()
    for _ in range(3):
        _FakePlan.run(0.002, "b", f_input=1)
    _FakePlan.run(0.004, None)
    _FakePlan.run(None, "b", b_grad=2)
    out = timer.summary()
    timer.remove()
    assert _FakePlan.__dict__["run"] is original
    assert (out["pair_calls"], out["fwd_calls"], out["bwd_calls"]) == (3, 1, 1)
    assert out["pair_blocked_ms"] == pytest.approx(2.0) and out["fwd_blocked_ms"] == pytest.approx(4.0)
    assert out["bwd_blocked_ms"] == 0.0
    assert out["pair_ms"] >= 1.0 and out["bwd_ms"] >= 1.0
    assert _FakePlan.run(None, "b", b_grad=3) == (None, 3)
