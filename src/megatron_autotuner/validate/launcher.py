"""Launch validation layouts: one torchrun job per world size, layouts run one after another inside it.

By default every layout gets a fresh torchrun job (`layouts_per_job=1`): on 2x H200 a process that ran
several layouts kept ~9-15 GiB of each earlier layout's model and optimizer allocated (megatron-core /
TE globals), which inflated later memory figures and made one layout fail for lack of memory.
`layouts_per_job=None` shares one job (saves the ~20-30 s of imports and process-group start-up per
layout; memory is then reported net of what was already allocated when a layout started). The launcher
watches the layout rank 0 is on (`runs/current_layout.txt`): one that runs past `layout_timeout_s`
(a hang: NCCL, a peer that died) gets the job killed and recorded as failed, and the job restarts
with the layouts after it; a job that crashes is handled the same way. Layouts predicted not to fit
run last in their job, so an OOM cannot disturb the layouts after it. Finished layouts (ok or
failed) are skipped on rerun. Multi-node: `torchrun_command(nnodes=..., rdzv_endpoint=...)` or the
Slurm script of `slurm_script`.

Memory stand-ins (`stand_in="stages"` or `"all"`): the first rank of each pipeline stage (or every rank) of a
layout runs alone, one process after another, on this machine's one device (`stand_in_command`: the worker over
torch's fake process group), so the memory of a layout for many GPUs is measured on one; a rerun runs only the
ranks that have no record yet.
"""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

from ..launch import LaunchReport, OutputLock, start_job, watch_job
from .layout import Layout
from .results import append_record, current_file, finished_layout_ids, launcher_file, read_records
from .runner import failure_kind

WORKER_MODULE = "megatron_autotuner.validate.worker"
STARTUP_ALLOWANCE_S = 180.0  # imports + process-group start before the first layout


def torchrun_command(
    world_size: int,
    job_file: Path,
    out_dir: Path,
    device: str = "cuda",
    timeout_s: float = 600.0,
    nnodes: int = 1,
    rdzv_endpoint: str | None = None,
    python: str = sys.executable,
) -> list[str]:
    """The torchrun command of one job: single node (`--standalone`) or a c10d rendezvous over nodes."""
    if nnodes > 1:
        if not rdzv_endpoint:
            raise ValueError("multi-node runs need rdzv_endpoint (host:port of node 0)")
        if world_size % nnodes:
            raise ValueError(f"world size {world_size} is not divisible by {nnodes} nodes")
        launch = [
            f"--nnodes={nnodes}",
            "--rdzv-backend=c10d",
            f"--rdzv-endpoint={rdzv_endpoint}",
            f"--nproc-per-node={world_size // nnodes}",
        ]
    else:
        launch = ["--standalone", f"--nproc-per-node={world_size}"]
    return [
        python, "-m", "torch.distributed.run", *launch,
        "-m", WORKER_MODULE,
        "--layouts", str(job_file),
        "--out-dir", str(out_dir),
        "--device", device,
        "--timeout-s", str(int(timeout_s)),
    ]  # fmt: skip


def stand_in_command(
    job_file: Path,
    out_dir: Path,
    rank: int,
    world_size: int,
    device: str = "cuda",
    timeout_s: float = 600.0,
    python: str = sys.executable,
) -> list[str]:
    """One memory stand-in: rank `rank` of a `world_size`-rank job, alone in one process (no torchrun)."""
    return [
        python, "-m", WORKER_MODULE,
        "--layouts", str(job_file),
        "--out-dir", str(out_dir),
        "--device", device,
        "--timeout-s", str(int(timeout_s)),
        "--stand-in-rank", str(rank),
        "--stand-in-world-size", str(world_size),
    ]  # fmt: skip


def slurm_script(
    layouts_file: str | Path,
    out_dir: str | Path,
    nodes: int,
    gpus_per_node: int,
    job_name: str = "mat-validate",
    time_limit: str = "00:30:00",
    partition: str | None = None,
    setup: str = "",
) -> str:
    """An sbatch script that runs the worker on `nodes` x `gpus_per_node` GPUs (torchrun per node,
    c10d rendezvous on the first node). Every layout in the file must use nodes x gpus_per_node GPUs."""
    world = nodes * gpus_per_node
    lines = [
        "#!/bin/bash",
        f"#SBATCH --job-name={job_name}",
        f"#SBATCH --nodes={nodes}",
        "#SBATCH --ntasks-per-node=1",
        f"#SBATCH --gpus-per-node={gpus_per_node}",
        "#SBATCH --exclusive",
        f"#SBATCH --time={time_limit}",
    ]
    if partition:
        lines.append(f"#SBATCH --partition={partition}")
    lines += [
        "set -euo pipefail",
        setup,
        'HEAD=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
        f"mkdir -p {shlex.quote(str(out_dir))}",
        "srun torchrun --nnodes=$SLURM_NNODES --nproc-per-node="
        + str(gpus_per_node)
        + ' --rdzv-backend=c10d --rdzv-endpoint="$HEAD:29500" --rdzv-id=$SLURM_JOB_ID'
        + f" -m {WORKER_MODULE} --layouts {shlex.quote(str(layouts_file))} --out-dir {shlex.quote(str(out_dir))}",
        f"# then, on any node: mat validate --layouts {shlex.quote(str(layouts_file))} "
        f"--output-dir {shlex.quote(str(out_dir))} --report-only   (world size {world})",
    ]
    return "\n".join(line for line in lines if line is not None) + "\n"


