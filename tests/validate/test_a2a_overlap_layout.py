"""`mat validate` runs Megatron's EP all-to-all overlap as planned: the layout carries it, the runner's config and DDP
turn it on, its forward step hands megatron-core's combined 1F1B step the model's schedule plan, and its processes get
the hardware queues the overlap needs."""

from __future__ import annotations

import os

import pytest

from megatron_autotuner.errors import ConfigError
from megatron_autotuner.export import launch_environment
from megatron_autotuner.specs import ParallelConfig
from megatron_autotuner.validate import runner, worker
from megatron_autotuner.validate.layout import Layout

BASE = dict(model="Mixtral-8x7B", num_layers=2, seq_length=4096, num_gpus=2, ep=2, global_batch_size=8)


def _overlap(**extra) -> Layout:
    return Layout(**{**BASE, "moe_a2a_overlap": True, "delay_wgrad_compute": True, **extra})


def test_the_layout_carries_the_overlap_into_its_parallel_config_and_id():
    plain, overlap = Layout(**BASE), _overlap()
    assert overlap.parallel().moe_a2a_overlap and overlap.parallel().delay_wgrad_compute
    assert plain.layout_id != overlap.layout_id != _overlap(delay_wgrad_compute=False).layout_id
    assert "a2a-overlap+delay-wgrad" in overlap.label
    overlap.check()  # megatron-core accepts it: ep 2, no pipeline, no full recompute


def test_the_runner_config_turns_it_on():
    out = runner.config_overrides(_overlap(), use_te=True, device="cpu")
    assert out["overlap_moe_expert_parallel_comm"] is True and out["delay_wgrad_compute"] is True
    plain = runner.config_overrides(Layout(**BASE), use_te=True, device="cpu")
    assert plain["overlap_moe_expert_parallel_comm"] is False and plain["delay_wgrad_compute"] is False


def test_what_megatron_core_refuses_is_refused():
    with pytest.raises(ConfigError, match="moe_a2a_overlap"):
        _overlap(recompute="full").check()
    with pytest.raises(ConfigError, match="moe_a2a_overlap"):
        Layout(**{**BASE, "ep": 1}, moe_a2a_overlap=True).check()
    with pytest.raises(ConfigError, match="delay_wgrad_compute"):
        Layout(**BASE, delay_wgrad_compute=True).check()


def test_the_forward_step_hands_over_the_schedule_plan():
    """megatron-core's combined step calls forward_step_func(data_iterator, model, return_schedule_plan=True) and
    expects the model's `build_schedule_plan` (combined_1f1b.py); otherwise the model's output."""

    class Model:
        def build_schedule_plan(self, **kwargs):
            return ("plan", sorted(kwargs))

        def __call__(self, **kwargs):
            return ("output", sorted(kwargs))

    batch = {"tokens": 1, "position_ids": 2, "labels": 3, "loss_mask": 4}
    plan, loss = runner._forward_step(iter([batch]), Model(), return_schedule_plan=True)
    assert plan == ("plan", ["attention_mask", "input_ids", "labels", "position_ids"])
    output, _ = runner._forward_step(iter([batch]), Model())
    assert output[0] == "output"
    assert callable(loss)


def test_the_processes_get_the_overlaps_hardware_queues(monkeypatch):
    overlap, plain = _overlap(), Layout(**BASE)
    assert overlap.process_max_connections == 8  # Megatron-Bridge's Hopper value for the alltoall dispatcher
    assert plain.process_max_connections is None
    env = launch_environment(overlap.parallel())
    assert env["CUDA_DEVICE_MAX_CONNECTIONS"][0] == "8"
    assert "CUDA_DEVICE_MAX_CONNECTIONS" not in launch_environment(plain.parallel())
    for dispatcher in ("deepep", "hybridep"):  # the flex dispatcher's backends: 32 (Megatron-Bridge)
        flex = ParallelConfig(num_gpus=2, ep=2, moe_a2a_overlap=True, moe_dispatcher=dispatcher)
        assert launch_environment(flex)["CUDA_DEVICE_MAX_CONNECTIONS"][0] == "32"
    assert launch_environment(Layout(**{**BASE, "tp": 2, "ep": 1}).parallel())["CUDA_DEVICE_MAX_CONNECTIONS"][0] == "1"
    monkeypatch.setenv("CUDA_DEVICE_MAX_CONNECTIONS", "1")
    worker.set_allocator_config([overlap])
    assert os.environ["CUDA_DEVICE_MAX_CONNECTIONS"] == "8"
    monkeypatch.setenv("CUDA_DEVICE_MAX_CONNECTIONS", "1")
    worker.set_allocator_config([plain])
    assert os.environ["CUDA_DEVICE_MAX_CONNECTIONS"] == "1"  # the environment's, as the plan assumed
    with pytest.raises(SystemExit):
        worker.set_allocator_config([overlap, plain])


def test_the_command_line_takes_megatron_lms_overlap_flags(capsys, tmp_path):
    """`--overlap-moe-expert-parallel-comm` / `--delay-wgrad-compute` on estimate and validate, as Megatron-LM spells
    them; beside --megatron-args the launch decides, in one line."""
    from megatron_autotuner.cli import main

    common = ["--model", "Mixtral-8x7B", "--num-gpus", "2", "--ep", "2", "--seq-len", "4096", "--global-batch-size",
              "8", "--gpu", "H200"]  # fmt: skip
    overlap = ["--overlap-moe-expert-parallel-comm", "--delay-wgrad-compute"]
    assert main(["estimate", *common, *overlap, "--json"]) == 0
    assert '"moe_a2a_overlap": true' in capsys.readouterr().out
    dry = ["--dry-run", "--json", "--output-dir", str(tmp_path / "v")]
    assert main(["validate", *common, "--num-layers", "2", *overlap, *dry]) == 0
    assert '"moe_a2a_overlap": true' in capsys.readouterr().out
    launch = "tests/fixtures/launches/deepseek_v3_h100_1024gpu.sh"
    assert main(["estimate", "--megatron-args", launch, "--gpu", "H100", "--delay-wgrad-compute"]) == 2
    assert capsys.readouterr().err.strip() == (
        "mat: error: delay_wgrad_compute: --delay-wgrad-compute goes in the Megatron-LM launch (--delay-wgrad-compute) "
        "when --megatron-args is given"
    )


def test_one_slurm_job_does_not_mix_the_overlap_with_other_layouts(capsys, tmp_path):
    """A Slurm script runs its layouts in one process, which sets CUDA_DEVICE_MAX_CONNECTIONS once: overlap layouts
    beside others are refused in one line, as the launcher would have split them into jobs."""
    import json

    from megatron_autotuner.cli import main

    layouts = tmp_path / "layouts.json"
    layouts.write_text(json.dumps({"gpu": "H200", "layouts": [_overlap().to_dict(), Layout(**BASE).to_dict()]}))
    argv = ["validate", "--layouts", str(layouts), "--emit-slurm", str(tmp_path / "job.sbatch"), "--nodes", "1",
            "--gpus-per-node", "2", "--output-dir", str(tmp_path / "out")]  # fmt: skip
    assert main(argv) == 2
    assert capsys.readouterr().err.strip() == (
        "mat: error: moe_a2a_overlap: one Slurm job runs one CUDA_DEVICE_MAX_CONNECTIONS: split the overlap layouts"
    )
