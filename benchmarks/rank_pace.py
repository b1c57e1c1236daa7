"""#40 on two H200s: is the slower rank's host pace the CPUs it runs on, and does the MoE floor differ per GPU?

    PART=run CAL=... bash benchmarks/validation/x2_rank_pace.sh   # host P: eager / graphed, unbound and NUMA-bound
    PART=floors bash benchmarks/validation/x2_rank_pace.sh        # host P: the MoE floor on GPU 0 and 1 at once
    PART=repeats CAL=... bash benchmarks/validation/x2_rank_pace.sh   # host Q: ten fresh-process repeats
    PART=floors OUT=... bash benchmarks/validation/x2_rank_pace.sh    # host Q: its floors (unpacked as repeats_floors)
    python benchmarks/rank_pace.py                                # this report, from what they left

Writes benchmarks/results/rank_pace_h200_x2/report.json: the host's CPU topology (from `lscpu` / `nvidia-smi topo -m`);
per layout the step predicted before the run (host M's floors, predicted.json), the measured median and range, where
each rank could run (`cpu_placement`) and what the binding did, and each rank's forward synchronisation spans
(`moe_graphs.forward_segments`: issuing and waiting per span); per mode the bound layout's step against the unbound
one; and per binding the MoE block's host floor at the layouts' 16 local experts measured on each GPU at once. Beside
them, the same eager and graphed layouts on the four earlier hosts (moe_graphs_h200_x2/report.json). For host Q's
repeats (each in a fresh process, every rank profiled after its timed steps; spans read on the GPU machine,
repeats/spans.json): per repeat the timed and profiled step and each rank's issue / wait per span, and per mode the
spread of the timed steps and of the slower rank's issue time, and how many repeats had one rank issue over
`GAP_RATIO` times slower than the other.
"""

from __future__ import annotations

import json
import re
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from moe_graphs import forward_segments  # noqa: E402 - the same span reading as the earlier hosts'

from megatron_autotuner.launch.records import read_records  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks/results/rank_pace_h200_x2"
EARLIER = ROOT / "benchmarks/results/moe_graphs_h200_x2/report.json"
LOCAL_EXPERTS = 16  # Qwen3-30B-A3B-E32 at ep 2
EAGER_STEM = "30B-A3B-E32 L4 ep2 eager"
GRAPHED_STEM = "30B-A3B-E32 L4 ep2 graphs attn+router+preprocess"
GAP_RATIO = 1.15  # a rank pace gap: the slower rank's mean issue time per span over the faster's


def topology(path: Path) -> dict[str, Any]:
    """Sockets, NUMA nodes and CPUs from `lscpu`, and each GPU's CPU affinity from `nvidia-smi topo -m`."""
    text = path.read_text()

    def field(name: str) -> int:
        return int(re.search(rf"^{re.escape(name)}:\s+(\d+)", text, re.M).group(1))

    gpus = {m.group(1): m.group(2) for m in re.finditer(r"^(GPU\d+)\s.*?\s(\d+-\d+)\s+\d+\s", text, re.M)}
    return {"cpus": field("CPU(s)"), "sockets": field("Socket(s)"), "numa_nodes": field("NUMA node(s)"),
            "gpu_cpu_affinity": gpus}  # fmt: skip


def layout_rows() -> list[dict[str, Any]]:
    folder = RESULTS / "run"
    before = {p["layout_id"]: p["predicted"] for p in json.loads((RESULTS / "predicted.json").read_text())["layouts"]}
    ranks = {}
    for path in sorted((folder / "runs").glob("rank_*.jsonl")):
        for rec in read_records(path):
            ranks.setdefault(rec["layout_id"], []).append(
                {"cpu_affinity": rec.get("cpu_affinity", "inherit"), **rec["cpu_placement"]}
            )
    out = []
    for rec in read_records(folder / "results.jsonl"):
        lid, m = rec["layout_id"], rec["measured"]
        traces = sorted((folder / "raw_traces").glob(f"{lid}.rank_*.json.gz"))
        out.append({
            "layout_id": lid,
            "label": rec["label"],
            "cpu_affinity": rec["layout"].get("cpu_affinity", "inherit"),
            "placement_by_rank": ranks[lid],
            "predicted_before_step_s": before[lid]["step_time_s"],
            "measured_step_s": m["step_time_s"],
            "measured_step_min_s": m["step_time_min_s"],
            "measured_step_max_s": m["step_time_max_s"],
            "forward_spans_by_rank": [forward_segments(t) for t in traces],
        })  # fmt: skip
    return out


