"""The output-folder lock: one live owner, stale locks taken over, released on exit."""

import json
import os
import subprocess
import sys

import pytest

from megatron_autotuner.errors import AutotunerError
from megatron_autotuner.launch import OutputLock
from megatron_autotuner.launch.lock import LOCK_FILE
from megatron_autotuner.launch.process import is_alive, process_identity


def test_a_live_owner_keeps_the_folder_and_release_frees_it(tmp_path):
    with OutputLock(tmp_path, "validate"):
        # another process (a real, live one) holding the lock is refused with one line naming it
        other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        try:
            owner = json.loads((tmp_path / LOCK_FILE).read_text())
            owner["owner"] = process_identity(other.pid)
            (tmp_path / LOCK_FILE).write_text(json.dumps(owner))
            with pytest.raises(AutotunerError, match=f"in use by a running mat validate \\(pid {other.pid} "):
                OutputLock(tmp_path, "profile").acquire()
        finally:
            other.kill()
            other.wait()
        # its owner is gone now (a reaped process): the lock is taken over
        assert not is_alive(owner["owner"])
        taker = OutputLock(tmp_path, "profile")
        taker.acquire()
        assert json.loads((tmp_path / LOCK_FILE).read_text())["command"] == "profile"
        taker.release()
    assert not (tmp_path / LOCK_FILE).exists()


def test_a_reused_pid_is_not_the_owner(tmp_path):
    """The lock names pid *and* start time: this process with another start time counts as dead."""
    pid, ticks = process_identity(os.getpid()).split(":")
    if not ticks:
        pytest.skip("no /proc here")
    assert is_alive(f"{pid}:{ticks}")
    assert not is_alive(f"{pid}:{int(ticks) + 1}")
    (tmp_path / LOCK_FILE).write_text(json.dumps({"owner": f"{pid}:{int(ticks) + 1}", "host": os.uname().nodename}))
    with OutputLock(tmp_path, "overlap"):
        assert json.loads((tmp_path / LOCK_FILE).read_text())["owner"] == f"{pid}:{ticks}"


def test_an_unreadable_lock_is_abandoned(tmp_path):
    (tmp_path / LOCK_FILE).write_bytes(b"\xff\x00 not json")
    with OutputLock(tmp_path, "validate") as lock:
        assert lock.held
