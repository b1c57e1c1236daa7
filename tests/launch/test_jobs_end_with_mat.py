"""A sweep's ranks end when `mat` ends, however it ends, and a second sweep cannot write into a folder a live
one owns. Real `mat validate --device cpu` jobs (torchrun, 2 gloo ranks, megatron-core local spec)."""

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.proc_helpers import cpu_job_env, processes_mentioning, write_tiny_model

pytest.importorskip("torch")
pytest.importorskip("megatron.core")
pytestmark = pytest.mark.mcore


@pytest.fixture()
def hanging_sweep(tmp_path, monkeypatch):
    """A `mat validate` command (and its environment) whose one layout hangs on both ranks until killed."""
    env = {**cpu_job_env(), "MAT_VALIDATE_FAULT": "hang:hang"}  # validate.runner's fault injection: sleeps 1 h
    model = write_tiny_model(tmp_path / "tiny.json")
    layouts = tmp_path / "layouts.json"
    layout = {"model": model, "seq_length": 32, "num_gpus": 2, "global_batch_size": 2, "warmup_steps": 1,
              "steps": 1, "use_te": False, "name": "hang"}  # fmt: skip
    layouts.write_text(json.dumps([layout]))
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "megatron_autotuner.cli", "validate", "--layouts", str(layouts), "--gpu", "H200",
           "--device", "cpu", "--timeout-s", "600", "--output-dir", str(out)]  # fmt: skip
    return cmd, env, out


def _ranks(out: Path) -> list[str]:
    return [p for p in processes_mentioning(str(out)) if "validate.worker" in p and "torch.distributed.run" not in p]


def _start_hung(cmd: list[str], env: dict[str, str], out: Path) -> subprocess.Popen:
    """Start the sweep and return once both ranks are inside the hanging layout."""
    mat = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    started = _wait(lambda: len(_ranks(out)) == 2 and (out / "runs" / "current_layout.txt").exists(), 240)
    if not started:
        mat.kill()
        mat.wait()
        pytest.fail("the job never started: " + repr(processes_mentioning(str(out))))
    return mat


def _wait(condition, timeout_s: float, poll_s: float = 0.5) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(poll_s)
    return condition()


@contextlib.contextmanager
def _hung_sweep(cmd: list[str], env: dict[str, str], out: Path):
    """The running sweep (both ranks hung in the layout); killed at the end whatever the test did."""
    mat = _start_hung(cmd, env, out)
    try:
        yield mat
    finally:
        if mat.poll() is None:
            mat.kill()
            mat.wait()


def _kill_9_leaves_no_rank(mat: subprocess.Popen, out: Path) -> None:
    """SIGKILL mat: torchrun (SIGTERM from prctl) and its ranks (owner watchdog) end within seconds."""
    mat.send_signal(signal.SIGKILL)
    mat.wait()
    assert _wait(lambda: processes_mentioning(str(out)) == [], 30), processes_mentioning(str(out))


def test_kill_9_of_mat_leaves_no_rank_alive_and_a_live_sweep_keeps_its_folder(hanging_sweep):
    cmd, env, out = hanging_sweep
    with _hung_sweep(cmd, env, out) as mat:
        # a second sweep into the same folder is refused while the first is alive
        second = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
        assert second.returncode == 2
        lines = second.stderr.strip().splitlines()
        assert len(lines) == 1 and "in use by a running mat validate" in lines[0], second.stderr
        _kill_9_leaves_no_rank(mat, out)
    # the lock still names the dead mat; the next sweep takes it over (tests/launch/test_lock.py)
    lock = json.loads((out / ".mat.lock").read_text())
    assert lock["owner"].split(":")[0] == str(mat.pid)


def test_kill_9_of_torchrun_alone_still_ends_the_ranks_with_mat(hanging_sweep):
    """SIGKILL reaches torchrun before it can stop its workers; each rank then sees its owner (mat) still
    alive and keeps going, until mat ends too: then the watchdog ends it."""
    cmd, env, out = hanging_sweep
    with _hung_sweep(cmd, env, out) as mat:
        agents = [p for p in processes_mentioning(str(out)) if "torch.distributed.run" in p]
        assert agents
        torchrun = next(int(d.name) for d in Path("/proc").iterdir() if d.name.isdigit() and _cmdline(d) == agents[0])
        os.kill(torchrun, signal.SIGKILL)
        time.sleep(2)
        _kill_9_leaves_no_rank(mat, out)


def _cmdline(proc_dir: Path) -> str:
    try:
        return " ".join(a.decode(errors="replace") for a in (proc_dir / "cmdline").read_bytes().split(b"\0") if a)
    except OSError:
        return ""
