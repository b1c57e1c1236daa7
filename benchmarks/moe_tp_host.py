"""An eager MoE block's host at TP 2 and expert-TP 2, and pipeline memory under expandable segments, on 2x H200.

    bash benchmarks/validation/x2_moe_tp_host.sh       # on a 2-GPU host: the layouts, predicted first
    bash benchmarks/validation/x2_moe_tp_diagnose.sh   # the same MoE shapes profiled, the pipelines' histories
    python benchmarks/moe_tp_host.py                   # this report, from what those left

Writes benchmarks/results/moe_tp_host_h200_x2/report.json: per MoE layout the step predicted on this machine before
the run (default host floor: `predicted.json`, made on a CPU; this host's floor, measured by `--measure-host-floor`
just before: the run's own prediction), the measured step and each decoder layer's host issue time (median forward /
backward, `Layout.host_timing`); the profiled rerun's step and, per rank, the GPU's busy, idle and collective time;
per pipeline layout the peak predicted before the run, now, and measured.
"""

from __future__ import annotations

import json
from pathlib import Path

from megatron_autotuner.launch.records import read_records
from megatron_autotuner.validate.layout import Layout
from megatron_autotuner.validate.predict import predict

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks/results/moe_tp_host_h200_x2"


def _cpu_predictions(name: str) -> dict[str, dict]:
    return {row["layout_id"]: row["predicted"] for row in json.loads((OUT / name).read_text())["layouts"]}


def _trace_ranks(layout_id: str) -> list[dict]:
    """Per rank of the profiled rerun: the step's span and the GPU's busy / idle / collective time (ms)."""
    ranks = []
    for path in sorted((OUT / "diagnose/traces").glob(f"{layout_id}.rank_*.summary.json")):
        overlap = json.loads(path.read_text())["traces"][0]["overlap"]
        keys = ("span_us", "busy_us", "idle_us", "comm_us")
        ranks.append({k.removesuffix("_us") + "_ms": round(overlap[k] / 1e3, 1) for k in keys})
    return ranks


def moe_rows() -> list[dict]:
    cpu = _cpu_predictions("predicted.json")
    diagnosed = read_records(OUT / "diagnose/results.jsonl")
    rerun = {r["label"].removeprefix("diag ").removesuffix(" profile"): r for r in diagnosed}
    rows = []
    for r in read_records(OUT / "moe/results.jsonl"):
        timing = r["measured"]["host_timing"]
        again = rerun.get(r["label"].replace("moe host ", "moe "))
        rows.append(
            {
                "label": r["label"],
                "layout_id": r["layout_id"],
                "local_experts": 128 // r["layout"]["ep"],
                "predicted_default_floor_s": cpu[r["layout_id"]]["step_time_s"],
                "predicted_measured_floor_s": r["predicted"]["step_time_s"],
                "measured_s": r["measured"]["step_time_s"],
                "layer_host_fwd_ms": timing["fwd_ms"],
                "layer_host_bwd_ms": timing["bwd_ms"],
                "rerun_measured_s": again["measured"]["step_time_s"] if again else None,
                "rerun_ranks": _trace_ranks(again["layout_id"]) if again else [],
            }
        )
    return rows


def pipeline_rows() -> list[dict]:
    cpu = _cpu_predictions("predicted_pipe.json")
    rows = []
    for r in read_records(OUT / "pipe/results.jsonl"):
        now = predict(Layout.from_record(r), "H200")
        rows.append(
            {
                "label": r["label"],
                "layout_id": r["layout_id"],
                "predicted_before_gib": cpu[r["layout_id"]]["peak_memory_gib"],
                "predicted_now_gib": now["peak_memory_gib"],
                "queued_frees_now_gib": now["memory_breakdown_gib"]["queued_frees"],
                "measured_gib": r["measured"]["peak_gib"],
                "max_allocated_gib": r["measured"]["max_allocated_gib"],
                "max_reserved_gib": r["measured"]["max_reserved_gib"],
            }
        )
    return rows


def main() -> None:
    floor = json.loads((OUT / "moe/host_floor/host_floor.calibration.json").read_text())["moe_host_floor"][0]
    report = {
        "gpu": (OUT / "moe/gpus.txt").read_text().splitlines()[0],
        "moe_host_floor": {k: floor[k] for k in ("fwd_s", "fwd_per_local_expert_s", "bwd_s", "bwd_per_local_expert_s")},
        "moe": moe_rows(),
        "pipelines": pipeline_rows(),
    }
    (OUT / "report.json").write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
