"""The batch API: predict, run, compare. `validate_layouts` for a list of layouts, `validate_plan` for
the top-K candidates of `mat plan`.
"""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from .. import SCHEMA_VERSION, __version__
from ..errors import ConfigError
from ..files import write_text_atomic
from ..specs import get_gpu_spec
from .agreement import BEST_TOLERANCE, rank_agreement
from .calibration import held_out_memory
from .layout import Layout, ran_with_ddp_side_stream
from .predict import compare, predict
from .results import aggregate

STEP_TIME_TARGET = 0.10  # |predicted / measured - 1| for step time
MEMORY_TARGET = 0.05  # ... and for peak memory


@dataclass(frozen=True)
class ValidationReport:
    out_dir: Path
    rows: tuple[dict[str, Any], ...]
    agreement: tuple[dict[str, Any], ...]
    summary: dict[str, Any]
    plan: dict[str, Any] | None = None  # `mat plan --validate`: measured beside predicted (`plan_measured`)


def predictions_for(layouts: list[Layout], gpu: str, out_dir: Path, calibration: Any = None) -> dict[str, dict]:
    """Predict every layout and write `layouts.json` (layouts + predictions). Before a run, with the
    gradient-accumulation fusion the runner on this machine will use; once a layout has run, with what its
    run recorded (so a report rebuilt elsewhere predicts the run that happened)."""
    ran = aggregate(out_dir) if out_dir.exists() else {}
    fusion = {k: row.get("gradient_accumulation_fusion") for k, row in ran.items()}
    preds = {
        lay.layout_id: predict(
            lay.replace(ddp_side_stream=ran_with_ddp_side_stream(ran[lay.layout_id])) if lay.layout_id in ran else lay,
            gpu,
            calibration,
            gradient_accumulation_fusion=fusion.get(lay.layout_id),
        )
        for lay in layouts
    }
    out_dir.mkdir(parents=True, exist_ok=True)
    doc = {
        "schema_version": SCHEMA_VERSION,
        "tool_version": __version__,
        "gpu": gpu,
        "layouts": [
            {"layout_id": lay.layout_id, "layout": lay.to_dict(), "predicted": preds[lay.layout_id]} for lay in layouts
        ],
    }
    write_text_atomic(out_dir / "layouts.json", json.dumps(doc, indent=1) + "\n")
    return preds


def targets(rows: list[dict[str, Any]], agreement: list[dict[str, Any]]) -> dict[str, Any]:
    """Which of the issue's targets hold: step time within 10%, memory within 5%, best within 3%."""
    ok = [r for r in rows if r["status"] == "ok" and r["error_rel"]["step_time"] is not None]
    mem = [r for r in rows if r["status"] == "ok" and r["error_rel"]["peak_memory"] is not None]
    allocated = [e for r in mem if (e := r["error_rel"].get("allocated_memory")) is not None]
    # memory stand-ins measure the allocator only: their reservation is their memory figure
    stand_in = [
        e
        for r in rows
        if r["status"] == "ok" and r.get("stand_in") and (e := r["error_rel"].get("reserved_memory")) is not None
    ]
    return {
        "layouts_ok": sum(r["status"] == "ok" for r in rows),
        "layouts_failed": sum(r["status"] == "failed" for r in rows),
        "step_time_within_10pct": sum(abs(r["error_rel"]["step_time"]) <= STEP_TIME_TARGET for r in ok),
        "step_time_compared": len(ok),
        "peak_memory_within_5pct": sum(abs(r["error_rel"]["peak_memory"]) <= MEMORY_TARGET for r in mem),
        "peak_memory_compared": len(mem),
        "allocated_memory_within_5pct": sum(abs(e) <= MEMORY_TARGET for e in allocated),
        "allocated_memory_compared": len(allocated),
        "stand_in_reserved_memory_within_5pct": sum(abs(e) <= MEMORY_TARGET for e in stand_in),
        "stand_in_reserved_memory_compared": len(stand_in),
        "oom_as_predicted": sum(bool(r.get("oom_as_predicted")) for r in rows),
        "oom_compared": sum(r.get("oom_as_predicted") is not None for r in rows),
        "predicted_best_within_3pct": sum(a["predicted_best_ok"] for a in agreement),
        "groups": len(agreement),
        "best_tolerance": BEST_TOLERANCE,
    }