def order_for_job(layouts: list[Layout], predicted_oom: set[str]) -> list[Layout]:
    """Layouts predicted to fit first, then the ones predicted to OOM (stable otherwise)."""
    return sorted(layouts, key=lambda lay: lay.layout_id in predicted_oom)


def run_layouts(
    layouts: list[Layout],
    out_dir: str | Path,
    device: str = "cuda",
    layout_timeout_s: float = 300.0,
    retry_failed: bool = False,
    available_gpus: int | None = None,
    predicted_oom: set[str] | None = None,
    on_job_done=None,
    log=print,
    layouts_per_job: int | None = 1,
    stand_in: str | None = None,
) -> LaunchReport:
    """Run every unfinished layout, `layouts_per_job` per torchrun job (None: all of one world size in one
    job), or rank by rank as memory stand-ins; records land under `out_dir/runs/`."""
    if layouts_per_job is not None and layouts_per_job < 1:
        raise ValueError(f"layouts_per_job must be >= 1 or None, got {layouts_per_job}")
    out = Path(out_dir)
    (out / "runs").mkdir(parents=True, exist_ok=True)
    with OutputLock(out, "validate"):
        return _run_layouts(
            layouts, out, device, layout_timeout_s, retry_failed, available_gpus, predicted_oom, on_job_done, log,
            layouts_per_job, stand_in,
        )  # fmt: skip


def _run_layouts(
    layouts: list[Layout],
    out: Path,
    device: str,
    layout_timeout_s: float,
    retry_failed: bool,
    available_gpus: int | None,
    predicted_oom: set[str] | None,
    on_job_done,
    log,
    layouts_per_job: int | None,
    stand_in: str | None,
) -> LaunchReport:
    if stand_in:
        return _run_stand_ins(layouts, out, device, layout_timeout_s, retry_failed, on_job_done, log, stand_in == "all")
    done = finished_layout_ids(out, retry_failed)
    pending = [lay for lay in layouts if lay.layout_id not in done]
    report = LaunchReport(out_dir=out, total=len(layouts), skipped_finished=len(layouts) - len(pending))
    if available_gpus is not None:
        for lay in [lay for lay in pending if lay.world_size > available_gpus]:
            _launcher_failure(out, lay, f"needs {lay.world_size} GPUs, {available_gpus} available", "error")
            report.failed_by_launcher.append(lay.layout_id)
        pending = [lay for lay in pending if lay.world_size <= available_gpus]
    # one job runs layouts of one world size and one set of process settings (`Layout.process_settings`)
    groups: dict[tuple[int, bool, int], list[Layout]] = {}
    for lay in pending:
        groups.setdefault((lay.world_size, *lay.process_settings), []).append(lay)
    current = current_file(out)
    for (world, *_), group in sorted(groups.items()):
        remaining = order_for_job(group, predicted_oom or set())
        attempt = 0
        while remaining:
            attempt += 1
            stem = out / "jobs" / f"world{world}_job{attempt}"
            while stem.with_suffix(".json").exists():
                attempt += 1
                stem = out / "jobs" / f"world{world}_job{attempt}"
            stem.parent.mkdir(parents=True, exist_ok=True)
            job = stem.with_suffix(".json")
            batch = remaining if layouts_per_job is None else remaining[:layouts_per_job]
            later = remaining[len(batch) :]
            job.write_text(json.dumps([lay.to_dict() for lay in batch], indent=1))
            cmd = torchrun_command(world, job, out, device, timeout_s=layout_timeout_s)
            log(f"world {world}: {len(batch)} layout(s), job {job.name}")
            current.unlink(missing_ok=True)
            with open(stem.with_suffix(".log"), "w") as logf:
                proc = start_job(cmd, logf)
                timed_out, on_id = watch_job(proc, current, layout_timeout_s, STARTUP_ALLOWANCE_S)
                hung = (on_id or "<startup>") if timed_out else None
            finished = finished_layout_ids(out, retry_failed=False)
            unfinished = [lay for lay in batch if lay.layout_id not in finished]
            report.ran += len(batch) - len(unfinished)
            if on_job_done is not None:
                on_job_done()
            if not unfinished:
                remaining = later
                continue
            blamed_id = hung or (current.read_text().strip() if current.exists() else None)
            if not hung and blamed_id in finished:
                # the worker recorded this layout's failure itself and ended the job: go on with the rest
                remaining = unfinished + later
                continue
            blamed = next((lay for lay in unfinished if lay.layout_id == blamed_id), unfinished[0])
            tail = stem.with_suffix(".log").read_text(errors="replace")[-2000:]
            if hung:
                reason = f"timed out after {layout_timeout_s:.0f} s"
                kind = "timeout"
            else:
                reason = f"job exited with code {proc.returncode}"
                kind = failure_kind(tail) if failure_kind(tail) != "error" else "error"
            _launcher_failure(out, blamed, reason, kind, tail)
            report.failed_by_launcher.append(blamed.layout_id)
            log(f"[failed] {blamed.label} ({blamed.layout_id}): {reason}")
            remaining = [lay for lay in unfinished if lay.layout_id != blamed.layout_id] + later
    current.unlink(missing_ok=True)
    return report