def binding_changes(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per mode, the NUMA-bound layout's measured step against the unbound one's."""
    out = []
    for stem in (EAGER_STEM, GRAPHED_STEM):
        unbound = next(r for r in rows if r["label"] == f"{stem} unbound")
        bound = next(r for r in rows if r["label"] == f"{stem} gpu-numa-bound")
        out.append({"mode": "eager" if stem == EAGER_STEM else "graphed",
                    "unbound_step_s": unbound["measured_step_s"], "bound_step_s": bound["measured_step_s"],
                    "change": bound["measured_step_s"] / unbound["measured_step_s"] - 1.0})  # fmt: skip
    return out


def floors(part: str = "floors") -> list[dict[str, Any]]:
    """The MoE block's forward / backward host floor at `LOCAL_EXPERTS`, per binding and GPU (measured at once)."""
    out = []
    for binding in ("unbound", "bound"):
        for gpu_dir in sorted((RESULTS / part / binding).glob("gpu*")):
            floor = json.loads((gpu_dir / "host_floor.calibration.json").read_text())["moe_host_floor"][0]
            placement = json.loads((gpu_dir / "placement.json").read_text())
            out.append({
                "binding": binding,
                "gpu": int(gpu_dir.name.removeprefix("gpu")),
                "allowed_cpus": placement["allowed_cpus"],
                "numa_nodes": placement["numa_nodes"],
                "fwd_ms": (floor["fwd_s"] + LOCAL_EXPERTS * floor["fwd_per_local_expert_s"]) * 1e3,
                "bwd_ms": (floor["bwd_s"] + LOCAL_EXPERTS * floor["bwd_per_local_expert_s"]) * 1e3,
            })  # fmt: skip
    return out


def repeat_rows() -> list[dict[str, Any]]:
    """Host Q's fresh-process repeats: timed step (median of the timed steps), profiled step, each rank's spans."""
    folder = RESULTS / "repeats"
    spans = json.loads((folder / "spans.json").read_text())
    before = {
        p["layout_id"]: p["predicted"] for p in json.loads((RESULTS / "predicted_repeats.json").read_text())["layouts"]
    }
    out = []
    for rec in read_records(folder / "results.jsonl"):
        ranks = spans[rec["layout_id"]]
        issue = [r["mean_issue_ms"] for r in ranks]
        out.append({
            "label": rec["label"],
            "mode": "eager" if rec["label"].startswith(EAGER_STEM) else "graphed",
            "predicted_before_step_s": before[rec["layout_id"]]["step_time_s"],
            "measured_step_s": rec["measured"]["step_time_s"],
            "profiled_step_ms": ranks[0]["step_ms"],
            "spans_by_rank": [{k: r[k] for k in ("mean_issue_ms", "mean_wait_ms", "median_span_ms")} for r in ranks],
            "slower_issue_ms": max(issue),
            "rank_issue_ratio": max(issue) / min(issue),
        })  # fmt: skip
    return out


def repeat_spread(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per mode: the timed steps' range, the slower rank's issue time per span (mean and coefficient of variation over
    the processes), and the repeats with a rank pace gap (`GAP_RATIO`)."""
    out = []
    for mode in ("eager", "graphed"):
        group = [r for r in rows if r["mode"] == mode]
        steps = [r["measured_step_s"] for r in group]
        issue = [r["slower_issue_ms"] for r in group]
        out.append({
            "mode": mode,
            "repeats": len(group),
            "step_min_s": min(steps),
            "step_max_s": max(steps),
            "slower_issue_mean_ms": statistics.mean(issue),
            "slower_issue_cv": statistics.stdev(issue) / statistics.mean(issue),
            "repeats_with_gap": sum(r["rank_issue_ratio"] > GAP_RATIO for r in group),
        })  # fmt: skip
    return out


def own_floor_predictions(rows: list[dict[str, Any]], repeats: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Today's model of the eager and graphed layouts with each floor hosts P and Q measured (four processes each),
    beside the median of that host's measured steps of the mode (`rows`: host P's `layout_rows`, `repeats`: host Q's
    `repeat_rows`)."""
    from megatron_autotuner.costmodel.calibration import load_calibration
    from megatron_autotuner.validate.layout import load_layouts_file
    from megatron_autotuner.validate.predict import predict

    layouts, extra = load_layouts_file(ROOT / "benchmarks/validation/x2_rank_pace_layouts.json")
    by_mode = {"eager": layouts[0], "graphed": layouts[2]}  # the unbound ones (binding changed nothing)
    measured = {
        "P": {m: [r["measured_step_s"] for r in rows if r["label"].startswith(stem)]
              for m, stem in (("eager", EAGER_STEM), ("graphed", GRAPHED_STEM))},
        "Q": {m: [r["measured_step_s"] for r in repeats if r["mode"] == m] for m in by_mode},
    }  # fmt: skip
    out = []
    for host, part in (("P", "floors"), ("Q", "repeats_floors")):
        for floor_file in sorted((RESULTS / part).glob("*/gpu*/host_floor.calibration.json")):
            calibration = load_calibration(str(floor_file))
            for mode, layout in by_mode.items():
                out.append({
                    "host": host,
                    "floor": str(floor_file.relative_to(RESULTS)),
                    "mode": mode,
                    "predicted_step_s": predict(layout, extra["gpu"], calibration)["step_time_s"],
                    "measured_median_step_s": statistics.median(measured[host][mode]),
                })  # fmt: skip
    return out


def earlier_hosts() -> list[dict[str, Any]]:
    """The same eager and graphed layouts on the earlier hosts (measured step, rank 0's mean issue / wait per span)."""
    rows = json.loads(EARLIER.read_text())["rows"]
    keep = [r for r in rows if r["label"].startswith((EAGER_STEM, GRAPHED_STEM)) and "mbs4" not in r["label"]]
    keep = [r for r in keep if r["label"].startswith(EAGER_STEM) or "router" in r["label"]]
    return [{"host": r["host"], "label": r["label"], "measured_step_s": r["measured_step_s"],
             "spans_by_rank": [{k: t[k] for k in ("mean_issue_ms", "mean_wait_ms")}
                               for t in r.get("traces_by_rank") or ([r["trace"]] if r.get("trace") else [])]}
            for r in keep]  # fmt: skip


def main() -> int:
    rows = layout_rows()
    report = {
        "schema_version": 1,
        "gpu": "H200",
        "host": "P",
        "topology": topology(RESULTS / "floors/topology.txt"),
        "rows": rows,
        "binding_changes": binding_changes(rows),
        "floors_at_16_local_experts": floors(),
        "earlier_hosts": earlier_hosts(),
        "repeats_host": "Q",
        "repeats_topology": topology(RESULTS / "repeats_floors/topology.txt"),
        "repeats": repeat_rows(),
        "repeats_floors_at_16_local_experts": floors("repeats_floors"),
    }
    report["repeat_spread"] = repeat_spread(report["repeats"])
    report["own_floor_predictions"] = own_floor_predictions(rows, report["repeats"])
    (RESULTS / "report.json").write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps(report["topology"]))
    for r in rows:
        spans = ", ".join(f"{s['mean_issue_ms']:.1f}/{s['mean_wait_ms']:.1f}" for s in r["forward_spans_by_rank"])
        print(f"{r['label']:66s} {r['measured_step_s'] * 1e3:6.1f} ms  issue/wait per span by rank: {spans}")
    for c in report["binding_changes"]:
        print(f"{c['mode']}: bound {c['change']:+.1%}")
    for f in report["floors_at_16_local_experts"]:
        print(f"{f['binding']} gpu{f['gpu']}: fwd {f['fwd_ms']:.2f} ms, bwd {f['bwd_ms']:.2f} ms")
    for r in report["repeats"]:
        spans = ", ".join(f"{s['mean_issue_ms']:.1f}/{s['mean_wait_ms']:.1f}" for s in r["spans_by_rank"])
        print(f"Q {r['label']:58s} {r['measured_step_s'] * 1e3:6.1f} ms (profiled {r['profiled_step_ms']:.0f}) {spans}")
    for m in report["repeat_spread"]:
        print(json.dumps(m))
    for o in report["own_floor_predictions"]:
        err = o["predicted_step_s"] / o["measured_median_step_s"] - 1
        print(f"{o['host']} {o['floor']:45s} {o['mode']:8s} {o['predicted_step_s'] * 1e3:6.1f} ms  {err:+.1%}")
    for e in report["earlier_hosts"]:
        print(f"{e['host']} {e['label']:50s} {e['measured_step_s'] * 1e3:6.1f} ms {e['spans_by_rank']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
