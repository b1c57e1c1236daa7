"""Export -> `--megatron-args` import gives back the same model, layout, workload and cost options, hence the same
prediction: the Megatron-LM flag table is the one source for both directions."""

from __future__ import annotations

import dataclasses
import shlex
import shutil
import subprocess

import pytest

from megatron_autotuner.costmodel.estimate import CostOptions, estimate
from megatron_autotuner.export import export_all, megatron_lm_args
from megatron_autotuner.specs import ParallelConfig, RecomputeConfig, Workload, get_gpu_spec, load_model_spec
from megatron_autotuner.specs.megatron_args import _parser as megatron_parser
from megatron_autotuner.specs.megatron_args import launch_to_specs, read_launch
from megatron_autotuner.specs.pipeline import PipelineLayout

H100 = get_gpu_spec("H100-SXM")
OPTION_FIELDS = (
    "overlap_grad_reduce",
    "overlap_param_gather",
    "overlap_p2p_comm",
    "fused_cross_entropy",
    "gradient_accumulation_fusion",
    "fused_bias_activation",
    "moe_host_bound",
)


_IDS: list[int] = []


def case(model: str, parallel: ParallelConfig, workload: Workload, **options):
    _IDS.append(1)
    return pytest.param(
        model, parallel, workload, options, id=f"{model}-{len(_IDS)}-tp{parallel.tp}pp{parallel.pp}v{parallel.vpp}"
    )


W = Workload(4096, 1, 64)
CASES = [
    case("Llama-3.1-8B", ParallelConfig(8), W),
    case("Llama-3.1-8B", ParallelConfig(8, tp=2, sequence_parallel=True, tp_comm_overlap=True), W),
    case("Llama-3.1-8B", ParallelConfig(8, tp=2, sequence_parallel=False, use_distributed_optimizer=False), W),
    case("Llama-3.1-8B", ParallelConfig(8, pp=2, vpp=4), Workload(8192, 1, 64, RecomputeConfig("full", "uniform", 2))),
    case("Llama-3.1-8B", ParallelConfig(8, cp=2, cp_comm_type="a2a"), Workload(8192, 2, 64, precision="fp8")),
    case("Llama-3.1-8B", ParallelConfig(8, pp=4), W, overlap_grad_reduce=False, overlap_param_gather=False),
    case(
        "Llama-3.1-8B",
        ParallelConfig(8, pp=2, pipeline_layout=PipelineLayout.first_last(32, 2, None, 15, 17)),
        W.replace(recompute=RecomputeConfig("selective", modules=("core_attn", "mlp"))),
    ),
    case("Llama-3.1-8B", ParallelConfig(8, pp=4, vpp=2), W, overlap_p2p_comm=False, fused_cross_entropy=False),
    case("Llama-3.1-70B", ParallelConfig(64, tp=4, pp=4, cp=2, vpp=5, sequence_parallel=True), Workload(8192, 1, 128)),
    case(
        "Llama-3.1-405B",
        ParallelConfig(
            1024,
            tp=8,
            pp=8,
            cp=2,
            sequence_parallel=True,
            tp_comm_overlap=True,
            pipeline_layout=PipelineLayout.accounting(126, 8, 8),
            grad_reduce_in_fp32=False,
        ),
        Workload(8192, 1, 512, precision="fp8", fp8_recipe="tensorwise", fp8_param=True),
    ),  # fmt: skip
    case("Llama-3.1-8B", ParallelConfig(6, pp=3, pipeline_layout=PipelineLayout.accounting(32, 3, None, False)), W),
    case(
        "Llama-3.1-405B",
        ParallelConfig(
            512, tp=8, pp=8, sequence_parallel=True, pipeline_layout=PipelineLayout.first_last(126, 8, 2, 14, 16)
        ),
        Workload(8192, 1, 512, RecomputeConfig("full", "block", 2)),
    ),  # fmt: skip
    case(
        "Qwen3-8B", ParallelConfig(8, tp=4, sequence_parallel=True), W.replace(precision="fp8", fp8_recipe="blockwise")
    ),
    case("Qwen3-0.6B", ParallelConfig(4), Workload(4096, 4, 64), fused_bias_activation=False),
    case("Qwen3-30B-A3B", ParallelConfig(16, ep=8), W),
    case("Qwen3-30B-A3B", ParallelConfig(16, ep=4, tp=2, etp=1, sequence_parallel=True), W, moe_host_bound=True),
    case(
        "Qwen3-235B-A22B",
        ParallelConfig(
            256, tp=2, pp=8, ep=32, etp=1, sequence_parallel=True, pipeline_layout=PipelineLayout.accounting(94, 8, 4)
        ),
        Workload(4096, 1, 2048, precision="fp8", fp8_recipe="tensorwise"),
    ),  # fmt: skip
    case(
        "DeepSeek-V3",
        ParallelConfig(
            1024,
            tp=2,
            pp=8,
            ep=64,
            etp=1,
            sequence_parallel=True,
            pipeline_layout=PipelineLayout.from_string("Et|(tt|)*30mL", 8),
        ),
        Workload(4096, 1, 8192, RecomputeConfig("selective", modules=("mla_up_proj", "mlp"))),
    ),  # fmt: skip
    case(
        "DeepSeek-V3",
        ParallelConfig(512, pp=16, ep=32, pipeline_layout=PipelineLayout.from_string("Et*4|(t*4|)*14tmL", 16)),
        Workload(4096, 1, 4096),
    ),
    case("Mixtral-8x7B", ParallelConfig(16, tp=2, ep=8, pp=1, sequence_parallel=True), W),
    case("Llama-2-7b", ParallelConfig(8, pp=2), Workload(4096, 1, 32, mode="forward")),
    case("Qwen2.5-7B", ParallelConfig(8, tp=2, sequence_parallel=True), W),
    # sliding windows on every other layer, attention sinks, a clamped GLU with biases everywhere
    case("gpt-oss-20b", ParallelConfig(16, tp=2, ep=8, etp=1, sequence_parallel=True), Workload(8192, 1, 64)),
]


