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
    """Under CUDA graphs or the all-to-all overlap no layer forward runs to be timed: the record's note says so."""
    from megatron_autotuner.validate.runner import host_timing_missing

    base = Layout(model="Mixtral-8x7B", num_layers=2, num_gpus=2, ep=2, seq_length=4096, host_timing=True)
    graphed = base.replace(cuda_graph_impl="transformer_engine", cuda_graph_scope=("attn",), warmup_steps=3)
    assert "under CUDA graphs" in host_timing_missing(graphed, None)
    assert "all-to-all overlap" in host_timing_missing(base.replace(moe_a2a_overlap=True), None)
    assert host_timing_missing(base, {"fwd_ms": 1.0}) is None
    assert host_timing_missing(base.replace(host_timing=False), None) is None
