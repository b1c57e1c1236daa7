"""`mat plan --validate K`: what it hands the validation runs (the plan's calibration, a measured host floor)."""

import json
from pathlib import Path

from megatron_autotuner.cli import main
from megatron_autotuner.costmodel.calibration import MoeHostFloor

PLAN = ["plan", "--model", "Qwen3-30B-A3B", "--gpu", "H100-SXM", "--num-gpus", "8", "--seq-len", "4096"]
PLAN += ["--global-batch-size", "64", "--top", "2", "--no-chart", "--validate", "2"]


def _as_if_one_gpu(monkeypatch):
    """The launcher is stood in below, so no GPU is needed; nor does one measure anything: mat exits 1 for that."""
    monkeypatch.setattr("megatron_autotuner.launch.devices.require_cuda_gpus", lambda *args, **kwargs: 1)


def _calibration_file(tmp_path):
    path = tmp_path / "cal.json"
    doc = {"kind": "megatron-autotuner-calibration", "schema_version": 1, "gpu": "H100-SXM", "ops": []}
    doc["memory"] = {"non_torch_gib": 1.5, "fragmentation_fraction": 0.1}
    path.write_text(json.dumps(doc))
    return path


def test_plan_validate_predicts_with_the_plans_calibration_and_a_measured_floor(tmp_path, monkeypatch, capsys):
    seen = {}

    def predictions_only(layouts, gpu, out, calibration=None):
        # what validate_layouts predicts with; the runs themselves are stood in below (no GPU here)
        seen.update(layouts=layouts, out=out, gpu=gpu, calibration=calibration)
        return {lay.layout_id: {} for lay in layouts}

    measured = MoeHostFloor(5e-3, 4e-3, 1e-4)

    def fake_measure(layouts, gpu, out_dir, calibration=None, *rest, **kw):
        from dataclasses import replace

        seen["measured_in"] = out_dir
        return replace(calibration, moe_host_floors=(measured,))

    monkeypatch.setattr("megatron_autotuner.validate.batch.predictions_for", predictions_only)

    def make_output_folder(layouts, out, **_):  # the launcher's part that matters here
        Path(out).mkdir(parents=True, exist_ok=True)

    monkeypatch.setattr("megatron_autotuner.validate.launcher.run_layouts", make_output_folder)
    monkeypatch.setattr("megatron_autotuner.validate.host_floor.measure_host_floor", fake_measure)
    _as_if_one_gpu(monkeypatch)
    cal = _calibration_file(tmp_path)
    argv = [*PLAN, "--calibration", str(cal), "--output-dir", str(tmp_path / "p")]
    assert main([*argv, "--json"]) == 1  # nothing ran: "nothing measured"
    capsys.readouterr()
    assert len(seen["layouts"]) == 2 and seen["gpu"] == "H100-SXM"
    assert seen["calibration"].source == str(cal)  # the plan's calibration reaches the validation's predictions
    assert "measured_in" not in seen and seen["calibration"].moe_host_floors == ()
    seen.clear()
    assert main([*argv, "--measure-host-floor", "--json"]) == 1
    assert seen["measured_in"] == tmp_path / "p" / "validate" / "host_floor"
    assert seen["calibration"].moe_host_floors == (measured,) and seen["calibration"].memory


def test_plan_validate_stand_in_runs_each_stage_of_the_candidates_on_one_gpu(tmp_path, monkeypatch, capsys):
    """`mat plan --validate K --stand-in`: the top-K candidates go to the launcher as memory stand-ins (the first
    rank of each pipeline stage); without --validate the flag is a one-line error."""
    seen = {}

    def make_output_folder(layouts, out, **kw):
        seen.update(layouts=layouts, **kw)
        Path(out).mkdir(parents=True, exist_ok=True)

    monkeypatch.setattr("megatron_autotuner.validate.launcher.run_layouts", make_output_folder)
    _as_if_one_gpu(monkeypatch)
    dense = ["plan", "--model", "Qwen3-8B", "--gpu", "H100-SXM", "--num-gpus", "16", "--seq-len", "4096",
             "--global-batch-size", "64", "--top", "2", "--no-chart", "--output-dir", str(tmp_path / "p")]  # fmt: skip
    assert main([*dense, "--validate", "2", "--stand-in", "--json"]) == 1  # nothing ran: "nothing measured"
    capsys.readouterr()
    assert seen["stand_in"] == "stages" and len(seen["layouts"]) == 2
    assert main([*dense, "--stand-in"]) == 2
    err = capsys.readouterr().err
    assert "--stand-in goes with --validate K" in err and len(err.strip().splitlines()) == 1
