"""Reports of a tuning run: tuning_report.json, summary.txt, ub yaml files per TP, timeline PNGs.

Per (model, TP) and GEMM range (`op.fwd` / `op.bwd`), and summed per op and for the layer's four ops:
no-overlap (NCCL) time, TE-default time, tuned time (the best candidate, analysis.py), symm-mem time.
`predicted_layer_speedup` = TE-default sum / tuned sum over the GEMM ops.
"""

from __future__ import annotations

import datetime as dt
import json
import math
from pathlib import Path
from typing import Any

from .. import SCHEMA_VERSION, __version__
from ..files import write_text_atomic
from .analysis import Candidate, RunAnalysis, best_candidate
from .rules import cfg_from_dict, cfg_violations
from .scaling import scaling_check, whole_layer_scaling
from .yamlcfg import dump_ub_yaml

SETUPS = ("nccl", "te_default", "tuned", "symm_mem")


def _ms(c: Candidate | None) -> float | None:
    return c.mean_ms if c is not None and c.e2e_ms else None


def _sum(values: list[float | None]) -> float | None:
    return None if not values or any(v is None for v in values) else sum(values)  # type: ignore[arg-type]


def model_tp_summary(an: RunAnalysis, model: str, tp: int, tie_frac: float, threshold: float) -> dict[str, Any]:
    slots = an.slots(model)
    rows = []
    tuned_cfg: dict[str, dict] = {}
    for slot in slots:
        nccl = an.by_label(model, tp, slot, "nccl" if tp > 1 else "no_tp")
        ted = an.by_label(model, tp, slot, "te_default")
        tuned = an.by_label(model, tp, slot, "tuned")
        symm = an.by_label(model, tp, slot, "symm_mem")
        best = best_candidate(an.group(model, tp, "te", slot), tie_frac)
        if best is not None and best.cfg:
            tuned_cfg.update(best.cfg)
        rows.append(
            {
                "slot": slot,
                "nccl_ms": _ms(nccl),
                "te_default_ms": _ms(ted),
                "tuned_ms": _ms(tuned),
                "symm_mem_ms": _ms(symm),
                "best_variant": best.key if best else None,
                "best_ms": _ms(best),
                "best_overlap_ratio": best.overlap_ratio if best and best.metrics else None,
                "best_exposed_comm_us": best.metric_mean("exposed_comm_us") if best else None,
                "below_overlap_threshold": bool(best and best.metrics and best.overlap_ratio < threshold),
                "candidates": len(an.group(model, tp, "te", slot)),
                "tuned_not_slower_than_te_default": (
                    None if _ms(tuned) is None or _ms(ted) is None else _ms(tuned) <= _ms(ted) * (1 + tie_frac)
                ),
            }
        )
    per_op: dict[str, dict[str, float | None]] = {}
    for row in rows:
        op = row["slot"].split(".")[0]
        d = per_op.setdefault(op, {f"{s}_ms": 0.0 for s in SETUPS})
        for s in SETUPS:
            k = f"{s}_ms"
            d[k] = None if d[k] is None or row[k] is None else d[k] + row[k]
    layer = {f"{s}_ms": _sum([row[f"{s}_ms"] for row in rows]) for s in SETUPS}
    speedup = layer["te_default_ms"] / layer["tuned_ms"] if layer["te_default_ms"] and layer["tuned_ms"] else None
    problems = cfg_violations(cfg_from_dict(tuned_cfg), tp=tp) if tuned_cfg else []
    return {
        "model": model,
        "tp": tp,
        "slots": rows,
        "ops": per_op,
        "layer": layer,
        "predicted_layer_speedup_vs_te_default": speedup,
        "tuned_cfg": tuned_cfg,
        "tuned_cfg_violations": problems,
    }


def layer_check_results(out_dir: str | Path) -> list[dict[str, Any]]:
    """The `overlap.layer_check` results saved in a tuning output folder (`layer_check*.json`, one per TP size)."""
    docs = []
    for path in sorted(Path(out_dir).glob("layer_check*.json")):
        try:
            doc = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(doc, dict) and isinstance(doc.get("tp"), int) and isinstance(doc.get("models"), dict):
            docs.append(doc)
    return docs


