"""Outputs are written whole or not at all: a full disk is one line, and the previous complete file stays."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import pytest

from megatron_autotuner.cli import main
from megatron_autotuner.errors import ConfigError
from megatron_autotuner.files import write_text_atomic

ROOT = Path(__file__).resolve().parents[2]
PLAN = ["plan", "--model", "Qwen3-0.6B", "--gpu", "H100-SXM", "--num-gpus", "1", "--seq-len", "1024",
        "--global-batch-size", "8", "--top", "2"]  # fmt: skip


def _disk_full(*_args, **_kwargs):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def test_a_write_that_fails_leaves_the_old_file_and_no_temporary(tmp_path, monkeypatch):
    path = tmp_path / "plan.json"
    write_text_atomic(path, '{"old": true}\n')
    monkeypatch.setattr(os, "fsync", _disk_full)
    with pytest.raises(ConfigError, match="cannot write .*plan.json: No space left on device"):
        write_text_atomic(path, '{"new": true, "partial": ')
    assert json.loads(path.read_text()) == {"old": True}
    assert [p.name for p in tmp_path.iterdir()] == ["plan.json"]


def test_a_written_file_gets_the_mode_a_plain_write_would(tmp_path):
    plain = tmp_path / "plain.json"
    plain.write_text("{}")
    atomic = write_text_atomic(tmp_path / "atomic.json", "{}")
    assert atomic.stat().st_mode == plain.stat().st_mode  # the umask's, not a temporary file's 0600


def test_mat_plan_on_a_full_disk_is_one_line_and_keeps_the_previous_plan(tmp_path, monkeypatch, capsys):
    out = tmp_path / "plan"
    assert main([*PLAN, "--output-dir", str(out), "--json"]) == 0
    before = (out / "plan.json").read_text()
    capsys.readouterr()
    monkeypatch.setattr(os, "fsync", _disk_full)
    assert main([*PLAN, "--output-dir", str(out), "--json"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.startswith("mat: error: output: cannot write ") and "No space left" in err
    assert (out / "plan.json").read_text() == before
    assert not [p for p in out.rglob("*.tmp")]


def test_an_os_error_elsewhere_is_one_line(monkeypatch, capsys, tmp_path):
    import megatron_autotuner.cli.plan_cmd as plan_cmd

    def broken(*_args, **_kwargs):
        raise OSError(errno.EIO, os.strerror(errno.EIO), str(tmp_path / "x"))

    monkeypatch.setattr(plan_cmd, "plan_with_graphs", broken)
    assert main(PLAN) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"mat: error: system: {os.strerror(errno.EIO)} ({tmp_path / 'x'})"


def test_a_second_plan_into_the_same_folder_leaves_none_of_the_first_ones_files(tmp_path, capsys):
    out = tmp_path / "plan"
    assert main([*PLAN[:-1], "5", "--output-dir", str(out), "--json"]) == 0
    assert {p.name for p in out.glob("rank_*")} == {f"rank_{k}" for k in range(1, 6)}
    (out / "notes.txt").write_text("mine")  # not the plan's: stays
    assert main([*PLAN, "--output-dir", str(out), "--json", "--no-chart"]) == 0
    assert {p.name for p in out.glob("rank_*")} == {"rank_1", "rank_2"}
    assert not (out / "plan.png").exists() and (out / "notes.txt").read_text() == "mine"
    capsys.readouterr()


def test_a_folder_another_live_plan_holds_is_refused(tmp_path, capsys):
    import subprocess
    import sys

    out = tmp_path / "plan"
    holder = (
        "import sys, time\n"
        "from megatron_autotuner.launch import OutputLock\n"
        "OutputLock(sys.argv[1], 'plan').acquire()\n"
        "print('held', flush=True)\n"
        "time.sleep(60)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", holder, str(out)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "held"
        assert main([*PLAN, "--output-dir", str(out)]) == 2
    finally:
        proc.kill()
        proc.wait()
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "is in use by a running mat plan" in err
    assert not (out / "plan.json").exists()


RLHF = ["rlhf", "--verl-args", str(ROOT / "examples/verl_grpo_qwen3_8b_h100_8gpu.sh"), "--gpu", "H100-SXM", "--json"]
VALIDATE = ["validate", "--model", "Qwen3-0.6B", "--num-gpus", "1", "--seq-len", "1024", "--global-batch-size", "8",
            "--gpu", "H100-SXM", "--dry-run", "--json"]  # fmt: skip


def _full_disk_is_one_line(argv, out, written, monkeypatch, capsys) -> None:
    """`argv` into `out` once, then again on a full disk: one line, exit 2, the first run's `written` files as they
    were and no temporary file."""
    assert main([*argv, "--output-dir", str(out)]) == 0
    before = {name: (out / name).read_text() for name in written}
    capsys.readouterr()
    monkeypatch.setattr(os, "fsync", _disk_full)
    assert main([*argv, "--output-dir", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.startswith("mat: error: output: cannot write ") and "No space left" in err
    assert {name: (out / name).read_text() for name in written} == before
    assert not [p for p in out.rglob("*.tmp")]


def test_mat_rlhf_on_a_full_disk_is_one_line_and_keeps_the_previous_files(tmp_path, monkeypatch, capsys):
    _full_disk_is_one_line(RLHF, tmp_path / "rlhf", ["rlhf.json", "verl_overrides.txt"], monkeypatch, capsys)


def test_mat_validate_dry_run_on_a_full_disk_is_one_line_and_keeps_the_previous_files(tmp_path, monkeypatch, capsys):
    _full_disk_is_one_line(VALIDATE, tmp_path / "validate", ["layouts.json"], monkeypatch, capsys)


def test_mat_profile_on_a_full_disk_is_one_line(tmp_path, monkeypatch, capsys):
    """The testbench's summary, written after the cases ran (here: a GPU host whose cases left no record)."""
    import megatron_autotuner.launch.devices as devices
    import megatron_autotuner.testbench.launcher as launcher
    import megatron_autotuner.testbench.results as results

    monkeypatch.setattr(devices, "require_cuda_gpus", lambda *_a: 1)
    monkeypatch.setattr(launcher, "run_cases", lambda *_a, **_k: None)
    monkeypatch.setattr(results, "all_records", lambda *_a: [])
    monkeypatch.setattr(os, "fsync", _disk_full)
    out = tmp_path / "profile"
    assert main(["profile", "--model", "Qwen3-0.6B", "--ops", "decoder", "--output-dir", str(out), "--json"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.startswith("mat: error: output: cannot write ") and "summary.json" in err
    assert not (out / "summary.json").exists() and not [p for p in out.rglob("*.tmp")]
