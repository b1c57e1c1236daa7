"""The MoE block's permute path and the loss kernel as run settings: read from a launch, written back, priced, and
refused in one line when they are not what Megatron-LM accepts."""

from __future__ import annotations

import pytest

from megatron_autotuner.costmodel import CostOptions, calibration_from_dict, estimate
from megatron_autotuner.costmodel import defaults as d
from megatron_autotuner.errors import ConfigError
from megatron_autotuner.export import megatron_lm_args
from megatron_autotuner.specs import ParallelConfig, Workload, get_gpu_spec, load_model_spec
from megatron_autotuner.specs.megatron_args import launch_to_specs, read_launch
from megatron_autotuner.testbench.cases import Case
from megatron_autotuner.testbench.operators import time_host_steps
from megatron_autotuner.validate.layout import Layout

H200 = get_gpu_spec("H200")
MOE = load_model_spec("Qwen3-30B-A3B")
DENSE = load_model_spec("Qwen3-8B")


def _calibration(floors: list[dict]):
    doc = {"kind": "megatron-autotuner-calibration", "schema_version": 1, "gpu": "H200", "ops": []}
    return calibration_from_dict(doc | {"moe_host_floor": floors})


def test_each_permute_path_has_its_own_floor():
    unfused = {"precision": "bf16", "fwd_s": 9e-3, "bwd_s": 9e-3, "bwd_per_local_expert_s": 0.0}
    fused = unfused | {"permute_fusion": True, "fwd_s": 1e-3, "router_share": 0.2, "preprocess_share": 0.1}
    cal = _calibration([unfused, fused])
    assert cal.moe_host_floor("bf16", permute_fusion=True).fwd_s == 1e-3
    assert cal.moe_host_floor("bf16").fwd_s == 9e-3
    # one path's measurement says nothing of the other's
    assert _calibration([unfused]).moe_host_floor("bf16", permute_fusion=True) is None


@pytest.mark.parametrize(
    ("row", "field"),
    [
        ({"router_share": 1.5}, "router_share"),
        ({"preprocess_share": -0.1}, "preprocess_share"),
        ({"permute_fusion": "yes"}, "permute_fusion"),
    ],
)
def test_bad_floor_fields_are_refused_in_one_line(row, field):
    base = {"precision": "bf16", "fwd_s": 1e-3, "bwd_s": 1e-3, "bwd_per_local_expert_s": 0.0}
    with pytest.raises(ConfigError, match=field):
        _calibration([base | row])


def test_the_fused_block_is_held_to_its_floor_where_its_gpu_work_is_short():
    """Qwen3-30B-A3B at EP 8 (16 local experts), 1024 tokens per micro-batch: the eager fused block's GPU work is far
    under its host floor, so the step is host-paced; a graph over the whole block takes the floor away."""
    parallel = ParallelConfig(8, ep=8)
    workload = Workload(1024, 1, 64)
    fused = estimate(MOE, parallel, workload, H200, CostOptions(moe_permute_fusion=True))
    gpu_only = estimate(MOE, parallel, workload, H200, CostOptions(moe_permute_fusion=True, moe_host_bound=False))
    floor = d.FUSED_MOE_HOST_FLOOR_FWD_S + d.FUSED_MOE_HOST_FLOOR_BWD_S
    floor += 16 * (d.FUSED_MOE_HOST_FLOOR_FWD_PER_LOCAL_EXPERT_S + d.FUSED_MOE_HOST_FLOOR_BWD_PER_LOCAL_EXPERT_S)
    microbatches = fused.time.num_microbatches
    assert fused.step_time_s >= microbatches * MOE.num_layers * floor
    assert gpu_only.step_time_s < 0.5 * fused.step_time_s


def test_launch_flags_round_trip():
    flags = (
        "--num-layers 48 --hidden-size 2048 --num-attention-heads 32 --seq-length 4096 --micro-batch-size 1 "
        "--global-batch-size 64 --moe-permute-fusion --cross-entropy-loss-fusion --cross-entropy-fusion-impl te"
    )
    imported = launch_to_specs(read_launch(flags), MOE, num_gpus=8)
    assert imported.options["moe_permute_fusion"] and imported.options["cross_entropy_fusion_impl"] == "te"
    options = CostOptions(**imported.options)
    assert options.loss_kernel == "te"
    args = megatron_lm_args(MOE, ParallelConfig(8, ep=8), Workload(4096, 1, 64), options)
    assert "--moe-permute-fusion" in args and "--cross-entropy-fusion-impl te" in args
    # Megatron-LM's default impl is native
    plain = launch_to_specs(read_launch(flags.replace(" --cross-entropy-fusion-impl te", "")), MOE, num_gpus=8)
    assert CostOptions(**plain.options).loss_kernel == "native"


