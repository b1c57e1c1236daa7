"""Layouts with activation offloading: the JSON field (the Workload's `ActivationOffloadConfig`), its load-time rules,
the TransformerConfig settings the runner derives from the flag table, the environment rule (NVTE_CPU_OFFLOAD_V1),
the prediction it carries, the refusal on CPU and the GPU check's layouts and script (dry run)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from megatron_autotuner.errors import ConfigError
from megatron_autotuner.specs import ParallelConfig, Workload
from megatron_autotuner.specs.megatron_args import FLAG_TABLE, activation_offload_args, specs_to_megatron_args
from megatron_autotuner.specs.parallel import ActivationOffloadConfig
from megatron_autotuner.validate.layout import Layout, load_layouts_file

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "benchmarks" / "validation"
FINE = {"modules": ["core_attn", "attn_proj"]}
LLAMA_L4 = dict(model="Llama-3.1-8B", num_layers=4, seq_length=4096, global_batch_size=4)


def test_round_trip_and_old_ids():
    plain = Layout(**LLAMA_L4)
    fine = plain.replace(activation_offload=FINE)
    layer = plain.replace(activation_offload={"num_layers": 2})
    assert fine.activation_offload == ActivationOffloadConfig(modules=("core_attn", "attn_proj"))
    assert fine.workload().activation_offload == fine.activation_offload
    assert layer.workload().activation_offload == ActivationOffloadConfig(num_layers=2)
    for lay in (plain, fine, layer):
        again = Layout.from_dict(json.loads(json.dumps(lay.to_dict())))
        assert again == lay and again.layout_id == lay.layout_id
    assert len({plain.layout_id, fine.layout_id, layer.layout_id}) == 3
    assert "offload[modules=core_attn,attn_proj]" in fine.label and "offload[layers=2]" in layer.label
    # off is None (as the ids of layouts that could not set it), however it is spelled
    assert "activation_offload" in Layout.ID_FIELDS_ONLY_WHEN_SET
    assert plain.to_dict()["activation_offload"] is None
    assert plain.replace(activation_offload={"num_layers": 0}).layout_id == plain.layout_id
    assert plain.replace(activation_offload=ActivationOffloadConfig()).activation_offload is None
    assert plain.workload().activation_offload == ActivationOffloadConfig()


def test_from_configs_carries_the_offload():
    w = Workload(4096, activation_offload=ActivationOffloadConfig(modules=("core_attn",), fraction=0.5))
    lay = Layout.from_configs("Qwen3-0.6B", ParallelConfig(1), w)
    assert lay.activation_offload == w.activation_offload and lay.workload() == w


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"activation_offload": {"layers": 2}}, "layers"),  # not a field of ActivationOffloadConfig
        ({"activation_offload": {"modules": ["mlp"]}}, "offload_modules"),
        ({"activation_offload": {"modules": ["attn_proj"]}}, "offload_modules"),  # needs core_attn (megatron-core)
        ({"activation_offload": {"num_layers": 1, "modules": ["core_attn"]}}, "offload_modules"),
        ({"activation_offload": {"num_layers": 2}, "recompute": "selective"}, "cpu_offloading_num_layers"),
        ({"activation_offload": FINE, "mode": "forward"}, "activation_offload"),
        ({"activation_offload": "core_attn"}, "activation_offload"),
        ({"activation_offload": {"num_layers": 2}, "cuda_graph_impl": "transformer_engine"}, "cuda_graph_impl"),
        ({"activation_offload": FINE, "cuda_graph_impl": "transformer_engine"}, "activation_offload"),
    ],
)
def test_impossible_combinations_fail_at_load(changes, field):
    with pytest.raises(ConfigError) as err:
        Layout.from_dict({**LLAMA_L4, **changes})
    assert err.value.field == field


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"activation_offload": {"num_layers": 4}}, "cpu_offloading_num_layers"),  # must be below num_layers
        ({"activation_offload": {"num_layers": 1}, "num_gpus": 2, "pp": 2}, "cpu_offloading_num_layers"),
    ],
)
def test_megatron_core_rules_at_check(changes, field):
    """What `mat validate` checks for every layout it loads (`Layout.check`, megatron-core's TransformerConfig)."""
    with pytest.raises(ConfigError) as err:
        Layout(**{**LLAMA_L4, **changes}).check()
    assert err.value.field == field


def test_runner_fields_come_from_the_flag_table():
    """One spelling: the Megatron-LM export and the runner's TransformerConfig fields are the same dict."""
    offload = ActivationOffloadConfig(modules=("core_attn", "attn_proj"))
    args = activation_offload_args(offload)
    assert set(args) <= set(FLAG_TABLE)
    lay = Layout(**LLAMA_L4, activation_offload=FINE)
    exported = specs_to_megatron_args(lay.model_spec(), lay.parallel(), lay.workload())
    assert {k: exported[k] for k in args} == args
    assert activation_offload_args(ActivationOffloadConfig()) == {}


def test_config_overrides():
    pytest.importorskip("torch")
    pytest.importorskip("megatron.core")
    from megatron.core.transformer.transformer_config import TransformerConfig

    from megatron_autotuner.validate.runner import config_overrides

    fields = TransformerConfig.__dataclass_fields__
    plain = config_overrides(Layout(**LLAMA_L4), True, "cuda")
    assert not any("offload" in k for k in plain)
    layer = config_overrides(Layout(**LLAMA_L4, activation_offload={"num_layers": 2}), True, "cuda")
    # Megatron-LM validate_args: --cpu-offloading-num-layers > 0 turns cpu_offloading on
    assert (layer["cpu_offloading"], layer["cpu_offloading_num_layers"]) == (True, 2)
    assert "fine_grained_activation_offloading" not in layer
    fine = config_overrides(Layout(**LLAMA_L4, activation_offload=FINE), True, "cuda")
    assert fine["fine_grained_activation_offloading"] is True
    assert fine["offload_modules"] == ["core_attn", "attn_proj"]
    assert fine["min_offloaded_tensor_size"] == 1024 * 1024  # megatron-core's default
    assert "cpu_offloading" not in fine
    assert set(fine) <= set(fields) and set(layer) <= set(fields)
    # activation_offload_fraction is a TransformerConfig field from megatron-core 0.19 on (0.16.1 lacks it)
    half = Layout(**LLAMA_L4, activation_offload={**FINE, "fraction": 0.5})
    if "activation_offload_fraction" in fields:
        assert config_overrides(half, True, "cuda")["activation_offload_fraction"] == 0.5
    else:
        with pytest.raises(ConfigError) as err:
            config_overrides(half, True, "cuda")
        assert err.value.field == "activation_offload_fraction"
        assert "activation_offload_fraction" not in fine


def test_environment_rule():
    from megatron_autotuner.validate.command import require_offload_environment
    from megatron_autotuner.validate.runner import offload_env_problem

    fine = Layout(**LLAMA_L4, activation_offload=FINE)
    layer = Layout(**LLAMA_L4, activation_offload={"num_layers": 2})
    plain = Layout(**LLAMA_L4)
    v1 = {"NVTE_CPU_OFFLOAD_V1": "1"}
    # Megatron-LM validate_args: fine-grained with TE >= 2.10 asks for NVTE_CPU_OFFLOAD_V1=1
    assert "NVTE_CPU_OFFLOAD_V1=1" in offload_env_problem(fine, "2.20.2", {})
    assert "NVTE_CPU_OFFLOAD_V1=1" in offload_env_problem(fine, "2.10.0.dev0+abc", {"NVTE_CPU_OFFLOAD_V1": "0"})
    assert offload_env_problem(fine, "2.20.2", v1) is None
    assert offload_env_problem(fine, "2.9.1", {}) is None
    # the layer-level prediction is TE's default path, which NVTE_CPU_OFFLOAD_V1=1 replaces
    assert "unset it" in offload_env_problem(layer, "2.20.2", v1)
    assert offload_env_problem(layer, "2.20.2", {}) is None
    assert offload_env_problem(plain, "2.20.2", v1) is None and offload_env_problem(fine, None, {}) is None
    with pytest.raises(ConfigError) as err:
        require_offload_environment([plain, fine], environ={}, te_version="2.20.2")
    assert err.value.field == "NVTE_CPU_OFFLOAD_V1" and fine.label in err.value.rule
    require_offload_environment([plain, fine], environ=v1, te_version="2.20.2")


def test_prediction_carries_the_offload():
    """Llama-3.1-8B, 4 layers, seq 4096, micro-batch 1, fine-grained core_attn + attn_proj: per layer core_attn saves
    q (4096 x 4096 bf16 = 32 MiB), k and v (4096 x 1024 = 8 MiB each), attn_proj its input (32 MiB), each >= 1Mi
    elements; megatron-core keeps the last group of each module on the GPU (the offload margin,
    fine_grained_activation_offload.py `post_warmup_callback`): 3 of 4 layers x 80 MiB = 240 MiB in host memory."""
    from megatron_autotuner.validate.predict import predict

    base = predict(Layout(**LLAMA_L4), "H100-SXM")
    fine = predict(Layout(**LLAMA_L4, activation_offload=FINE), "H100-SXM")
    layer = predict(Layout(**LLAMA_L4, activation_offload={"num_layers": 2}), "H100-SXM")
    assert "offload_s" not in base and "offloaded_gib" not in base
    assert fine["offloaded_gib"] == pytest.approx(240 / 1024)
    # megatron-core's counter: core_attn's output is attn_proj's input, copied by both (3 x 112 MiB)
    assert fine["offload_copied_gib"] == pytest.approx(336 / 1024) and layer["offload_copied_gib"] is None
    assert fine["assumed"]["activation_offload"]["modules"] == ["core_attn", "attn_proj"]
    for pred in (fine, layer):
        assert pred["offload_s"] > 0 and pred["offloaded_gib"] > 0
        assert pred["peak_memory_gib"] < base["peak_memory_gib"]
    # the exposed copies lengthen the step by their time; the fine-grained hooks' host time only shows through the
    # launch-queue ramp of this GPU-bound layout (under 1% of the step); layer-level offloading has no host term
    assert layer["step_time_s"] == pytest.approx(base["step_time_s"] + layer["offload_s"])
    assert 0 <= fine["step_time_s"] - (base["step_time_s"] + fine["offload_s"]) < 0.01 * base["step_time_s"]


def test_comparison_row_compares_offloaded_memory():
    from megatron_autotuner.validate.predict import compare

    lay = Layout(**LLAMA_L4, activation_offload=FINE)
    # megatron-core's counter (copied bytes) against the predicted copied bytes, not the bytes freed on the GPU
    row = compare(lay, {"status": "ok", "measured": {"step_time_s": 1.0, "offloaded_gib": 0.25}},
                  {"step_time_s": 1.1, "offloaded_gib": 0.1, "offload_copied_gib": 0.2}, None)  # fmt: skip
    assert row["error_rel"]["offloaded_memory"] == pytest.approx(-0.2)
    assert "offloaded_memory" not in compare(Layout(**LLAMA_L4), None, {}, None)["error_rel"]


@pytest.mark.parametrize("offload", [FINE, {"num_layers": 1}])
def test_offloading_is_refused_on_cpu_in_one_line(tmp_path, offload):
    pytest.importorskip("torch")
    pytest.importorskip("megatron.core")
    from megatron_autotuner.validate.runner import run_layout

    lay = Layout(model="Qwen3-0.6B", num_layers=2, seq_length=32, activation_offload=offload)
    record = run_layout(lay, "cpu", tmp_path, rank=0)
    assert record["status"] == "failed" and record["failure_kind"] == "error"
    assert record["error"] == (
        f"activation offloading ({lay.activation_offload.label}) needs CUDA and Transformer Engine (no CUDA device): "
        "the copies run on CUDA streams into pinned host memory, through Transformer Engine's cpu_offload"
    )


def test_benchmark_layouts_are_valid_and_fit_the_gpu():
    from megatron_autotuner.validate.predict import predict

    layouts, extra = load_layouts_file(BENCH / "h100_x1_activation_offload_layouts.json")
    assert extra["gpu"] == "H100-SXM" and len(layouts) == 5
    for lay in layouts:
        lay.check()
        pred = predict(lay, extra["gpu"])
        assert pred["fits"], lay.label
        assert lay.num_microbatches == 4 and lay.mode == "train" and lay.precision == "bf16"
    kinds = [None if lay.activation_offload is None else lay.activation_offload.label for lay in layouts]
    assert kinds.count(None) == 2 and kinds.count("layers=2") == 1 and kinds.count("modules=core_attn,attn_proj") == 2


@pytest.mark.mcore
def test_benchmark_script_dry_run(tmp_path, fake_gpu_env):
    """The GPU script on CPU with --dry-run: it splits the layouts by the NVTE_CPU_OFFLOAD_V1 they need, and
    `mat validate` predicts every layout (nothing runs)."""
    pytest.importorskip("megatron.core")
    env = fake_gpu_env | {"OUT": str(tmp_path / "result"), "RUN_DIR": str(tmp_path / "run")}
    script = BENCH / "h100_x1_activation_offload.sh"
    done = subprocess.run(["bash", str(script), "--dry-run"], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "fine_grained: 4 layout(s)" in done.stdout and "layer_level: 1 layout(s)" in done.stdout
    predicted = [line for line in done.stdout.splitlines() if ": predicted {" in line]
    assert len(predicted) == 5 and sum('"offload_s"' in line for line in predicted) == 3
    assert (tmp_path / "result" / "activation_offload.tgz").exists()