def build_report(layouts: list[Layout], out_dir: Path, gpu: str, predictions: dict[str, dict]) -> ValidationReport:
    """Join what ran with the predictions; write results.jsonl and summary.json."""
    gpu_spec = get_gpu_spec(gpu)
    measured = aggregate(out_dir)
    rows = [compare(lay, measured.get(lay.layout_id), predictions.get(lay.layout_id, {}), gpu_spec) for lay in layouts]
    agreement = rank_agreement(rows)
    held_out = held_out_memory(rows)
    summary = {
        "schema_version": SCHEMA_VERSION,
        "tool_version": __version__,
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "gpu": gpu,
        "targets": targets(rows, agreement),
        "rank_agreement": agreement,
        "memory_held_out": held_out,
        "rows": rows,
    }
    summary["targets"]["peak_memory_held_out_within_5pct"] = sum(abs(h["error"]) <= MEMORY_TARGET for h in held_out)
    summary["targets"]["peak_memory_held_out_compared"] = len(held_out)
    write_text_atomic(
        out_dir / "results.jsonl", "".join(json.dumps(r) + "\n" for r in rows if r["status"] != "pending")
    )
    write_text_atomic(out_dir / "summary.json", json.dumps(summary, indent=1) + "\n")
    return ValidationReport(out_dir, tuple(rows), tuple(agreement), summary)


def validate_layouts(
    layouts: list[Layout],
    output_dir: str | Path,
    gpu: str,
    device: str = "cuda",
    layout_timeout_s: float = 300.0,
    retry_failed: bool = False,
    available_gpus: int | None = None,
    calibration: Any = None,
    write_calibration_to: str | Path | None = None,
    run: bool = True,
    log=print,
    layouts_per_job: int | None = 1,
    measure_host_floor: bool = False,
    stand_in: str | None = None,
) -> ValidationReport:
    """Predict, run (unless `run` is False: report only), compare. Failures never abort the batch. With
    `measure_host_floor` (and a run on CUDA) this machine's eager dense and MoE host floors are measured first and
    the predictions use them (`host_floor.measure_host_floor`). With `stand_in` ("stages": the first rank of each
    pipeline stage, "all": every rank) those ranks run alone on one device (memory only:
    `launcher.stand_in_command`)."""
    if stand_in not in (None, "stages", "all"):
        raise ConfigError("stand_in", f"must be 'stages' or 'all', got {stand_in!r}")
    for lay in layouts if stand_in else []:
        lay.stand_in_ranks()  # refuses what a stand-in cannot run, before anything runs
    if not layouts:
        raise ConfigError("layouts", "nothing to validate")
    seen: dict[str, Layout] = {}
    for lay in layouts:
        seen.setdefault(lay.layout_id, lay)
    layouts = list(seen.values())
    out = Path(output_dir)
    if measure_host_floor and run and device == "cuda":
        from .host_floor import measure_host_floor as measure

        calibration = measure(layouts, gpu, out / "host_floor", calibration, available_gpus, log)
    predictions = predictions_for(layouts, gpu, out, calibration)
    predicted_oom = {k for k, p in predictions.items() if p.get("fits") is False}
    if run:
        from .launcher import run_layouts

        run_layouts(
            layouts,
            out,
            device=device,
            layout_timeout_s=layout_timeout_s,
            retry_failed=retry_failed,
            available_gpus=available_gpus,
            predicted_oom=predicted_oom,
            on_job_done=lambda: build_report(layouts, out, gpu, predictions),
            log=log,
            layouts_per_job=layouts_per_job,
            stand_in=stand_in,
        )
        predictions = predictions_for(layouts, gpu, out, calibration)
    report = build_report(layouts, out, gpu, predictions)
    if write_calibration_to is not None:
        from .calibration import write_calibration

        write_calibration(list(report.rows), gpu, write_calibration_to)
    return report