def scaling_summary(
    an: RunAnalysis, summaries: list[dict[str, Any]], tolerance: float, layer_checks: list[dict[str, Any]] = ()
) -> dict[str, Any]:
    """Per model, the check on each GEMM op and on their sum ("layer"), and where the whole-layer check has TP 1 and
    a larger size (`scaling.whole_layer_scaling`), that one: it decides the recommended TP, since the ops timed one
    at a time carry the host's issue time where it exceeds their GPU time and a step's layer does not."""
    out: dict[str, Any] = {}
    for model in sorted({s["model"] for s in summaries}):
        tp1 = next((s for s in summaries if s["model"] == model and s["tp"] == 1), None)
        if tp1 is None:
            continue
        results = []
        names = [*tp1["ops"], "layer"]
        for name in names:
            base = tp1["layer"]["nccl_ms"] if name == "layer" else tp1["ops"][name]["nccl_ms"]
            if not base:
                continue
            by_tp = {}
            for s in summaries:
                if s["model"] != model or s["tp"] == 1:
                    continue
                src = s["layer"] if name == "layer" else s["ops"].get(name, {})
                opts = [(src.get(f"{k}_ms"), k) for k in SETUPS if src.get(f"{k}_ms")]
                if not opts:
                    continue
                t, setup = min(opts)
                exp = [
                    r["best_exposed_comm_us"]
                    for r in s["slots"]
                    if (name == "layer" or r["slot"].startswith(name + ".")) and r["best_exposed_comm_us"] is not None
                ]
                by_tp[s["tp"]] = (t, setup, sum(exp) / 1e3 if exp else None)
            results.append(scaling_check(name, base, by_tp, tolerance).to_dict())
        layer = next((r for r in results if r["name"] == "layer"), None)
        out[model] = {
            "results": results,
            "recommended_tp": layer["largest_efficient_tp"] if layer else None,
            "reason": layer["reason"] if layer else "no layer timing",
        }
        whole = whole_layer_scaling(list(layer_checks), model, tolerance)
        if whole is not None:
            results.append(whole.to_dict())
            gemms = f"; the GEMMs timed one at a time said TP={layer['largest_efficient_tp']}" if layer else ""
            out[model]["recommended_tp"] = whole.largest_efficient_tp
            out[model]["reason"] = f"whole layer {whole.reason}{gemms}"
    return out


SYNTHETIC_NOTE = (
    "SYNTHETIC: made by the fake overlap backend on CPU (mat overlap tune --fake), not measured on a GPU; "
    "do not train with these settings"
)


