"""Exit codes: 0 only when the command did what was asked; 1 when a measuring command measured nothing (no GPU,
no torch, every layout failed), with one line saying why; 2 for bad input. Fake overlap results are labelled
synthetic in every file they write."""

import json
import sys

import pytest

from megatron_autotuner.cli import main
from tests.proc_helpers import cpu_job_env, write_tiny_model

torch = pytest.importorskip("torch")
needs_no_gpu = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU behaviour")


def _run(argv, capsys):
    code = main(argv)
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    return code, err


@needs_no_gpu
@pytest.mark.parametrize(
    "argv, what",
    [
        (["validate", "--model", "Llama-3.1-8B", "--seq-len", "1024", "--num-layers", "2", "--gpu", "H100"], "layouts"),
        (["profile", "--model", "Llama-3.1-8B", "--ops", "mlp", "--seq-len", "1024"], "cases"),
        (["profile", "--model", "Llama-3.1-8B", "--ops", "mlp", "--num-gpus", "1"], "cases"),
        (["overlap", "tune", "--model", "Qwen3-8B", "--tp-sizes", "2"], "tuning jobs"),
        (
            [
                "plan",
                "--model",
                "Qwen3-8B",
                "--gpu",
                "H200",
                "--num-gpus",
                "4",
                "--seq-len",
                "4096",
                "--global-batch-size",
                "32",
                "--validate",
                "2",
            ],
            "layouts to validate",
        ),  # fmt: skip
    ],
)
def test_measuring_commands_without_a_gpu_exit_1_with_one_line(argv, what, tmp_path, capsys):
    code, err = _run([*argv, "--output-dir", str(tmp_path / "out")], capsys)
    assert code == 1
    assert len(err) == 1 and err[0].startswith("mat: nothing measured: no CUDA GPU visible")
    assert f" {what} ran" in err[0]
    assert not (tmp_path / "out" / "jobs").exists()  # nothing was launched


def test_without_torch_the_measuring_commands_say_so(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch raises ImportError
    code, err = _run(["validate", "--model", "Llama-3.1-8B", "--seq-len", "1024", "--gpu", "H100",
                      "--output-dir", str(tmp_path / "v")], capsys)  # fmt: skip
    assert code == 1 and len(err) == 1 and "torch is not installed here: 0 of 1 layouts ran" in err[0]
    code, err = _run(["overlap", "tune", "--model", "Qwen3-8B", "--tp-sizes", "2", "--fake",
                      "--output-dir", str(tmp_path / "o")], capsys)  # fmt: skip
    assert code == 2 and err == [
        "mat: error: fake: the synthetic backend runs torch.distributed (gloo) ranks on CPU and needs torch installed"
    ]


def test_an_unknown_gpu_is_bad_input_even_in_a_dry_run(tmp_path, capsys):
    code, err = _run(["validate", "--model", "Llama-3.1-8B", "--seq-len", "1024", "--gpu", "NOPE", "--dry-run",
                      "--output-dir", str(tmp_path)], capsys)  # fmt: skip
    assert code == 2 and len(err) == 1 and "unknown GPU 'NOPE'" in err[0]


@pytest.mark.mcore
def test_validate_exits_1_when_every_layout_failed(tmp_path, capsys, monkeypatch):
    pytest.importorskip("megatron.core")
    for name, value in cpu_job_env({}).items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("MAT_VALIDATE_FAULT", "broken:error")  # validate.runner's fault injection
    model = write_tiny_model(tmp_path / "tiny.json")
    layouts = tmp_path / "layouts.json"
    layouts.write_text(json.dumps([{"model": model, "seq_length": 32, "global_batch_size": 1, "warmup_steps": 1,
                                    "steps": 1, "use_te": False, "name": "broken"}]))  # fmt: skip
    argv = ["validate", "--layouts", str(layouts), "--gpu", "H200", "--device", "cpu",
            "--output-dir", str(tmp_path / "o")]  # fmt: skip
    code, err = _run(argv, capsys)
    assert code == 1 and len(err) == 1
    assert err[0].startswith("mat: nothing measured: 0 of 1 layouts ran: 1 failed"), err
    code, err = _run([*argv, "--report-only"], capsys)  # the report of that folder measured nothing either
    assert code == 1 and "0 of 1 layouts reported" in err[0]


def test_fake_overlap_results_are_labelled_synthetic_in_every_file(tmp_path, capsys):
    out = tmp_path / "ov"
    code = main(["overlap", "tune", "--model", "Qwen3-8B", "--tp-sizes", "2", "--fake", "--output-dir", str(out)])
    assert code == 0
    assert capsys.readouterr().out.startswith("SYNTHETIC: ")
    written = [p for p in out.rglob("*") if p.is_file() and p.suffix in {".yaml", ".txt", ".json", ".jsonl", ".gz",
                                                                          ".png"}]  # fmt: skip
    assert {p.suffix for p in written} >= {".yaml", ".txt", ".json", ".jsonl", ".gz", ".png"}
    for path in written:
        if path.parent.name == "jobs" or path.name == "current_case.txt":
            continue  # the launcher's own job files and logs
        data = path.read_bytes()
        if path.suffix == ".gz":
            import gzip

            data = gzip.decompress(data)
        assert b"synthetic" in data.lower() or b'"fake": true' in data, path
    report = json.loads((out / "tuning_report.json").read_text())
    assert report["synthetic"].startswith("SYNTHETIC")
    for line in (out / "collect" / "rank_0.jsonl").read_text().splitlines():
        assert json.loads(line)["synthetic"] is True


@pytest.mark.parametrize("command", ["plan", "estimate"])
def test_max_token_len_below_seq_len_is_named_as_the_cause(command, tmp_path, capsys):
    """It used to surface as "nearest GPU counts that work: 7 or 9", which no GPU count fixes."""
    argv = [command, "--model", "Llama-3.1-8B", "--gpu", "H100-SXM", "--num-gpus", "8", "--seq-len", "4096",
            "--global-batch-size", "64", "--max-token-len", "100"]  # fmt: skip
    if command == "plan":
        argv += ["--output-dir", str(tmp_path)]
    code, err = _run(argv, capsys)
    assert code == 2 and len(err) == 1
    assert err[0].startswith("mat: error: max_token_len: 100 is below seq_length=4096"), err