def _recorded_ranks(out: Path, layout_id: str, retry_failed: bool) -> tuple[set[int], bool]:
    """(ranks with an ok record, whether a rank or the launcher recorded a failure) of one layout."""
    ok: set[int] = set()
    failed = False
    for path in sorted((out / "runs").glob("*.jsonl")):
        for rec in read_records(path):
            if rec.get("layout_id") != layout_id:
                continue
            if rec.get("status") == "ok" and rec.get("rank") is not None:
                ok.add(rec["rank"])
            elif rec.get("status") == "failed" and not retry_failed:
                failed = True
    return ok, failed


def _run_stand_ins(
    layouts: list[Layout],
    out: Path,
    device: str,
    layout_timeout_s: float,
    retry_failed: bool,
    on_job_done,
    log,
    all_ranks: bool,
) -> LaunchReport:
    """Each stand-in rank of each layout (`Layout.stand_in_ranks`) as its own process; a failed rank ends its
    layout (recorded)."""
    report = LaunchReport(out_dir=out, total=len(layouts), skipped_finished=0)
    current = current_file(out)
    for lay in layouts:
        ok, failed = _recorded_ranks(out, lay.layout_id, retry_failed)
        todo = [r for r in lay.stand_in_ranks(all_ranks) if r not in ok]
        if failed or not todo:
            report.skipped_finished += 1
            continue
        stem = out / "jobs" / f"stand_in_{lay.layout_id}"
        stem.parent.mkdir(parents=True, exist_ok=True)
        job = stem.with_suffix(".json")
        job.write_text(json.dumps([lay.to_dict()], indent=1))
        for rank in todo:
            log(f"{lay.label}: stand-in for rank {rank} of {lay.world_size}")
            cmd = stand_in_command(job, out, rank, lay.world_size, device, layout_timeout_s)
            current.unlink(missing_ok=True)
            logf_path = stem.parent / f"{stem.name}_rank{rank}.log"
            with open(logf_path, "w") as logf:
                proc = start_job(cmd, logf)
                timed_out, _ = watch_job(proc, current, layout_timeout_s, STARTUP_ALLOWANCE_S)
            ok, failed = _recorded_ranks(out, lay.layout_id, retry_failed=False)
            if failed:
                break  # the worker recorded this rank's failure: the layout is finished
            if rank not in ok:
                tail = logf_path.read_text(errors="replace")[-2000:]
                reason = f"timed out after {layout_timeout_s:.0f} s" if timed_out else f"exited with {proc.returncode}"
                kind = "timeout" if timed_out else failure_kind(tail)
                _launcher_failure(out, lay, f"stand-in for rank {rank}: {reason}", kind, tail)
                report.failed_by_launcher.append(lay.layout_id)
                log(f"[failed] {lay.label} ({lay.layout_id}): stand-in for rank {rank}: {reason}")
                break
        report.ran += 1
        if on_job_done is not None:
            on_job_done()
    current.unlink(missing_ok=True)
    return report


def _launcher_failure(out: Path, layout: Layout, error: str, kind: str, log_tail: str | None = None) -> None:
    record = {
        "layout_id": layout.layout_id,
        "layout": layout.to_dict(),
        "rank": None,
        "status": "failed",
        "failure_kind": kind,
        "error": error,
    }
    if log_tail:
        record["log_tail"] = log_tail
    append_record(launcher_file(out), record)
