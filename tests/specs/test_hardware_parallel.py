import pytest

from megatron_autotuner.errors import ConfigError, SpecNotFoundError
from megatron_autotuner.specs import (
    ClusterSpec,
    ParallelConfig,
    RecomputeConfig,
    Workload,
    get_gpu_spec,
    load_gpu_specs_yaml,
    load_model_spec,
    validate_layout,
)


def test_gpu_presets():
    for name in ["A100-40GB", "A100-80GB", "H100-SXM", "H200", "B200", "GB200"]:
        gpu = get_gpu_spec(name)
        assert gpu.bf16_tflops > 0 and gpu.hbm_gib > 0
    assert get_gpu_spec("h100").name == "H100-SXM"
    assert get_gpu_spec("H100-SXM").peak_tflops("fp8") == 1979.0
    with pytest.raises(ConfigError, match="^precision: fp8 is not supported"):
        get_gpu_spec("A100-80GB").peak_tflops("fp8")
    with pytest.raises(SpecNotFoundError, match="unknown GPU"):
        get_gpu_spec("V100")


def test_gpu_yaml_override(tmp_path):
    f = tmp_path / "hw.yaml"
    f.write_text("H100-PCIe:\n  base: H100-SXM\n  bf16_tflops: 756\n  nvlink_gbps: 300\n")
    spec = get_gpu_spec("H100-PCIe", f)
    assert spec.bf16_tflops == 756 and spec.hbm_gbps == 3350.0 and spec.name == "H100-PCIe"
    f.write_text("X:\n  bf16_tflops: 1\n  speed: 3\n")
    with pytest.raises(ConfigError, match="speed"):
        load_gpu_specs_yaml(f)
    f.write_text("X: [1, 2\n")
    with pytest.raises(ConfigError, match="not valid yaml"):
        load_gpu_specs_yaml(f)


def test_cluster_links():
    cluster = ClusterSpec(get_gpu_spec("H100-SXM"), 64)
    assert cluster.num_nodes == 8
    assert cluster.link_gbps(8) == 450.0
    # 4 members per node -> 4 rings on 4 NICs; one member per node -> one NIC.
    assert cluster.link_gbps(8, stride=2) == 200.0
    assert cluster.link_gbps(8, stride=8) == 50.0
    assert cluster.link_gbps(64) == 400.0  # 8 NICs of a node (< NVLink 450)


def test_parallel_derived_sizes():
    p = ParallelConfig(num_gpus=64, tp=4, pp=4, cp=2, vpp=5, sequence_parallel=True)
    assert p.dp == 2 and p.etp == 4 and p.edp == 4
    assert ParallelConfig(num_gpus=8, tp=1, sequence_parallel=True).sequence_parallel is False


@pytest.mark.parametrize(
    "kwargs, field",
    [
        (dict(num_gpus=6, tp=4), "num_gpus"),
        (dict(num_gpus=8, pp=1, vpp=2), "vpp"),
        (dict(num_gpus=0), "num_gpus"),
        (dict(num_gpus=8, tp=0), "tp"),
        (dict(num_gpus=8, ep=3), "ep"),
        (dict(num_gpus=8, grad_reduce_in_fp32="no"), "grad_reduce_in_fp32"),
        (dict(num_gpus=8, use_distributed_optimizer=1), "use_distributed_optimizer"),
    ],
)
def test_parallel_config_errors(kwargs, field):
    with pytest.raises(ConfigError) as info:
        ParallelConfig(**kwargs)
    assert info.value.field == field


