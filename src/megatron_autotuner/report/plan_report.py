"""`mat plan` report directory: plan.json, the top-K snippets, and a throughput-vs-memory chart."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any

from ..errors import AutotunerError
from ..export import export_all
from ..files import check_output_dir, ensure_output_dir, write_text_atomic


def output_dir_for(command: str, output_dir: str | Path | None = None, create: bool = True) -> Path:
    """`--output-dir` or outputs/<UTC timestamp>-<command>/: created (`create`), or only checked that it can be
    (`create=False`, before long work). A file in the way, no permission or an empty path is a one-line error."""
    if output_dir is None:
        stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
        output_dir = Path("outputs") / f"{stamp}-{command}"
    return ensure_output_dir(output_dir) if create else check_output_dir(output_dir)


def plot_plan(result: Any, path: Path, top_k: int) -> Path:
    """Predicted tokens/s/GPU against peak memory of every feasible layout; top-K marked."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:  # pragma: no cover - matplotlib is a dependency
        raise AutotunerError(f"the plan chart needs matplotlib: {exc}") from exc
    cands = result.candidates
    fig, ax = plt.subplots(figsize=(8, 5))
    ax.scatter(
        [c.estimate.peak_memory_gib for c in cands],
        [c.estimate.tokens_per_s_per_gpu for c in cands],
        s=8,
        alpha=0.4,
        label=f"feasible ({len(cands)})",
    )
    top = cands[:top_k]
    ax.scatter(
        [c.estimate.peak_memory_gib for c in top],
        [c.estimate.tokens_per_s_per_gpu for c in top],
        s=40,
        color="red",
        label=f"top {len(top)}",
    )
    for c in top:
        ax.annotate(str(c.rank), (c.estimate.peak_memory_gib, c.estimate.tokens_per_s_per_gpu), fontsize=8)
    usable = result.gpu.hbm_gib * (1 - result.options.memory_margin)
    ax.axvline(usable, color="gray", linestyle="--", label=f"usable {usable:.0f} GiB")
    ax.set_xlabel("peak memory per GPU (GiB)")
    ax.set_ylabel("predicted tokens/s/GPU")
    ax.set_title(f"{result.model.name} on {result.num_gpus} x {result.gpu.name}")
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_plan_report(
    result: Any,
    out_dir: Path,
    top_k: int,
    chart: bool = True,
    current: Any = None,
    tuned_tp_overlap_yaml: str | None = None,
    *,
    run_settings: dict[str, Any],
) -> dict[str, Any]:
    """Write plan.json, top-K export snippets under rank_<k>/, and plan.png; return the index. `current`: the
    user's own launch against the best (`search.current.CurrentRun`), written into plan.json and
    `flag_changes.txt`; `run_settings`: what every layout assumed beyond itself (`costmodel.estimate.run_settings`).
    The folder is locked while it is written (`launch.OutputLock`), and what an earlier plan wrote there that this
    one does not (its plan.json's index) is removed once the new plan.json is in place."""
    from ..launch import OutputLock

    with OutputLock(out_dir, "plan"):
        previous = _previous_outputs(out_dir)
        files = _write_plan_files(result, out_dir, top_k, chart, current, tuned_tp_overlap_yaml, run_settings)
        _remove_stale(out_dir, previous - _outputs(files))
    return files


def _outputs(files: dict[str, Any]) -> set[str]:
    """The paths a plan.json's "files" index names (the rank folders, flag_changes.txt, plan.png)."""
    return {str(v) for k, v in files.items() if k in ("chart", "flag_changes")} | {
        str(v) for v in (files.get("exports") or {}).values()
    }


def _previous_outputs(out_dir: Path) -> set[str]:
    try:
        files = json.loads((out_dir / "plan.json").read_text()).get("files")
    except (OSError, ValueError, AttributeError):
        return set()
    return _outputs(files) if isinstance(files, dict) else set()


def _remove_stale(out_dir: Path, stale: set[str]) -> None:
    """Remove an earlier plan's outputs, only inside `out_dir` (a rank folder only with the files export_all writes)."""
    import shutil

    for name in stale:
        path = Path(name)
        if path.parent.resolve() != out_dir.resolve():
            continue
        if path.is_dir() and path.name.startswith("rank_"):
            shutil.rmtree(path, ignore_errors=True)
        elif path.is_file() and path.name in ("flag_changes.txt", "plan.png"):
            path.unlink(missing_ok=True)


def _write_plan_files(
    result: Any,
    out_dir: Path,
    top_k: int,
    chart: bool,
    current: Any,
    tuned_tp_overlap_yaml: str | None,
    run_settings: dict[str, Any],
) -> dict[str, Any]:
    files: dict[str, Any] = {"plan": str(out_dir / "plan.json"), "exports": {}}
    for c in result.top(top_k):
        sub = out_dir / f"rank_{c.rank}"
        sub.mkdir(exist_ok=True)
        expandable = result.options.expandable_segments
        files_text = export_all(result.model, c.parallel, c.workload, expandable, result.options, tuned_tp_overlap_yaml)
        for name, text in files_text.items():
            write_text_atomic(sub / name, text)
        files["exports"][str(c.rank)] = str(sub)
    if chart and result.candidates:
        files["chart"] = str(plot_plan(result, out_dir / "plan.png", top_k))
    data = {**result.to_dict(top_k=top_k), "run_settings": run_settings}
    if current is not None:
        data["current_run"] = current.to_dict()
        changes = out_dir / "flag_changes.txt"
        said = (
            "does not fit; rank 1 is the fastest layout that does"
            if not current.estimate.fits
            else (f"predicted {current.speedup - 1:+.1%} faster")
        )
        lines = [f"# your launch -> rank 1 ({said})"]
        write_text_atomic(changes, "\n".join(lines + [str(c) for c in current.changes]) + "\n")
        files["flag_changes"] = str(changes)
    data["files"] = files
    write_text_atomic(out_dir / "plan.json", json.dumps(data, indent=1, default=str) + "\n")
    return files