def _attr(obj: Any, *names: str) -> Any:
    for name in names:
        if isinstance(obj, dict) and name in obj:
            return obj[name]
        if hasattr(obj, name):
            return getattr(obj, name)
    return None


def planned_candidates(plan_result: Any, k: int, host_alternatives: bool = True) -> list[Any]:
    """The candidates `mat plan --validate K` runs: the top-`k` feasible ones, then (`host_alternatives`: timed runs)
    the best layouts on the fastest and slowest hosts measured where the plan names them
    (`PlanResult.pace_alternatives`, `search.host_pace`).

    Reads what the plan holds defensively: a list of candidates in `.candidates` / `.ranked` / `.feasible` (or the
    result itself as a list), each with `.parallel` and `.workload` (or an `.estimate` carrying them)."""
    cands = _attr(plan_result, "candidates", "ranked", "feasible", "top")
    if cands is None and isinstance(plan_result, (list, tuple)):
        cands = plan_result
    if cands is None:
        raise ConfigError("plan", "the plan result has no candidates list")

    def feasible(cand: Any) -> bool:
        fits, est = _attr(cand, "fits"), _attr(cand, "estimate")
        if fits is None and est is not None:
            fits = _attr(est, "fits")
        return fits is not False

    chosen = [c for c in cands if feasible(c)][:k]
    for rank in (_attr(plan_result, "pace_alternatives") or ()) if host_alternatives else ():
        cand = cands[rank - 1]
        if all(c is not cand for c in chosen) and feasible(cand):
            chosen.append(cand)
    return chosen


def plan_layouts(
    plan_result: Any,
    k: int,
    reference: Layout | None = None,
    model_source: str | None = None,
    ub_yaml: Any = None,
    host_alternatives: bool = True,
    **layout_options: Any,
) -> list[Layout]:
    """`planned_candidates` as layouts (`candidate_layouts`), + the reference layout when given."""
    chosen = candidate_layouts(
        plan_result, planned_candidates(plan_result, k, host_alternatives), model_source, ub_yaml, **layout_options
    )
    return chosen if reference is None else [*chosen, reference]


def candidate_layouts(
    plan_result: Any, candidates: list[Any], model_source: str | None = None, ub_yaml: Any = None, **layout_options: Any
) -> list[Layout]:
    """The plan's `candidates` as layouts, each carrying the plan's run settings (`Layout.from_configs(options=...)`):
    what was ranked is what runs. The model comes from the result (`.model`) or the candidate's estimate;
    `model_source`: the preset or config path it was read from (needed for a config.json model). `ub_yaml(rank)`: the
    userbuffers yaml a TP-overlap candidate runs with (None: TE's defaults)."""
    model = _attr(plan_result, "model", "model_spec")
    options = _attr(plan_result, "options")
    chosen: list[Layout] = []
    for cand in candidates:
        est = _attr(cand, "estimate")
        parallel = _attr(cand, "parallel") or _attr(est, "parallel")
        workload = _attr(cand, "workload") or _attr(est, "workload")
        spec = _attr(cand, "model") or (_attr(est, "model") if est is not None else None) or model
        if parallel is None or workload is None or spec is None:
            raise ConfigError("plan", "a candidate lacks parallel / workload / model")
        name, num_layers = _model_reference(spec, model_source)
        extra = dict(layout_options)
        rank = _attr(cand, "rank")
        if parallel.tp_comm_overlap and ub_yaml is not None and ub_yaml(rank) is not None:
            extra["tp_comm_overlap_cfg"] = str(ub_yaml(rank))
        chosen.append(Layout.from_configs(name, parallel, workload, num_layers=num_layers, options=options, **extra))
    return chosen


