import json
import re
import subprocess
import sys

import pytest

from megatron_autotuner.cli import main


def run_json(capsys, argv):
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out)


def test_models_and_hardware_json(capsys):
    models = run_json(capsys, ["models", "--json"])
    names = {m["name"] for m in models["models"]}
    assert {"Llama-3.1-8B", "DeepSeek-V3", "Qwen3-30B-A3B"} <= names
    hw = run_json(capsys, ["hardware", "--json"])
    assert {g["name"] for g in hw["gpus"]} >= {"A100-40GB", "A100-80GB", "H100-SXM", "H200", "B200", "GB200"}


def test_theory_json(capsys):
    report = run_json(
        capsys,
        [
            "theory",
            "--model",
            "Llama-3.1-8B",
            "--num-gpus",
            "8",
            "--tp",
            "2",
            "--pp",
            "2",
            "--seq-len",
            "8192",
            "--global-batch-size",
            "64",
            "--gpu",
            "H100-SXM",
            "--flops-convention",
            "full",
            "--json",
        ],
    )
    assert report["schema_version"] == 1
    assert len(report["memory_per_stage"]) == 2
    assert report["parallel"]["dp"] == 2 and report["parallel"]["sequence_parallel"] is True
    assert report["flops"]["model_flops_per_token"] == pytest.approx(5.79e10, rel=0.01)
    assert report["fits"] is True
    assert report["padded_vocab_size"] == 128256


def test_theory_table_output(capsys):
    assert (
        main(
            [
                "theory",
                "--model",
                "Qwen3-30B-A3B",
                "--num-gpus",
                "16",
                "--ep",
                "8",
                "--tp",
                "2",
                "--seq-len",
                "4096",
                "--recompute",
                "selective",
                "--recompute-modules",
                "core_attn",
                "moe_act",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "Memory per rank" in out and "experts_fc1" in out and " bf16 mode=train" in " ".join(out.split())
    fp8 = ["theory", "--model", "Llama-3.1-8B", "--num-gpus", "8", "--seq-len", "4096", "--precision", "fp8"]
    assert main(fp8 + ["--fp8-recipe", "tensorwise", "--fp8-param-gather"]) == 0
    assert "fp8-tensorwise fp8-params mode=train" in " ".join(capsys.readouterr().out.split())


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["theory", "--model", "Llama-9", "--num-gpus", "8", "--seq-len", "10"], "unknown model"),
        (["theory", "--model", "Llama-3.1-8B", "--num-gpus", "8", "--tp", "3", "--seq-len", "8"], "num_gpus"),
        (["theory", "--model", "Llama-3.1-8B", "--num-gpus", "64", "--tp", "64", "--seq-len", "64"], "tp:"),
        (["theory", "--model", "Llama-3.1-8B", "--num-gpus", "8", "--seq-len", "64", "--gpu", "V100"], "unknown GPU"),
        (
            ["theory", "--model", "Llama-3.1-8B", "--num-gpus", "8", "--seq-len", "64", "--fp8-recipe", "tensorwise"],
            "fp8_recipe:",
        ),
        # argparse's own errors: one line too, no usage block
        (["estimate", "--model", "Qwen3-8B", "--tp", "abc"], "argument --tp: must be a positive integer, got 'abc'"),
        (["estimat"], "invalid choice: 'estimat'"),
        (
            ["estimate", "--model", "Qwen3-8B", "--precision", "fp8", "--fp8-recipe", "mxfp8"],
            "argument --fp8-recipe: invalid choice: 'mxfp8' (choose from 'delayed', 'tensorwise', 'blockwise')",
        ),
        (["trace", "summary"], "the following arguments are required"),
    ],
)
def test_bad_input_is_one_line_exit_2(argv, expected):
    proc = subprocess.run([sys.executable, "-m", "megatron_autotuner.cli", *argv], capture_output=True, text=True)
    assert proc.returncode == 2
    assert proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and re.match(r"mat( [a-z]+)*: error: ", lines[0]) and expected in lines[0]
    assert "Traceback" not in proc.stderr


def test_malformed_config_json(tmp_path):
    bad = tmp_path / "config.json"
    bad.write_text('{"model_type": "llama", "hidden_size": 64')
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "megatron_autotuner.cli",
            "theory",
            "--model",
            str(bad),
            "--num-gpus",
            "1",
            "--seq-len",
            "8",
        ],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2 and "not valid JSON" in proc.stderr and "Traceback" not in proc.stderr