def build_report(
    an: RunAnalysis, config: dict[str, Any], tie_frac: float = 0.005, layer_checks: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    """The tuning report; `layer_checks` default to the `layer_check*.json` files of the run's folder."""
    if layer_checks is None:
        layer_checks = layer_check_results(an.out_dir)
    threshold = float(config.get("overlap_threshold", 0.5))
    tolerance = float(config.get("scaling_tolerance", 0.2))
    summaries = [model_tp_summary(an, m, tp, tie_frac, threshold) for m, tp in an.model_tps()]
    env = next((r.get("env") for r in an.records if r.get("env")), {}) or {}
    searches = [
        {k: s.get(k) for k in ("model", "tp", "backend", "rounds", "candidates_profiled", "full_sweep_candidates")}
        for s in an.searches
    ]
    for s in searches:
        s["candidates_profiled_total"] = sum((s.get("candidates_profiled") or {}).values())
        s["full_sweep_total"] = sum((s.get("full_sweep_candidates") or {}).values())
    return {
        "schema_version": SCHEMA_VERSION,
        "tool_version": __version__,
        "kind": "overlap_tuning_report",
        **({"synthetic": SYNTHETIC_NOTE} if config.get("fake") else {}),
        "created": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "config": config,
        "device": env.get("device"),
        "versions": {k: env.get(k) for k in ("torch", "transformer_engine", "megatron_core", "cuda", "nccl")},
        "measured_date": env.get("date"),
        "summaries": summaries,
        "scaling": scaling_summary(an, summaries, tolerance, layer_checks),
        "searches": searches,
        "candidates": [c.to_dict() for c in an.candidates],
        "failures": [{k: f.get(k) for k in ("case_id", "job_id", "error")} for f in an.failures],
        "trace_errors": an.trace_errors,
    }


def _fmt(v: float | None, unit: str = "") -> str:
    return "-" if v is None or (isinstance(v, float) and math.isinf(v)) else f"{v:.3f}{unit}"


def summary_text(report: dict[str, Any]) -> str:
    lines = [
        *([report["synthetic"]] if report.get("synthetic") else []),
        f"megatron-autotuner {report['tool_version']} TP-overlap tuning  ({report['created']})",
        f"device: {report.get('device')}  versions: {report.get('versions')}",
        "",
    ]
    for s in report["summaries"]:
        lines.append(f"== {s['model']}  TP={s['tp']}  (ms, CUDA-event medians; bwd = dgrad + wgrad)")
        lines.append(
            f"{'range':10s} {'no-overlap':>11s} {'TE default':>11s} {'tuned':>9s} {'symm-mem':>9s}  best variant"
        )
        for r in s["slots"]:
            flag = "  [overlap < threshold]" if r["below_overlap_threshold"] else ""
            ratio = f" ratio {r['best_overlap_ratio']:.2f}" if r["best_overlap_ratio"] is not None else ""
            lines.append(
                f"{r['slot']:10s} {_fmt(r['nccl_ms']):>11s} {_fmt(r['te_default_ms']):>11s} "
                f"{_fmt(r['tuned_ms']):>9s} {_fmt(r['symm_mem_ms']):>9s}  {r['best_variant'] or '-'}{ratio}{flag}"
            )
        for op, d in s["ops"].items():
            lines.append(
                f"{op + ' total':10s} {_fmt(d['nccl_ms']):>11s} {_fmt(d['te_default_ms']):>11s} "
                f"{_fmt(d['tuned_ms']):>9s} {_fmt(d['symm_mem_ms']):>9s}"
            )
        L = s["layer"]
        lines.append(
            f"{'layer':10s} {_fmt(L['nccl_ms']):>11s} {_fmt(L['te_default_ms']):>11s} "
            f"{_fmt(L['tuned_ms']):>9s} {_fmt(L['symm_mem_ms']):>9s}  (sum of the GEMM ops)"
        )
        if s["predicted_layer_speedup_vs_te_default"]:
            lines.append(
                f"predicted speedup of the tuned config over TE default: "
                f"{s['predicted_layer_speedup_vs_te_default']:.3f}x"
            )
        if s["tuned_cfg_violations"]:
            lines.append(f"WARNING: tuned config breaks rules: {s['tuned_cfg_violations']}")
        lines.append("")
    for s in report["searches"]:
        lines.append(
            f"search {s['model']} TP={s['tp']}: {s['rounds']} rounds, {s['candidates_profiled_total']} "
            f"candidates measured vs {s['full_sweep_total']} in a full sweep"
        )
    for model, sc in report["scaling"].items():
        lines.append(f"TP scaling {model}: recommended TP={sc['recommended_tp']}: {sc['reason']}")
        for r in sc["results"]:
            pts = ", ".join(
                f"TP{p['tp']} {p['time_ms']:.3f} ms ({p['efficiency']:.0%}, {p['setup']})" for p in r["points"]
            )
            lines.append(f"  {r['name']:6s} TP1 {r['tp1_ms']:.3f} ms; {pts}")
    if report["failures"]:
        lines.append("")
        lines.append(f"{len(report['failures'])} failed rounds/jobs:")
        lines += [f"  {f['case_id']}: {f['error']}" for f in report["failures"][:20]]
    return "\n".join(lines) + "\n"


def write_reports(
    an: RunAnalysis, config: dict[str, Any], out_dir: str | Path, tie_frac: float = 0.005, plots: bool = True
) -> dict[str, Any]:
    out = Path(out_dir)
    report = build_report(an, config, tie_frac)
    files: dict[str, Any] = {"yaml": [], "plots": []}
    models = sorted({s["model"] for s in report["summaries"]})
    for s in report["summaries"]:
        if s["tp"] < 2 or not s["tuned_cfg"]:
            continue
        cfg = cfg_from_dict(s["tuned_cfg"])
        header = [
            *([SYNTHETIC_NOTE] if report.get("synthetic") else []),
            f"TE userbuffers config tuned by megatron-autotuner {__version__} for {s['model']}, TP={s['tp']},",
            f"{config.get('max_token_len')} tokens x micro-batch {config.get('micro_batch_size', 1)}.",
            f"layer GEMMs: TE default {_fmt(s['layer']['te_default_ms'])} ms, tuned {_fmt(s['layer']['tuned_ms'])} ms.",
            "Use: Megatron-LM --tp-comm-overlap --tp-comm-overlap-cfg THIS_FILE, or",
            "initialize_ub(shape=[seq*mbs, hidden], tp_size=TP, ub_cfgs=yaml.safe_load(open(THIS_FILE))).",
        ]
        sub = out / s["model"] if len(models) > 1 else out
        files["yaml"].append(str(dump_ub_yaml(cfg, sub / f"optimal_tp_comm_overlap_cfg_tp{s['tp']}.yaml", header)))
        rec = report["scaling"].get(s["model"], {}).get("recommended_tp")
        if rec == s["tp"] or (
            rec in (None, 1)
            and s["tp"] == min(x["tp"] for x in report["summaries"] if x["model"] == s["model"] and x["tp"] > 1)
        ):
            note = [*header, f"recommended TP for this model: {rec} (see summary.txt)"]
            files["yaml"].append(str(dump_ub_yaml(cfg, sub / "optimal_tp_comm_overlap_cfg.yaml", note)))
        if plots:
            p = _timeline(an, s, sub / f"timeline_tp{s['tp']}.png", tie_frac, bool(report.get("synthetic")))
            if p:
                files["plots"].append(str(p))
    report["files"] = files
    write_text_atomic(out / "tuning_report.json", json.dumps(report, indent=1, default=str))
    write_text_atomic(out / "summary.txt", summary_text(report))
    return report


def _timeline(an: RunAnalysis, s: dict[str, Any], path: Path, tie_frac: float, synthetic: bool) -> Path | None:
    from .plot import timeline_png

    rows = []
    for slot in an.slots(s["model"]):
        base = an.by_label(s["model"], s["tp"], slot, "nccl")
        best = best_candidate(an.group(s["model"], s["tp"], "te", slot), tie_frac)
        for label, c in (("no-overlap", base), ("best", best)):
            if c is not None and c.metrics:
                m = c.metrics[-1]
                rows.append({"slot": slot, "label": label, "gemm": m.gemm_intervals, "comm": m.comm_intervals})
    title = f"{s['model']} TP={s['tp']}: best userbuffers config vs no overlap"
    return timeline_png(rows, path, ("SYNTHETIC (fake backend, CPU) - " if synthetic else "") + title)