@pytest.mark.parametrize(
    "model, parallel, workload, field",
    [
        ("Qwen2.5-7B", dict(num_gpus=7, tp=7), {}, "tp"),  # 4 query groups: neither a multiple nor a divisor of 7
        ("Llama-3.1-8B", dict(num_gpus=8, pp=8, vpp=3), {}, "vpp"),
        ("Llama-3.1-8B", dict(num_gpus=8, pp=8, vpp=2), dict(global_batch_size=4), "global_batch_size"),
        ("Llama-3.1-8B", dict(num_gpus=8, cp=8), dict(seq_length=4104), "seq_length"),
        ("Llama-3.1-8B", dict(num_gpus=8, ep=2), {}, "ep"),
        ("Qwen3-30B-A3B", dict(num_gpus=8, tp=2, ep=4), {}, "sequence_parallel"),
        ("Qwen3-30B-A3B", dict(num_gpus=8, ep=8, tp=1, pp=1), dict(global_batch_size=3), "global_batch_size"),
        ("Mixtral-8x7B", dict(num_gpus=16, ep=16), {}, "ep"),
        (
            "Llama-3.1-8B",
            dict(num_gpus=8, pp=2),
            dict(recompute=RecomputeConfig("full", "uniform", 5)),
            "recompute_num_layers",
        ),
        (
            "Llama-3.1-8B",
            dict(num_gpus=8),
            dict(recompute=RecomputeConfig("selective", modules=("moe",))),
            "recompute_modules",
        ),
        ("Llama-3.1-8B", dict(num_gpus=8, tp=2, tp_comm_overlap=True), {}, "tp_comm_overlap"),
        ("Llama-3.1-8B", dict(num_gpus=8), dict(max_token_len=1024), "max_token_len"),
        (
            "Llama-3.1-8B",
            dict(num_gpus=8, use_distributed_optimizer=False),
            dict(precision="fp8", fp8_param=True),
            "fp8_param",
        ),
    ],
)
def test_layout_rules(model, parallel, workload, field):
    spec = load_model_spec(model)
    wl = dict(seq_length=4096, micro_batch_size=1, global_batch_size=64)
    wl.update(workload)
    with pytest.raises(ConfigError) as info:
        validate_layout(spec, ParallelConfig(**parallel), Workload(**wl))
    assert info.value.field == field


def test_valid_layouts_pass():
    spec = load_model_spec("Llama-3.1-70B")
    validate_layout(
        spec,
        ParallelConfig(num_gpus=64, tp=4, pp=4, cp=2, vpp=5, sequence_parallel=True),
        Workload(seq_length=8192, micro_batch_size=1, global_batch_size=128),
    )
    moe = load_model_spec("Qwen3-30B-A3B")
    validate_layout(moe, ParallelConfig(num_gpus=16, ep=16), Workload(seq_length=4096, global_batch_size=1024))


def test_workload_errors():
    with pytest.raises(ConfigError, match="^precision"):
        Workload(seq_length=10, precision="fp16")
    with pytest.raises(ConfigError, match="^mode"):
        Workload(seq_length=10, mode="infer")
    with pytest.raises(ConfigError, match="^recompute:"):
        Workload(seq_length=10, mode="forward", recompute=RecomputeConfig("full"))
    with pytest.raises(ConfigError, match="^recompute_modules"):
        RecomputeConfig("selective", modules=("attention",))


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (
            dict(precision="fp8", fp8_recipe="mxfp8"),
            "fp8_recipe: must be one of delayed, tensorwise, blockwise, got 'mxfp8'",
        ),
        (dict(fp8_recipe="tensorwise"), "fp8_recipe: 'tensorwise' needs precision fp8, got 'bf16'"),
        (dict(fp8_param=True), "fp8_param: needs precision fp8, got 'bf16'"),
        (dict(precision="fp8", fp8_param="yes"), "fp8_param: must be true or false, got 'yes'"),
    ],
)
def test_fp8_workload_errors(kwargs, message):
    with pytest.raises(ConfigError) as info:
        Workload(seq_length=4096, **kwargs)
    assert str(info.value).startswith(message)


def test_fp8_params_allowed_without_distributed_optimizer_in_forward_mode():
    """Megatron-LM refuses --fp8-param-gather without the distributed optimizer only when training."""
    spec = load_model_spec("Llama-3.1-8B")
    fwd = Workload(seq_length=4096, global_batch_size=8, precision="fp8", fp8_param=True, mode="forward")
    validate_layout(spec, ParallelConfig(num_gpus=8, use_distributed_optimizer=False), fwd)
    assert fwd.precision_label == "fp8 fp8-params"
    assert Workload(seq_length=8, precision="fp8", fp8_recipe="tensorwise").precision_label == "fp8-tensorwise"
    assert Workload(seq_length=8).precision_label == "bf16"