@pytest.mark.parametrize(("name", "parallel", "workload", "options"), CASES)
def test_export_then_import_gives_the_same_layout_and_prediction(name, parallel, workload, options):
    model = load_model_spec(name)
    opts = CostOptions(**options)
    flags = export_all(model, parallel, workload, options=opts)["megatron_lm_args.txt"]
    assert "\n" not in flags.strip()  # one line, usable as eval "... $(cat megatron_lm_args.txt)"
    imported = launch_to_specs(
        read_launch(flags), num_gpus=parallel.num_gpus, mode=workload.mode, max_token_len=workload.max_token_len
    )
    assert imported.model.replace(name=model.name) == model
    assert imported.parallel == parallel
    assert imported.workload == workload
    expected = {k: getattr(opts, k) for k in OPTION_FIELDS if k in imported.options}
    # Megatron-LM gathers parameters only with the distributed optimizer: without it the flag is not written
    expected["overlap_param_gather"] = opts.overlap_param_gather and parallel.use_distributed_optimizer
    assert {k: imported.options[k] for k in expected} == expected
    assert imported.not_modelled == ()
    before = estimate(model, parallel, workload, H100, opts)
    after = estimate(imported.model, imported.parallel, imported.workload, H100, dataclasses.replace(
        opts, **{k: v for k, v in imported.options.items() if k != "expandable_segments"}
    ))  # fmt: skip
    assert after.step_time_s == pytest.approx(before.step_time_s, rel=1e-12)
    assert after.peak_memory_gib == pytest.approx(before.peak_memory_gib, rel=1e-12)


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_the_args_file_through_bash_is_the_argv_the_export_means(tmp_path):
    """A DeepSeek-V3 plan's file holds a layout string and a --moe-layer-freq list (| ( * [ ]): run as its comment
    says, `eval "... $(cat megatron_lm_args.txt)"`, bash hands Megatron-LM's argparse each flag and value unquoted,
    and they parse to the plan's values; a bare $(cat ...) would pass the quotes along (why the file says eval)."""
    model = load_model_spec("DeepSeek-V3")
    parallel = ParallelConfig(512, pp=16, ep=32, pipeline_layout=PipelineLayout.from_string("Et*4|(t*4|)*14tmL", 16))
    text = export_all(model, parallel, Workload(4096, 1, 4096))["megatron_lm_args.txt"]
    path = tmp_path / "megatron_lm_args.txt"
    path.write_text(text)
    script = 'eval "set -- $(cat "$1")"; printf "%s\\0" "$@"'
    out = subprocess.run(["bash", "-c", script, "_", str(path)], capture_output=True, text=True, check=True).stdout
    argv = out.split("\0")[:-1]
    assert argv == shlex.split(text)
    namespace, extra = megatron_parser().parse_known_args(argv)
    assert extra == []
    assert namespace.pipeline_model_parallel_layout == "Et*4|(t*4|)*14tmL"
    assert namespace.moe_layer_freq == "[0]*3+[1]*58"
    bare = subprocess.run(["bash", "-c", 'printf "%s\\0" $(cat "$1")', "_", str(path)], capture_output=True, text=True)
    assert "'Et*4|(t*4|)*14tmL'" in bare.stdout.split("\0")


def test_exported_flags_are_all_real_megatron_lm_flags():
    model = load_model_spec("DeepSeek-V3")
    parallel = ParallelConfig(1024, tp=2, pp=8, ep=64, etp=1, sequence_parallel=True,
                              pipeline_layout=PipelineLayout.from_string("Et|(tt|)*30mL", 8))  # fmt: skip
    # planned as a tuned recipe runs MoE (fused permute)
    flags = megatron_lm_args(model, parallel, Workload(4096, 1, 8192), CostOptions(moe_permute_fusion=True))
    assert "--pipeline-model-parallel-layout 'Et|(tt|)*30mL'" in flags
    assert "--moe-token-dispatcher-type alltoall" in flags and "--moe-grouped-gemm" in flags
    assert "--moe-permute-fusion" in flags and "--moe-layer-freq '[0]*3+[1]*58'" in flags
    # planned with the defaults (eager MoE, as Megatron-LM and mat validate run it): the export says the same
    assert "--moe-permute-fusion" not in megatron_lm_args(model, parallel, Workload(4096, 1, 8192))
    read_launch(" ".join(flags))  # raises for any flag Megatron-LM does not have
