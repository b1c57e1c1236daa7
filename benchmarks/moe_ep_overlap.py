"""#40 on two H200s: expert parallelism 1 vs 2, the EP all-to-all overlap, token dropping, and what paces the step.

    bash benchmarks/validation/x2_moe_ep_overlap.sh      # round 1 (predicted first; ep 2 layouts profiled)
    bash benchmarks/validation/x2_moe_ep_overlap_r2.sh   # round 2: host timing, this machine's floors measured first
    bash benchmarks/validation/x2_moe_ep_overlap_r3.sh   # round 3: gpt-oss-20b's overlap with / without delayed wgrad
    bash benchmarks/validation/x2_moe_ep_host.sh         # "host": local vs the model's experts, another 2-GPU host
    PART=oss|mixtral|diag bash benchmarks/validation/x2_moe_ep_r4.sh   # round 4: round 2's layouts on a third host
    PART=disp|more|diag|oss bash benchmarks/validation/x2_moe_r5.sh    # round 5: dispatchers, padding, a fourth host
    bash benchmarks/validation/x2_moe_r6.sh              # round 6: the three-process MoE floor on a fifth host
    PART=run|probe bash benchmarks/validation/x2_moe_r7.sh   # round 7: layer host times at 4096 / 512 tokens, host F
    bash benchmarks/validation/h200_x1_padded_host.sh    # round 7's padded layers on one of host F's GPUs
    bash benchmarks/validation/h200_x1_padded_blind.sh   # padded gpt-oss, blind, on one GPU of host G
    python benchmarks/moe_ep_overlap.py                  # this report, from what they left

Writes benchmarks/results/moe_ep_overlap_h200_x2/report.json: per round and layout the step and peak predicted before
the run with the default host floors (each round's `predicted.json` / `predicted_default.json`), the prediction the run
made with the floors its machine measured minutes before (every round but the first), today's model with the default
floors and with the machine's, the measured step and peak, each rank's
median decoder-layer host time (`Layout.host_timing`), and for the profiled layouts the per-collective transfer and
each rank's wait (`mat trace waits`, kept as traces/LAYOUT.waits.json) beside the model's time of one all-to-all
(`estimate_layout`: the exposed EP time of the step over its 4 all-to-alls per MoE layer and micro-batch).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from megatron_autotuner.costmodel.calibration import load_calibration
from megatron_autotuner.launch.records import read_records
from megatron_autotuner.validate.layout import Layout
from megatron_autotuner.validate.predict import estimate_layout, predict
from megatron_autotuner.validate.results import layer_host_ms_by_rank

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks/results"
# round -> results folder, the prediction written before it (default floors), the 2-GPU lease it ran on (rounds
# 1-3 shared one machine; each later round is a fresh one) and the MoE host floor that machine measured
ROUNDS = {
    "r1": ("moe_ep_overlap_h200_x2", "predicted.json", "A", "moe_ep_overlap_h200_x2_r2/host_floor"),
    "r2": ("moe_ep_overlap_h200_x2_r2", "predicted_default.json", "A", "moe_ep_overlap_h200_x2_r2/host_floor"),
    "r3": ("moe_ep_overlap_h200_x2_r3", "predicted_default.json", "A", "moe_ep_overlap_h200_x2_r2/host_floor"),
    "host": ("moe_ep_host_h200_x2", "predicted_default.json", "B", "moe_ep_host_h200_x2/host_floor"),
    "r4": ("moe_ep_r4_h200_x2/oss", "../predicted_default_oss.json", "C", "moe_ep_r4_h200_x2/oss/host_floor"),
    "r4 mixtral": (
        "moe_ep_r4_h200_x2/mixtral",
        "../predicted_default_mixtral.json",
        "C",
        "moe_ep_r4_h200_x2/oss/host_floor",
    ),
    "r4 diag": ("moe_ep_r4_h200_x2/diag", "../predicted_default_diag.json", "C", "moe_ep_r4_h200_x2/oss/host_floor"),
    # round 5's first part measured no floor (Mixtral's block is GPU-bound there): its rows take the second part's
    "r5 disp": ("moe_r5_h200_x2/disp", "../predicted_default_disp.json", "D", "moe_r5_h200_x2/more/host_floor"),
    "r5 more": ("moe_r5_h200_x2/more", "../predicted_default_more.json", "D", "moe_r5_h200_x2/more/host_floor"),
    "r5 diag": ("moe_r5_h200_x2/diag", "../predicted_default_diag.json", "D", "moe_r5_h200_x2/more/host_floor"),
    "r5 oss": ("moe_r5_h200_x2/oss", "../predicted_default_oss.json", "D", "moe_r5_h200_x2/more/host_floor"),
    # the first round with the three-process floor (`host_floor.HOST_FLOOR_ROUNDS`)
    "r6": ("moe_r6_h200_x2", "predicted_default.json", "E", "moe_r6_h200_x2/host_floor"),
    # round 7 (host F): every layer's host time at 4096 tokens (run) and at 512 (probe, with run's floors); then one of
    # the host's GPUs ran the padded layers alone (h200_x1_padded_host.sh) with floors it measured itself ("F1")
    "r7": ("moe_r7_h200_x2/run", "../predicted_default.json", "F", "moe_r7_h200_x2/run/host_floor"),
    "r7 probe": ("moe_r7_h200_x2/probe", "../predicted_default_probe.json", "F", "moe_r7_h200_x2/run/host_floor"),
    "r7 padded": ("padded_host_h200", "predicted_default.json", "F1", "padded_host_h200/host_floor"),
    # blind, after the model held gpt-oss's padded layers host-bound: one GPU of a new host, two shapes no run had
    "blind padded": ("padded_blind_h200", "predicted_default.json", "G", "padded_blind_h200/host_floor"),
}
OUT = RESULTS / "moe_ep_overlap_h200_x2/report.json"


def model_all_to_all_ms(layout: Layout, gpu: str) -> float | None:
    """The model's time of one dispatch / combine all-to-all of the layout (ms): its step's exposed EP time over the
    4 all-to-alls of each MoE layer and micro-batch (none hidden without the overlap)."""
    if layout.ep < 2 or layout.moe_a2a_overlap:
        return None
    spec = layout.model_spec()
    moe_layers = sum(spec.is_moe_layer(i) for i in range(spec.num_layers))
    ep_s = estimate_layout(layout, gpu).to_dict()["time_breakdown_s"]["exposed_comm"]["ep"]
    return ep_s * 1e3 / (4 * moe_layers * layout.num_microbatches)


def _waits(folder: Path, layout_id: str) -> list[dict] | None:
    path = folder / "traces" / f"{layout_id}.waits.json"
    return json.loads(path.read_text())["collectives"] if path.exists() else None


def _now(layout: Layout, calibration: Any) -> dict:
    """Today's model for the layout as the runner ran it (no gradient-accumulation fusion: no APEX there)."""
    return predict(layout, "H200", calibration, gradient_accumulation_fusion=False)


