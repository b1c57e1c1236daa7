"""Where the host's time goes under Megatron's EP all-to-all overlap, on two H200s (#40).

    python benchmarks/moe_overlap_host.py      # results/moe_overlap_host_h200_x2/report.json

`benchmarks/validation/x2_moe_overlap_host.sh` measured the lease's three-process MoE floors, then ran gpt-oss-20b (4
layers) and Mixtral-8x7B (2 layers) at ep 2 serial, with `--overlap-moe-expert-parallel-comm` and with it and
`--delay-wgrad-compute`, every layer's host time recorded (run/), and twice profiled gpt-oss-20b serial and
overlapped (profile/, profile_r2/, whose raw rank traces are kept). The model's output-layer drain
(`moe_overlap.head_drain_s`) was built from those; a second lease then ran three shapes no run had, serial and
overlapped (blind/: gpt-oss-20b at 8192 tokens and at 8 layers, Qwen3-30B-A3B), its floors measured first, and
profiled the 8192-token pair (s8192/, raw traces kept). Every prediction was written before its run: the default
floors' in predicted_default*.json (committed first), the host's in each results.jsonl.

Per run: the step measured, predicted before (default floors), at the run (the host's floors) and now (today's model
with the host's floors); the overlapped step over the serial one of the same part, measured and modelled; the host
times of the layers (serial: per layer pass; overlapped: per combined layer step, `host_timing.CombinedLayerHostTimer`);
and from the raw traces the host's waits of 5 ms or more (`trace.syncs.host_waits`) outside the optimizer's step-end
check, with the GPU work that ran during them.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks/results/moe_overlap_host_h200_x2"
GPU = "H200"
PARTS = {"run": "predicted_default.json", "profile": "predicted_default_profile.json",
         "profile_r2": "predicted_default_profile.json", "blind": "predicted_default_blind.json",
         "s8192": "predicted_default_s8192.json"}  # fmt: skip
RAW = ("profile_r2", "s8192")  # the parts whose raw rank traces are kept
DRAIN_MIN_MS = 5.0
STEP_END_OP = "aten::_local_scalar_dense"  # the optimizer's found-inf / grad-norm read, once a step


def _calibration(part: str):
    from megatron_autotuner.costmodel.calibration import load_calibration

    folder = RESULTS / part
    path = folder / "host_floor/host_floor.calibration.json"
    return load_calibration(path if path.exists() else folder / "calibration.json")


def _rows(part: str) -> list[dict]:
    from megatron_autotuner.validate.layout import Layout
    from megatron_autotuner.validate.predict import predict
    from megatron_autotuner.validate.results import layer_host_timing_by_rank

    before = {r["layout_id"]: r["predicted"] for r in json.loads((RESULTS / PARTS[part]).read_text())["layouts"]}
    calibration = _calibration(part)
    rows = []
    for line in (RESULTS / part / "results.jsonl").read_text().splitlines():
        run = json.loads(line)
        layout = Layout.from_record(run)
        measured = run["measured"]
        now = predict(layout, GPU, calibration)
        step = measured["step_time_s"]
        rows.append({
            "part": part, "label": run["label"], "model": layout.model, "num_layers": layout.num_layers,
            "seq_length": layout.seq_length, "overlap": layout.moe_a2a_overlap,
            "delay_wgrad": layout.delay_wgrad_compute, "step_s": step,
            "predicted_before_s": before[run["layout_id"]]["step_time_s"],
            "predicted_at_run_s": run["predicted"]["step_time_s"], "predicted_now_s": now["step_time_s"],
            "step_error_before": before[run["layout_id"]]["step_time_s"] / step - 1,
            "step_error_at_run": run["predicted"]["step_time_s"] / step - 1,
            "step_error_now": now["step_time_s"] / step - 1,
            "peak_gib": measured["peak_gib"], "peak_error_now": now["peak_memory_gib"] / measured["peak_gib"] - 1,
            "host_timing_by_rank": layer_host_timing_by_rank(RESULTS / part, run["layout_id"]),
        })  # fmt: skip
    return rows


def _ratios(rows: list[dict]) -> list[dict]:
    """Each overlapped step over the serial step of the same shape in the same part, measured and modelled now."""

    def shape(row: dict) -> tuple:
        return row["part"], row["model"], row["num_layers"], row["seq_length"]

    out = []
    for r in rows:
        serial = next((s for s in rows if shape(s) == shape(r) and not s["overlap"]), None)
        if r["overlap"] and serial is not None:
            out.append({"part": r["part"], "label": r["label"], "measured": r["step_s"] / serial["step_s"],
                        "model_now": r["predicted_now_s"] / serial["predicted_now_s"]})  # fmt: skip
    return out


def _layouts(part: str) -> dict:
    """{layout id: Layout} of a part's runs."""
    from megatron_autotuner.validate.layout import Layout

    runs = (json.loads(line) for line in (RESULTS / part / "results.jsonl").read_text().splitlines())
    return {run["layout_id"]: Layout.from_record(run) for run in runs}


