"""Padded MoE steps on one H200 with the host's own floors: does the host's pace explain what the default floors miss?

    python benchmarks/padded_floor.py      # results/padded_floor_h200/report.json

`benchmarks/validation/h200_x1_padded_floor.sh` measured the host's three-process MoE floor first, then ran five padded
(token-dropping) 2-layer steps, each predicting itself with that floor (results.jsonl, "at run"), every decoder
layer's host issue timed (`Layout.host_timing`). The default-floor predictions were written before the lease
(predicted_default.json). Beside each step: the model's host issue per layer of a padded MoE layer (the block's
floor plus half a dense layer's, `costmodel.layer`), with the default floors and with the host's, against the
layers' measured host times.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks/results/padded_floor_h200"
GPU = "H200"


def _layer_issue_ms(layout, calibration) -> tuple[float, float]:
    """The model's host issue of one decoder layer, forward and backward (ms): the stage's per-micro-batch issue less
    the work around the layers (the dense floor's `outside_layers_s`, as the stage charges it), over the layers."""
    from megatron_autotuner.costmodel.calibration import DEFAULT_DENSE_HOST_FLOOR
    from megatron_autotuner.validate.predict import estimate_layout

    est = estimate_layout(layout, GPU, calibration)
    stage = est.time.stages[0]
    layers = layout.model_spec().num_layers
    floor = calibration.dense_host_floor(layout.precision, layout.fp8_recipe, layout.tp) if calibration else None
    outside_s, _ = (floor or DEFAULT_DENSE_HOST_FLOOR).outside_layers_s()
    bwd_s = stage.bwd_host_s / layers
    fwd_s = (stage.host_issue_s - stage.bwd_host_s - outside_s) / layers
    return fwd_s * 1e3, bwd_s * 1e3


def build_report() -> dict:
    from megatron_autotuner.costmodel.calibration import load_calibration
    from megatron_autotuner.validate.layout import Layout

    calibration = load_calibration(RESULTS / "host_floor/host_floor.calibration.json")
    committed = json.loads((RESULTS / "predicted_default.json").read_text())["layouts"]
    before = {r["layout_id"]: r["predicted"] for r in committed}
    rows = []
    for line in (RESULTS / "results.jsonl").read_text().splitlines():
        run = json.loads(line)
        measured, at_run, default = run["measured"], run["predicted"], before[run["layout_id"]]
        layout = Layout.from_record(run)
        timing = measured["host_timing"]
        rows.append(
            {
                "label": run["label"],
                "step_s": measured["step_time_s"],
                "default_step_error": default["step_time_s"] / measured["step_time_s"] - 1,
                "at_run_step_error": at_run["step_time_s"] / measured["step_time_s"] - 1,
                "peak_gib": measured["peak_gib"],
                "default_peak_error": default["peak_memory_gib"] / measured["peak_gib"] - 1,
                "at_run_peak_error": at_run["peak_memory_gib"] / measured["peak_gib"] - 1,
                "layer_host_ms": [timing["fwd_ms"], timing["bwd_ms"]],
                "model_layer_issue_ms_default": list(_layer_issue_ms(layout, None)),
                "model_layer_issue_ms_host": list(_layer_issue_ms(layout, calibration)),
            }
        )
    floor = calibration.moe_host_floors[0]
    return {
        "gpu": (RESULTS / "gpus.txt").read_text().strip(),
        "date": json.loads((RESULTS / "summary.json").read_text())["date"],
        "predicted_at": json.loads((RESULTS / "predicted_default.json").read_text())["predicted_at"],
        "host_moe_floor_ms": floor.line_ms(),
        "rows": rows,
        "median_abs_step_error": {
            "default": statistics.median(abs(r["default_step_error"]) for r in rows),
            "at_run": statistics.median(abs(r["at_run_step_error"]) for r in rows),
        },
    }  # fmt: skip


def main() -> int:
    report = build_report()
    (RESULTS / "report.json").write_text(json.dumps(report, indent=1) + "\n")
    for r in report["rows"]:
        print(
            f"{r['label']:42} step {r['step_s']:.3f} s err default {r['default_step_error']:+.1%} at run "
            f"{r['at_run_step_error']:+.1%}; peak {r['peak_gib']:.1f} GiB err {r['at_run_peak_error']:+.1%}; "
            f"layer host {sum(r['layer_host_ms']):.1f} ms, "
            f"model {sum(r['model_layer_issue_ms_default']):.1f} (default) "
            f"{sum(r['model_layer_issue_ms_host']):.1f} (host)"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
