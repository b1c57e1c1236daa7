"""Shared fixtures of the validate tests."""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

import pytest


@pytest.fixture
def fake_gpu_env(tmp_path: Path) -> dict[str, str]:
    """The environment a GPU evidence script (benchmarks/validation/*.sh) runs in on CPU: a stand-in nvidia-smi on
    PATH, a GPU_ENV file in place of ../shared/gpu's env.sh (it exports MAT_TEST_ENV_SOURCED=1), this Python, no
    CUDA device."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake_smi = bin_dir / "nvidia-smi"
    fake_smi.write_text("#!/bin/sh\necho 'Fake GPU, 1 MiB'\n")
    fake_smi.chmod(fake_smi.stat().st_mode | stat.S_IEXEC)
    (tmp_path / "env.sh").write_text("export MAT_TEST_ENV_SOURCED=1\n")
    return {
        **os.environ,
        "GPU_ENV": str(tmp_path / "env.sh"),
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        "PY": sys.executable,
        "CUDA_VISIBLE_DEVICES": "",
    }


@pytest.fixture
def tiny(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A tiny model's JSON path, with the environment a CPU validate job needs (gloo, no CUDA)."""
    from tests.proc_helpers import cpu_job_env, write_tiny_model

    for name, value in cpu_job_env({}).items():
        monkeypatch.setenv(name, value)
    return write_tiny_model(tmp_path / "tiny.json")