def _drains() -> list[dict]:
    """The host waits of DRAIN_MIN_MS or more in the kept raw traces (named LAYOUT_ID.rank_R.json.gz), less the
    optimizer's step-end read."""
    from megatron_autotuner.trace import host_waits, load_trace

    out = []
    for part in RAW:
        layouts = _layouts(part)
        for path in sorted((RESULTS / part / "raw").glob("*.json.gz")):
            waits = host_waits(load_trace(path), min_ms=DRAIN_MIN_MS)
            kept = [w for w in waits.waits if w.inside != STEP_END_OP]
            out.append({
                "part": part, "trace": path.name,
                "overlap": layouts[path.name.split(".rank_")[0]].moe_a2a_overlap, "blocked_ms": waits.total_ms,
                "waits": [{"duration_ms": w.duration_ms, "inside": w.inside,
                           "gpu_during_ms": [list(g) for g in w.gpu_during_ms]} for w in kept],
            })  # fmt: skip
    return out


def build_report() -> dict:
    rows = [row for part in PARTS for row in _rows(part)]
    floor = _calibration("run").moe_host_floors[0]
    return {
        "gpu": (RESULTS / "run/gpus.txt").read_text().strip(),
        "date": json.loads((RESULTS / "run/summary.json").read_text())["date"],
        "predicted_at": json.loads((RESULTS / "predicted_default.json").read_text())["predicted_at"],
        "host_moe_floor_ms": floor.line_ms(),
        "rows": rows,
        "overlap_over_serial": _ratios(rows),
        "drains": _drains(),
        "median_abs_step_error": {
            k: statistics.median(abs(r[f"step_error_{k}"]) for r in rows) for k in ("before", "at_run", "now")
        },
    }  # fmt: skip


def main() -> int:
    report = build_report()
    (RESULTS / "report.json").write_text(json.dumps(report, indent=1) + "\n")
    for r in report["rows"]:
        print(
            f"{r['part']:10} {r['label']:52} step {r['step_s'] * 1e3:6.1f} ms err before {r['step_error_before']:+.1%}"
            f" at run {r['step_error_at_run']:+.1%} now {r['step_error_now']:+.1%}; peak {r['peak_error_now']:+.1%}"
        )
    for r in report["overlap_over_serial"]:
        print(f"{r['part']:10} {r['label']:52} over serial: measured {r['measured']:.3f}, model {r['model_now']:.3f}")
    for d in report["drains"]:
        print(f"{d['part']:10} {'overlapped' if d['overlap'] else 'serial':10} {d['trace'][-14:]} blocked "
              f"{d['blocked_ms']:.1f} ms; waits >= {DRAIN_MIN_MS:g} ms: "
              f"{[round(w['duration_ms'], 1) for w in d['waits']]}")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