def _model_reference(spec: Any, source: str | None = None) -> tuple[str, int | None]:
    """(preset name or config path, reduced layer count or None) for a ModelSpec or a name; `source`: where the
    plan read the model from (a preset or a config.json path), tried before the spec's name."""
    if isinstance(spec, str):
        return spec, None
    from ..specs import load_model_spec

    for name in (source, spec.name):
        if not name:
            continue
        try:
            full = load_model_spec(name)
        except Exception:  # noqa: BLE001 - try the next reference
            continue
        if full.hidden_size == spec.hidden_size and full.vocab_size == spec.vocab_size:
            return name, None if full.num_layers == spec.num_layers else spec.num_layers
    raise ConfigError("plan", f"model {spec.name!r} is neither a preset nor a config file the plan was given")


def plan_measured(candidates: list[Any], report: ValidationReport, layouts: list[Layout]) -> dict[str, Any]:
    """What `mat plan --validate K` measured beside what it predicted: per planned candidate (and its layout) the
    predicted and measured step and peak memory (the prediction is the plan's own: `validate.predict` gives the same
    number for the layout), the measured winner, and the regret (#1's measured step over the fastest measured, - 1)."""
    by_id = {row["layout_id"]: row for row in report.rows}
    rows = []
    for cand, lay in zip(candidates, layouts, strict=True):
        row = by_id.get(lay.layout_id, {})
        m = row.get("measured") or {}
        rows.append(
            {
                "rank": cand.rank,
                "label": cand.label,
                "status": row.get("status", "not run"),
                "error": row.get("error"),
                "predicted_step_time_s": cand.estimate.step_time_s,
                "measured_step_time_s": m.get("step_time_s"),
                "step_time_error": (row.get("error_rel") or {}).get("step_time"),
                "predicted_peak_memory_gib": cand.estimate.peak_memory_gib,
                "measured_peak_memory_gib": m.get("peak_gib"),
                "peak_memory_error": (row.get("error_rel") or {}).get("peak_memory"),
            }
        )
    ran = [r for r in rows if r["measured_step_time_s"]]
    out: dict[str, Any] = {"output_dir": str(report.out_dir), "layouts": rows, "measured_best": None, "regret": None}
    if ran:
        best = min(ran, key=lambda r: r["measured_step_time_s"])
        out["measured_best"] = {key: best[key] for key in ("rank", "label", "measured_step_time_s")}
        first = rows[0]
        if first["measured_step_time_s"]:
            out["regret"] = first["measured_step_time_s"] / best["measured_step_time_s"] - 1.0
    return out


def validate_plan(
    plan_result: Any,
    k: int,
    output_dir: str | Path,
    gpu: str | None = None,
    reference: Layout | None = None,
    steps: int = 5,
    warmup_steps: int = 3,
    model_source: str | None = None,
    ub_yaml: Any = None,
    **opts: Any,
):
    """`mat plan --validate K`: run the top-K feasible candidates (+ reference) and compare; `opts` go to
    `validate_layouts` (the plan's `calibration`, `measure_host_floor`, ...). Returns the report and what
    `plan_measured` makes of it (as `.plan`)."""
    if gpu is None:
        gpu_obj = _attr(plan_result, "gpu", "gpu_spec")
        gpu = gpu_obj if isinstance(gpu_obj, str) else _attr(gpu_obj, "name")
    if not gpu:
        raise ConfigError("gpu", "validate_plan needs the GPU preset the plan was made for")
    # memory stand-ins time nothing: the layouts the host's pace could make fastest add nothing to them
    candidates = planned_candidates(plan_result, k, host_alternatives=not opts.get("stand_in"))
    # the layouts carry the plan's run settings (allocator, overlaps, fusions) from its CostOptions
    layouts = candidate_layouts(plan_result, candidates, model_source, ub_yaml, steps=steps, warmup_steps=warmup_steps)
    out = Path(output_dir)
    if out.name != "validate":
        out = out / "validate"
    report = validate_layouts([*layouts, *([reference] if reference else [])], out, gpu, **opts)
    return replace(report, plan=plan_measured(candidates, report, layouts))
