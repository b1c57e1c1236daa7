"""Run the overlap tuner's jobs: one torchrun per (backend, TP size), watched, killed on a hang, resumed.

The worker writes the id of the round it measures to `collect/current_case.txt`. When one round runs
longer than `case_timeout_s` (start-up counts as a round, with twice the time) the launcher kills the
job's process group, records the round as failed in `collect/launcher.jsonl` and starts the job again;
the new worker replays every recorded round and continues after the failed one. Exit code 3 from the
worker (userbuffers could not be re-initialised in place) restarts it without blame. A job that makes
no progress twice in a row is given up and recorded.
"""

from __future__ import annotations

import json
import signal
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..launch import append_record, start_job, watch_job
from ..launch.records import LAUNCHER_FILE
from .jobs import CURRENT_FILE, REINIT_EXIT_CODE, all_round_records, done_id, job_finished

WORKER_MODULE = "megatron_autotuner.overlap.worker"
# imports (torch, TE) + process-group start before the first case; not tied to the per-case timeout, which
# is seconds (a 5 s start-up limit killed healthy workers on a loaded 2-core CI machine)
STARTUP_ALLOWANCE_S = 120.0


@dataclass
class JobRun:
    job_id: str
    attempts: int = 0
    finished: bool = False
    failures: list[str] = field(default_factory=list)


def worker_command(world_size: int, job_file: Path, out_dir: Path) -> list[str]:
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={world_size}",
        "-m",
        WORKER_MODULE,
        "--job",
        str(job_file),
        "--out-dir",
        str(out_dir),
    ]


def run_job(
    job: dict[str, Any],
    out_dir: Path,
    case_timeout_s: float,
    max_attempts: int = 40,
    command=worker_command,
    env: dict[str, str] | None = None,
) -> JobRun:
    out = Path(out_dir)
    jid = job["job_id"]
    run = JobRun(jid)
    (out / "jobs").mkdir(parents=True, exist_ok=True)
    (out / "collect").mkdir(parents=True, exist_ok=True)
    job_file = out / "jobs" / f"{jid}.json"
    job_file.write_text(json.dumps(job, indent=1))
    current = out / "collect" / CURRENT_FILE
    stalled = 0
    while not job_finished(out, jid) and run.attempts < max_attempts:
        run.attempts += 1
        before = len(all_round_records(out))
        current.unlink(missing_ok=True)
        log_path = out / "jobs" / f"{jid}_attempt{run.attempts}.log"
        with open(log_path, "w") as log, _sigterm_as_exit():
            proc = start_job(command(job["world_size"], job_file, out), log, env)
            timed_out, on_id = watch_job(proc, current, case_timeout_s, STARTUP_ALLOWANCE_S, poll_s=0.2)
            hung = (on_id or "startup") if timed_out else None
        if job_finished(out, jid):
            break
        progressed = len(all_round_records(out)) > before
        tail = log_path.read_text(errors="replace")[-1500:]
        if hung and hung != "startup":
            _record(out, hung, jid, f"timed out after {case_timeout_s:.0f} s", tail)
            run.failures.append(hung)
            stalled = 0
            continue
        if proc.returncode == REINIT_EXIT_CODE and progressed:
            stalled = 0
            continue
        on = current.read_text().strip() if current.exists() else None
        if on and on != "startup" and on not in all_round_records(out):
            _record(out, on, jid, f"job exited with code {proc.returncode}", tail)
            run.failures.append(on)
            stalled = 0
            continue
        stalled = 0 if progressed else stalled + 1
        if stalled >= 2:
            reason = "start-up timed out" if hung == "startup" else f"job exited with code {proc.returncode}"
            _record(out, done_id(jid), jid, f"given up: {reason}", tail, status="failed", kind="job_done")
            break
    current.unlink(missing_ok=True)
    run.finished = job_finished(out, jid)
    return run


class _sigterm_as_exit:
    """While a job runs, SIGTERM (e.g. from `timeout`) raises SystemExit so the job's process group is killed."""

    def __enter__(self):
        self._old = None
        if threading.current_thread() is threading.main_thread():
            self._old = signal.signal(signal.SIGTERM, _raise_exit)
        return self

    def __exit__(self, *exc):
        if self._old is not None:
            signal.signal(signal.SIGTERM, self._old)
        return False


def _raise_exit(signum, frame):
    raise SystemExit(128 + signum)


def _record(
    out: Path, case_id: str, jid: str, error: str, tail: str, status: str = "failed", kind: str = "round"
) -> None:
    append_record(
        out / "collect" / LAUNCHER_FILE,
        {"case_id": case_id, "kind": kind, "job_id": jid, "status": status, "error": error, "log_tail": tail},
    )