def test_native_loss_costs_more_time_and_memory_than_te():
    parallel, workload = ParallelConfig(8), Workload(4096, 1, 64)
    te = estimate(
        DENSE, parallel, workload, H200, CostOptions(fused_cross_entropy=True, cross_entropy_fusion_impl="te")
    )
    native = estimate(DENSE, parallel, workload, H200, CostOptions(fused_cross_entropy=True))
    assert native.step_time_s > te.step_time_s
    # one more fp32 tokens x vocab buffer at the loss's peak
    extra_gib = 4 * 4096 * DENSE.vocab_size / 2**30
    assert native.peak_memory_gib - te.peak_memory_gib == pytest.approx(extra_gib, rel=0.05)


def test_unknown_loss_kernel_is_refused_in_one_line():
    with pytest.raises(ConfigError, match="cross_entropy_fusion_impl"):
        CostOptions(fused_cross_entropy=True, cross_entropy_fusion_impl="liger")
    with pytest.raises(ConfigError, match="cross_entropy_fusion_impl"):
        Layout(model="Qwen3-0.6B", seq_length=1024, cross_entropy_fusion=True, cross_entropy_fusion_impl="x").check()


def test_the_runner_layout_keeps_its_id_unless_it_sets_the_new_fields():
    base = Layout(model="Qwen3-30B-A3B", seq_length=4096, num_layers=2)
    assert Layout.from_dict(base.to_dict()).layout_id == base.layout_id
    assert base.replace(moe_permute_fusion=True).layout_id != base.layout_id
    assert "fused-permute" in base.replace(moe_permute_fusion=True, name="").label


def test_testbench_cases_for_the_fused_path():
    plain = Case(model="Qwen3-30B-A3B", op="moe", seq_length=4096)
    fused = Case(model="Qwen3-30B-A3B", op="moe", seq_length=4096, moe_permute_fusion=True)
    assert plain.case_id != fused.case_id
    # cases recorded before the field existed keep their ids
    assert "moe_permute_fusion" not in plain.case_id
    with pytest.raises(ConfigError, match="moe_permute_fusion"):
        Case(model="Qwen3-8B", op="decoder", seq_length=4096, moe_permute_fusion=True)


def test_host_step_timers_add_up_each_call():
    class Block:
        def route(self, x):
            return x + 1

        def preprocess(self, x):
            return x * 2

    block = Block()
    spent = time_host_steps(block, ("route", "preprocess", "dispatch"))
    assert set(spent) == {"route", "preprocess"}  # a step the module lacks is not timed
    assert block.preprocess(block.route(1)) == 4
    assert spent["route"] > 0 and spent["preprocess"] > 0


def test_the_run_settings_line_says_the_permute_path_and_the_loss_kernel():
    from megatron_autotuner.cli.estimate_cmd import run_settings_line
    from megatron_autotuner.costmodel.estimate import run_settings

    options = CostOptions(moe_permute_fusion=True, fused_cross_entropy=True, cross_entropy_fusion_impl="te")
    line = run_settings_line(run_settings(MOE, options, False))
    assert "MoE permute fusion on" in line and "cross-entropy fusion on (te)" in line
    dense = run_settings_line(run_settings(DENSE, CostOptions(), False))
    assert "MoE permute" not in dense and "cross-entropy fusion off," in dense


@pytest.mark.parametrize("command", ["estimate", "validate"])
def test_a_bad_loss_kernel_on_the_command_line_is_one_line(command, capsys, tmp_path):
    from megatron_autotuner.cli import main

    argv = [command, "--model", "Qwen3-30B-A3B", "--gpu", "H100-SXM", "--num-gpus", "8", "--seq-len", "4096"]
    if command == "validate":
        argv += ["--dry-run", "--output-dir", str(tmp_path / "out")]
    with pytest.raises(SystemExit) as exit_:
        main([*argv, "--cross-entropy-fusion-impl", "liger"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "cross-entropy-fusion-impl" in err[0] and "Traceback" not in err[0]