def round_rows(name: str, folder_name: str, predicted_name: str, machine: str, floor: str) -> list[dict]:
    folder = RESULTS / folder_name
    calibration = load_calibration(str(RESULTS / floor / "host_floor.calibration.json"))
    doc = json.loads((folder / predicted_name).read_text())
    before = {row["layout_id"]: row["predicted"] for row in doc["layouts"]}
    rows = []
    for r in read_records(folder / "results.jsonl"):
        layout = Layout.from_dict(r["layout"])
        measured = r.get("measured") or {}
        now = _now(layout, None)
        row = {
            "round": name,
            "machine": machine,
            "label": r["label"],
            "layout_id": r["layout_id"],
            "status": r["status"],
            "predicted_before_step_s": before[r["layout_id"]]["step_time_s"],
            "predicted_before_peak_gib": before[r["layout_id"]]["peak_memory_gib"],
            "predicted_at_run_step_s": (r.get("predicted") or {}).get("step_time_s"),
            "predicted_now_step_s": now["step_time_s"],
            "predicted_now_machine_floor_step_s": _now(layout, calibration)["step_time_s"],
            "predicted_now_peak_gib": now["peak_memory_gib"],
            "measured_step_s": measured.get("step_time_s"),
            "measured_peak_gib": measured.get("peak_gib"),
            "measured_allocated_gib": measured.get("max_allocated_gib"),
            "measured_reserved_gib": measured.get("max_reserved_gib"),
            "layer_host_ms": layer_host_ms_by_rank(folder, r["layout_id"]),
            "model_all_to_all_ms": model_all_to_all_ms(layout, doc["gpu"]),
            "collective_waits": _waits(folder, r["layout_id"]),
        }
        if r["status"] != "ok":
            row["error"] = r.get("error")
        rows.append(row)
    return rows


def report() -> dict:
    rows = [row for name, spec in ROUNDS.items() for row in round_rows(name, *spec)]
    floors = {}
    for _, _, machine, floor in ROUNDS.values():
        doc = json.loads((RESULTS / floor / "host_floor.calibration.json").read_text())
        floors[machine] = [{k: v for k, v in f.items() if k != "cases"} for f in doc["moe_host_floor"]]
    return {"gpu": "H200", "rows": rows, "measured_moe_host_floor_by_machine": floors}


def main() -> int:
    doc = report()
    OUT.write_text(json.dumps(doc, indent=1) + "\n")
    for row in doc["rows"]:
        if row["measured_step_s"] is None:
            print(f"{row['round']} {row['label']}: {row['status']}")
            continue
        err = row["predicted_before_step_s"] / row["measured_step_s"] - 1
        print(f"{row['round']} {row['label']}: predicted {row['predicted_before_step_s']:.3f} s, "
              f"measured {row['measured_step_s']:.3f} s ({err:+.1%})")  # fmt: skip
    print(f"wrote {OUT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
