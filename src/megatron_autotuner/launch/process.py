"""Start, watch and kill torchrun jobs so that none outlives `mat`, however `mat` ends.

Three layers, because torchrun starts every rank in a session of its own (killing torchrun's group alone
leaves the ranks running and holding their GPU):
- `kill_job` SIGKILLs the job's process group and every process below it (read from /proc);
- `start_job` puts the job in a new session and asks Linux to send it SIGTERM when `mat` dies
  (prctl PR_SET_PDEATHSIG, prctl(2)); torchrun's elastic agent answers SIGTERM by stopping its workers;
- every worker calls `exit_with_owner`, a thread that ends the worker once the `mat` process named in
  MAT_OWNER_PID is gone — this also covers a SIGKILLed torchrun, whose ranks no signal reaches.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

OWNER_ENV = "MAT_OWNER_PID"  # "<pid>:<start time in clock ticks>" of the mat process that owns a job
PR_SET_PDEATHSIG = 1  # linux/prctl.h
OWNER_POLL_S = 0.5


@dataclass
class LaunchReport:
    """What one launch of a batch did (testbench cases, validation layouts): how many there were, how many
    were already finished and skipped, how many ran, and which the launcher itself recorded as failed."""

    out_dir: Path
    total: int
    skipped_finished: int
    ran: int = 0
    failed_by_launcher: list[str] = field(default_factory=list)


def _stat_fields(pid: int) -> list[str] | None:
    """Fields of /proc/PID/stat after "(comm)", which may hold spaces and parentheses: [state, ppid, ...]."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def process_identity(pid: int) -> str:
    """`pid:start_ticks` (field 22 of /proc/PID/stat), which a reused pid does not repeat; `pid:` without /proc."""
    fields = _stat_fields(pid)
    return f"{pid}:{fields[19] if fields and len(fields) > 19 else ''}"


def is_alive(identity: str) -> bool:
    """Whether the process `process_identity` named is still running (a zombie is not)."""
    pid_text, _, ticks = identity.partition(":")
    try:
        pid = int(pid_text)
    except ValueError:
        return False
    fields = _stat_fields(pid)
    if fields is None:
        if Path("/proc/self/stat").exists():
            return False
        try:  # no /proc (macOS): signal 0 only tells the pid exists
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    return fields[0] != "Z" and (not ticks or len(fields) <= 19 or fields[19] == ticks)


def descendant_pids(pid: int) -> list[int]:
    """Every process below `pid`, read from Linux's /proc (empty where there is none)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        fields = _stat_fields(int(stat.parent.name))
        if fields and len(fields) > 1 and fields[1].isdigit():
            children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _die_with_parent_hook():
    """A preexec_fn that asks Linux for SIGTERM when the parent dies (None where prctl is not there). Only from
    the main thread: the signal follows the *thread* that forked, and a helper thread may end before `mat`."""
    if not sys.platform.startswith("linux") or threading.current_thread() is not threading.main_thread():
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl  # resolved before fork: nothing to load in the child
    except (OSError, AttributeError):
        return None
    parent = os.getpid()

    def hook() -> None:
        prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != parent:  # mat died between fork and prctl
            os._exit(1)

    return hook


def start_job(cmd: list[str], log: IO, env: dict[str, str] | None = None) -> subprocess.Popen:
    """Start `cmd` (a torchrun or worker command) writing to `log`, in a session of its own, tied to this
    process: it gets SIGTERM when `mat` dies and its workers see `mat` gone through MAT_OWNER_PID."""
    job_env = dict(os.environ if env is None else env)
    job_env[OWNER_ENV] = process_identity(os.getpid())
    return subprocess.Popen(
        cmd,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        env=job_env,
        preexec_fn=_die_with_parent_hook(),  # noqa: PLW1509 - the hook only calls prctl and getppid
    )


def exit_with_owner(poll_s: float = OWNER_POLL_S) -> threading.Thread | None:
    """In a worker: a daemon thread that ends this process once the `mat` that started the job has ended
    (MAT_OWNER_PID; nothing when the worker was started by hand)."""
    owner = os.environ.get(OWNER_ENV)
    if not owner:
        return None

    def watch() -> None:
        while is_alive(owner):
            time.sleep(poll_s)
        print(f"worker: mat (pid {owner.split(':')[0]}) has ended; stopping", file=sys.stderr, flush=True)
        os._exit(1)

    thread = threading.Thread(target=watch, name="mat-owner-watchdog", daemon=True)
    thread.start()
    return thread


def kill_job(proc: subprocess.Popen) -> None:
    """SIGKILL the job's process group and every process below it, then reap it."""
    below = descendant_pids(proc.pid)
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        proc.kill()
    for pid in below:
        for kill in (os.killpg, os.kill):  # a rank leads its own group: take its children too
            with contextlib.suppress(ProcessLookupError, PermissionError):
                kill(pid, signal.SIGKILL)
    proc.wait()


def watch_job(
    proc: subprocess.Popen,
    current_file: Path,
    timeout_s: float,
    startup_allowance_s: float = 0.0,
    on_change=None,
    poll_s: float = 0.5,
) -> tuple[bool, str | None]:
    """Wait for a job whose rank 0 writes the id of the item it is on to `current_file`; kill the job when one
    item runs past `timeout_s`, or start-up (no item yet) past `timeout_s + startup_allowance_s`. Returns
    (hung, id it hung on: None at start-up). `on_change(id)` is called when rank 0 moves on. An interrupt
    (Ctrl-C, SIGTERM) takes the job's ranks down too."""
    current_id, since = None, time.monotonic()
    try:
        while proc.poll() is None:
            time.sleep(poll_s)
            now_id = current_file.read_text().strip() if current_file.exists() else None
            if now_id != current_id:
                current_id, since = now_id, time.monotonic()
                if on_change is not None:
                    on_change(now_id)
            limit = timeout_s + (startup_allowance_s if current_id is None else 0.0)
            if time.monotonic() - since > limit:
                kill_job(proc)
                return True, current_id
    finally:
        if proc.poll() is None:
            kill_job(proc)
    return False, None
