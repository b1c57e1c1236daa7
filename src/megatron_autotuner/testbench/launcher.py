"""Run a grid of testbench cases: one torchrun job per world size, resumable, failure-tolerant.

For each world size the pending cases go to one `torchrun --nproc-per-node W` job. The launcher
watches the case rank 0 is on; a case that runs past `case_timeout_s` (a hang: UB or NCCL timeout)
gets the job killed, is recorded as failed, and the job restarts with the cases after it. A job that
crashes is handled the same way. Finished cases (ok or failed) are skipped on restart. The job's start-up,
before its first case, gets `startup_allowance_s` more than a case: imports and process-group set-up take
~20-30 s per job on a GPU node (`validate.launcher`), ~8 s on a CPU machine.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

from ..errors import AutotunerError
from ..launch import LaunchReport, OutputLock, start_job, watch_job
from .cases import Case, group_by_world_size
from .results import LAUNCHER_FILE, append_record, finished_case_ids

STARTUP_ALLOWANCE_S = 120.0  # beyond `case_timeout_s`, for a job's start-up before its first case

WORKER_MODULE = "megatron_autotuner.testbench.worker"


def torchrun_command(
    world_size: int,
    job_file: Path,
    out_dir: Path,
    mode: str,
    warmup: int,
    repeats: int,
    device: str,
    nsys_output: Path | None = None,
) -> list[str]:
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={world_size}",
        "-m",
        WORKER_MODULE,
        "--cases",
        str(job_file),
        "--out-dir",
        str(out_dir),
        "--mode",
        mode,
        "--warmup",
        str(warmup),
        "--repeats",
        str(repeats),
        "--device",
        device,
    ]
    if nsys_output is not None:
        nsys = shutil.which("nsys")
        if nsys is None:
            raise AutotunerError(
                "mode nsys: the nsys binary is not on PATH (install Nsight Systems or use torch-profile)"
            )
        cmd = [nsys, "profile", "-t", "cuda,nvtx", "-o", str(nsys_output), "--force-overwrite", "true", *cmd]
    return cmd


def run_cases(
    cases: list[Case],
    out_dir: str | Path,
    mode: str = "collect",
    warmup: int = 3,
    repeats: int = 10,
    case_timeout_s: float = 300.0,
    retry_failed: bool = False,
    device: str = "cuda",
    available_gpus: int | None = None,
    progress: bool = True,
    startup_allowance_s: float = STARTUP_ALLOWANCE_S,
) -> LaunchReport:
    """Measure `cases`, writing records under `out_dir/collect/` (locked against a second live sweep). Returns
    what ran."""
    out = Path(out_dir)
    with OutputLock(out, "profile"):
        return _run_cases(
            cases, out, mode, warmup, repeats, case_timeout_s, retry_failed, device, available_gpus, progress,
            startup_allowance_s,
        )  # fmt: skip


def _run_cases(
    cases: list[Case],
    out: Path,
    mode: str,
    warmup: int,
    repeats: int,
    case_timeout_s: float,
    retry_failed: bool,
    device: str,
    available_gpus: int | None,
    progress: bool,
    startup_allowance_s: float,
) -> LaunchReport:
    (out / "collect").mkdir(parents=True, exist_ok=True)
    (out / "cases.json").write_text(json.dumps([c.to_dict() for c in cases], indent=1))
    done = finished_case_ids(out, retry_failed)
    pending = [c for c in cases if c.case_id not in done]
    run = LaunchReport(out_dir=out, total=len(cases), skipped_finished=len(cases) - len(pending))
    if available_gpus is not None:
        too_big = [c for c in pending if c.world_size > available_gpus]
        for c in too_big:
            append_record(
                out / "collect" / LAUNCHER_FILE,
                {
                    "case_id": c.case_id,
                    "case": c.to_dict(),
                    "rank": None,
                    "status": "failed",
                    "error": f"needs {c.world_size} GPUs, {available_gpus} available",
                },
            )
            run.failed_by_launcher.append(c.case_id)
        pending = [c for c in pending if c.world_size <= available_gpus]
    bar = _Progress(len(pending), enabled=progress)
    current_file = out / "collect" / "current_case.txt"
    for world, group in group_by_world_size(pending).items():
        remaining = list(group)
        attempt = 0
        while remaining:
            attempt += 1
            job = out / "jobs" / f"world{world}_job{attempt}.json"
            job.parent.mkdir(parents=True, exist_ok=True)
            job.write_text(json.dumps([c.to_dict() for c in remaining]))
            nsys_out = out / "nsys" / f"world{world}_job{attempt}" if mode == "nsys" else None
            if nsys_out is not None:
                nsys_out.parent.mkdir(parents=True, exist_ok=True)
            cmd = torchrun_command(world, job, out, mode, warmup, repeats, device, nsys_out)
            log = open(out / "jobs" / f"world{world}_job{attempt}.log", "w")  # noqa: SIM115 - closed below
            current_file.unlink(missing_ok=True)
            proc = start_job(cmd, log)
            timed_out, hung = watch_job(
                proc,
                current_file,
                case_timeout_s,
                startup_allowance_s=startup_allowance_s,
                on_change=lambda _id: bar.update(finished_case_ids(out, retry_failed) & {c.case_id for c in pending}),
            )
            hung = hung if timed_out else None
            log.close()
            finished = finished_case_ids(out, retry_failed=False)
            bar.update(finished & {c.case_id for c in pending})
            unfinished = [c for c in remaining if c.case_id not in finished]
            run.ran += len(remaining) - len(unfinished)
            if not unfinished:
                break
            # The job died or hung: blame the case it was on (or the first unfinished one), go on.
            blamed_id = hung or (current_file.read_text().strip() if current_file.exists() else None)
            blamed = next((c for c in unfinished if c.case_id == blamed_id), unfinished[0])
            reason = f"timed out after {case_timeout_s:.0f} s" if hung else f"job exited with code {proc.returncode}"
            tail = (out / "jobs" / f"world{world}_job{attempt}.log").read_text(errors="replace")[-1500:]
            append_record(
                out / "collect" / LAUNCHER_FILE,
                {
                    "case_id": blamed.case_id,
                    "case": blamed.to_dict(),
                    "rank": None,
                    "status": "failed",
                    "error": reason,
                    "log_tail": tail,
                },
            )
            run.failed_by_launcher.append(blamed.case_id)
            remaining = [c for c in unfinished if c.case_id != blamed.case_id]
    bar.close()
    current_file.unlink(missing_ok=True)
    return run


class _Progress:
    """A rich progress bar over cases (quiet when disabled or not on a terminal)."""

    def __init__(self, total: int, enabled: bool) -> None:
        self._bar = None
        if enabled and total:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

            self._bar = Progress(
                "[progress.description]{task.description}",
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                transient=False,
            )
            self._bar.start()
            self._task = self._bar.add_task("testbench cases", total=total)

    def update(self, done: set[str]) -> None:
        if self._bar is not None:
            self._bar.update(self._task, completed=len(done))

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()
