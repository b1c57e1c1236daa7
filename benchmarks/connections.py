"""#40 on two H200s: TP / CP communication at one hardware queue and at eight (CUDA_DEVICE_MAX_CONNECTIONS).

    PART=dense bash benchmarks/validation/x2_connections.sh   # Llama-3.1-8B TP 2 + SP and CP 2, at 1 and 8
    PART=moe bash benchmarks/validation/x2_connections.sh     # Mixtral-8x7B CP 2 x EP 2 without / with the overlap
    PART=blind bash benchmarks/validation/x2_connections.sh   # Qwen3-8B CP 2 at 1, 8, 8, 1, another host
    PART=moe_floors bash benchmarks/validation/x2_connections.sh   # the moe part again, a fourth host
    python benchmarks/connections.py                          # this report, from what they left

Writes benchmarks/results/connections_h200_x2/report.json: per layout the step predicted before the run (each part's
`predicted_default*.json`, default floors), today's model and the measured step; for each profiled layout and rank
the time each collective kind ran beside no computation (`mat trace summary`: `exposed_us`); and per pair of the
same layout at 1 and 8 connections the measured change of the step and of the exposed TP / CP communication beside
the model's (CP's ring exchange hidden at 1 and exposed at 8, `estimate.cp_ring_hides`; the predictions written
before the runs held TP's gathers / scatters exposed at 8 too).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from megatron_autotuner.launch.records import read_records
from megatron_autotuner.validate.layout import Layout
from megatron_autotuner.validate.predict import predict

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks/results/connections_h200_x2"
# part -> the prediction written before it
PARTS = {
    "dense": "predicted_default.json",
    "moe": "predicted_default_moe.json",
    "blind": "predicted_default_blind.json",
    "moe_floors": "predicted_default_moe.json",  # the moe part's layouts again, on a fourth host
}
# the collectives of each kind of communication the pairs change (TP: SP's gathers / scatters; CP: the ring)
KINDS = {"tp": ("all_gather", "reduce_scatter"), "cp": ("send_recv",)}


def _exposed_ms(part: str, layout_id: str) -> list[dict[str, float]] | None:
    """Per rank: ms each collective kind ran with no computation beside it, of the profiled step."""
    ranks = sorted((RESULTS / part / "traces").glob(f"{layout_id}.rank_*.summary.json"))
    if not ranks:
        return None
    out = []
    for path in ranks:
        overlap = json.loads(path.read_text())["traces"][0]["overlap"]
        out.append({c["name"]: c["exposed_us"] / 1e3 for c in overlap["by_collective"]})
    return out


def rows() -> list[dict[str, Any]]:
    out = []
    for part, predicted_file in PARTS.items():
        before = {p["layout_id"]: p for p in json.loads((RESULTS / predicted_file).read_text())["layouts"]}
        for rec in read_records(RESULTS / part / "results.jsonl"):
            layout = Layout.from_record(rec)
            now = predict(layout, "H200")
            out.append(
                {
                    "part": part,
                    "layout_id": rec["layout_id"],
                    "label": rec["label"],
                    "connections": layout.process_max_connections or 1,
                    "profiled": layout.profile,
                    "predicted_before_step_s": before[rec["layout_id"]]["predicted"]["step_time_s"],
                    "predicted_now_step_s": now["step_time_s"],
                    "measured_step_s": rec["measured"]["step_time_s"],
                    "exposed_ms_by_rank": _exposed_ms(part, rec["layout_id"]),
                }
            )
    return out


def _kind_ms(row: dict[str, Any], kind: str) -> list[float]:
    return [sum(r.get(c, 0.0) for c in KINDS[kind]) for r in row["exposed_ms_by_rank"]]


def pairs(table: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The dense layouts at 1 and 8 connections, side by side (timed with timed, profiled with profiled, a repeat
    with its repeat)."""
    out = []
    for one in (r for r in table if r["part"] in ("dense", "blind") and r["connections"] == 1):
        stem = one["label"].replace("cdmc1", "cdmc8")
        eight = next(r for r in table if r["label"] == stem)
        kind = "tp" if " tp2 " in one["label"] else "cp"
        pair = {
            "part": one["part"],
            "label": one["label"].replace(" cdmc1", ""),
            "kind": kind,
            "measured_step_change_ms": (eight["measured_step_s"] - one["measured_step_s"]) * 1e3,
            "model_step_change_ms": (eight["predicted_now_step_s"] - one["predicted_now_step_s"]) * 1e3,
        }
        if one["profiled"]:
            pair["measured_exposed_change_ms_by_rank"] = [
                b - a for a, b in zip(_kind_ms(one, kind), _kind_ms(eight, kind), strict=True)
            ]
        out.append(pair)
    return out


def main() -> int:
    table = rows()
    report = {"schema_version": 1, "rows": table, "pairs": pairs(table)}
    (RESULTS / "report.json").write_text(json.dumps(report, indent=1) + "\n")
    for r in table:
        err = r["predicted_now_step_s"] / r["measured_step_s"] - 1
        print(f"{r['label']:40s} meas {r['measured_step_s'] * 1e3:7.1f} ms  model {err:+.1%}")
    for p in report["pairs"]:
        exposed = " / ".join(f"{x:+.1f}" for x in p.get("measured_exposed_change_ms_by_rank") or [])
        trace = f", exposed {p['kind']} {exposed} ms" if exposed else ""
        change = f"step {p['measured_step_change_ms']:+.1f} ms (model {p['model_step_change_ms']:+.1f})"
        print(f"{p['label']:40s} {change}{trace}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