def test_an_fp8_plan_reports_mfu_against_the_fp8_peak(capsys, tmp_path):
    """The MFU column of an fp8 plan is against the dense fp8 peak (H100: 1979 TFLOP/s), and says so; `mat estimate`
    shows both peaks (NVIDIA's tables quote fp8 runs against the bf16 peak)."""
    from megatron_autotuner.search import plan
    from megatron_autotuner.specs import get_gpu_spec, load_model_spec

    argv = ["--model", "Llama-3.1-8B", "--gpu", "H100-SXM", "--num-gpus", "8", "--seq-len", "8192",
            "--global-batch-size", "64", "--precision", "fp8"]  # fmt: skip
    assert main(["plan", *argv, "--top", "1", "--output-dir", str(tmp_path / "plan")]) == 0
    out = " ".join(capsys.readouterr().out.split())
    best = plan(load_model_spec("Llama-3.1-8B"), get_gpu_spec("H100-SXM"), 8, 8192, 64, precision="fp8").best
    assert "MFU against the fp8 peak" in out and f"{best.estimate.mfu_fp8:.3f}" in out
    assert best.estimate.mfu_fp8 == pytest.approx(best.estimate.mfu / 2, rel=0.01)  # the fp8 peak is twice bf16's
    assert main(["estimate", *argv, "--pp", "2", "--cp", "2"]) == 0
    out = capsys.readouterr().out
    assert "MFU (bf16 peak)" in out and "MFU (fp8 peak)" in out
    # the plan's JSON names both, with the peak each divides by
    (first,) = run_json(
        capsys, ["plan", *argv, "--top", "1", "--no-chart", "--json", "--output-dir", str(tmp_path / "json")]
    )["candidates"][:1]
    assert first["mfu_fp8"] == pytest.approx(best.estimate.mfu_fp8) and first["mfu_fp8_peak_tflops"] == 1979.0
    assert first["mfu"] == pytest.approx(best.estimate.mfu) and first["mfu_peak_tflops"] == 989.0


def test_estimate_names_the_run_settings_its_number_assumes(capsys):
    """The allocator, Megatron-LM's overlap / fusion flags and TP-communication overlap change the step; `mat
    estimate` says which it priced, as `mat plan` does (and its --json holds them under inputs)."""
    argv = ["estimate", "--model", "Qwen3-8B", "--gpu", "H100-SXM", "--num-gpus", "8", "--seq-len", "4096",
            "--global-batch-size", "64"]  # fmt: skip
    assert main([*argv, "--no-expandable-segments"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "run settings assumed: allocator PyTorch default" in out
    assert "grad-reduce overlap on" in out and "TP-communication overlap off" in out
    doc = run_json(capsys, [*argv, "--json"])
    assert doc["inputs"]["expandable_segments"] is True and doc["inputs"]["parallel"]["tp_comm_overlap"] is False


def test_plan_names_tp_communication_overlap_among_its_run_settings(capsys, tmp_path):
    argv = ["plan", "--model", "Qwen3-8B", "--gpu", "H100-SXM", "--num-gpus", "8", "--seq-len", "4096",
            "--global-batch-size", "64", "--top", "1", "--no-chart"]  # fmt: skip
    assert main([*argv, "--output-dir", str(tmp_path / "off")]) == 0
    assert "TP-communication overlap off" in " ".join(capsys.readouterr().out.split())
    assert main([*argv, "--tp-comm-overlap", "--output-dir", str(tmp_path / "on")]) == 0
    assert "TP-communication overlap on with sequence parallelism" in " ".join(capsys.readouterr().out.split())


def test_recompute_modules_without_selective_recompute_is_refused(capsys):
    """Megatron-LM reads --recompute-modules only with selective recompute; the CLI had dropped them silently (a CLI
    audit). One line, exit 2."""
    args = ["estimate", "--model", "Qwen3-30B-A3B", "--gpu", "H100-SXM", "--num-gpus", "8", "--ep", "8"]
    assert main(args + ["--seq-len", "4096", "--recompute-modules", "moe"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["mat: error: recompute_modules: apply only with --recompute selective"]
