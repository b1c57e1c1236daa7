"""Small dense models on one H100 or H200, eager and CUDA-graphed (#27): measured step times against the cost model.

Leases of nvidia-h100-x1 (folders of benchmarks/results/validation_h100_x1) and one of nvidia-h200
(validation_h200_x1/host_probe), each with a comparison.json written here:
- host_bound (benchmarks/validation/h100_x1_host_bound.sh; 19 of its 36 layouts finished inside the device call's
  600 s, its graphed training failed at capture): per layout
  - `pre_run_default`: the prediction written before the runs with the default floor of that day
    (predictions_default.json: per-layer max of host and GPU, floor 3.93 / 2.88 ms);
  - `pre_run_measured`: the prediction `mat validate` wrote before each run, with the floor measured on the
    machine just before (dense_host_floor.calibration.json, same per-layer model);
  - `now_default` / `now_measured`: the current model, computed after the runs: not predictions.
- graphed_training (h100_x1_small_models.sh graphed_training: the training layouts again, graphed ones
  capturing), host_diagnostics/profile (h100_x1_host_diagnostics.sh profile) and small_forward
  (h100_x1_small_models.sh small_forward, predicted with the launch-queue and no-grad host terms):
  `pre_run_default` is the prediction `mat validate` wrote before each run (default floor), `now_default` the
  current model.
- host_probe and host_probe_2 (h100_x1_host_probe.sh run / after / pin), and one lease of nvidia-h200,
  validation_h200_x1/host_probe (h200_x1_host_probe.sh run / layers; six of its layouts CUDA-graphed):
  `mat validate --measure-host-floor` with the floor measured in the model. `pre_run_default` from
  predicted_default_floor.json (`mat validate --dry-run`, before the lease), `pre_run_measured` what
  `mat validate` wrote before each run with the probes' floor, and per layout the host time its own layers took to
  issue (`host_fwd_ms` / `host_bwd_ms`, `Layout.host_timing`) beside the probes'.

    python benchmarks/host_bound.py [--check]
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VALIDATION = ROOT / "benchmarks/results/validation_h100_x1"
RESULTS = VALIDATION / "host_bound"
LATER_LEASES = ("graphed_training", "host_diagnostics/profile", "small_forward")
# probe leases, relative to benchmarks/results (each names its GPU preset in predicted_default_floor.json)
PROBE_LEASES = (
    "validation_h100_x1/host_probe",
    "validation_h100_x1/host_probe_2",
    "validation_h100_x1/host_probe_3",
    "validation_h200_x1/host_probe",
)
ERROR_KEYS = ("pre_run_default", "pre_run_measured", "now_default", "now_measured")


def _pre_run_default() -> dict[str, float]:
    """layout id -> step time predicted before the runs with the default floor (validate --dry-run lines)."""
    out = {}
    for line in (RESULTS / "predictions_default.json").read_text().splitlines():
        m = re.match(r".*\((\S+)\): predicted (\{.*)$", line)
        if m:
            out[m.group(1)] = json.loads(m.group(2))["step_time_s"]
    return out


def _rows(folder: Path, predictions: dict) -> list[dict]:
    """One row per layout of `folder`'s results.jsonl: status, measured step, and each named prediction
    (`name -> f(result row) -> seconds or None`) with its error."""
    rows = []
    for line in (folder / "results.jsonl").read_text().splitlines():
        r = json.loads(line)
        row = {
            "label": r["label"],
            "layout_id": r["layout_id"],
            "status": r["status"],
            "error": (r.get("error") or "")[:160] or None,
        }
        row |= {f"{name}_s": f(r) for name, f in predictions.items()}
        if r["status"] == "ok":
            meas = r["measured"]["step_time_s"]
            row["measured_s"] = meas
            for name in predictions:
                if row[f"{name}_s"] is not None:
                    row[f"{name}_error"] = row[f"{name}_s"] / meas - 1
            row["peak_memory_error"] = r["error_rel"]["peak_memory"]
        rows.append(row)
    return rows


def _today(calibration=None, key: str = "step_time_s", gpu: str = "H100-SXM"):
    """f(result row) -> today's prediction `key` (step time s, peak memory GiB) on `gpu`, with `calibration`."""
    sys.path.insert(0, str(ROOT / "src"))
    from megatron_autotuner.validate.layout import Layout
    from megatron_autotuner.validate.predict import predict

    def predicted(r: dict) -> float:
        gaf = r.get("gradient_accumulation_fusion", False)
        lay = Layout.from_dict(r["layout"])
        return predict(lay, gpu, calibration, gradient_accumulation_fusion=gaf)[key]

    return predicted


def compare() -> dict:
    sys.path.insert(0, str(ROOT / "src"))
    from megatron_autotuner.costmodel.calibration import calibration_from_dict
    from megatron_autotuner.testbench.calibration import dense_host_floors_from_records

    measured_doc = json.loads((RESULTS / "dense_host_floor.calibration.json").read_text())
    records = [
        json.loads(x)
        for x in (ROOT / "benchmarks/results/testbench_h100_x1/host_floor/collect/rank_0.jsonl")
        .read_text()
        .splitlines()
    ]
    floors = dense_host_floors_from_records([r for r in records if r.get("status") == "ok"])
    measured_now = calibration_from_dict(
        {k: v for k, v in measured_doc.items() if k != "dense_host_floor"} | {"dense_host_floor": floors}
    )
    default_pre = _pre_run_default()
    rows = _rows(
        RESULTS,
        {
            "pre_run_default": lambda r: default_pre.get(r["layout_id"]),
            "pre_run_measured": lambda r: r["predicted"]["step_time_s"],
            "now_default": _today(),
            "now_measured": _today(measured_now),
        },
    )
    return {"schema_version": 1, "source": str(RESULTS.relative_to(ROOT)), "measured_floor_now": floors, "rows": rows}


def compare_later(folder: str) -> dict:
    """A later lease's layouts: the prediction written before each run beside today's model."""
    predictions = {"pre_run_default": lambda r: r["predicted"]["step_time_s"], "now_default": _today()}
    return {
        "schema_version": 1,
        "source": str((VALIDATION / folder).relative_to(ROOT)),
        "rows": _rows(VALIDATION / folder, predictions),
    }


def _floor_ms(doc: dict) -> dict:
    """The bf16 dense floor of a host-floor calibration file, in ms."""
    (floor,) = [f for f in doc["dense_host_floor"] if f["precision"] == "bf16"]
    keys = ("fwd_s", "bwd_s", "fwd_no_grad_s", "microbatch_s", "step_s")
    return {k.removesuffix("_s") + "_ms": floor[k] * 1e3 for k in keys if k in floor}


def compare_probe(folder: str) -> dict:
    """A probe lease: both pre-run predictions, today's model with the probes' floor, and the in-model host times of
    every layout beside the probes'."""
    sys.path.insert(0, str(ROOT / "src"))
    from megatron_autotuner.costmodel.calibration import calibration_from_dict

    lease = ROOT / "benchmarks/results" / folder
    run = lease / "run"
    floor_doc = json.loads((run / "host_floor/host_floor.calibration.json").read_text())
    predicted_default = json.loads((lease / "predicted_default_floor.json").read_text())
    gpu = predicted_default["gpu"]
    default_pre = {e["layout_id"]: e["predicted"]["step_time_s"] for e in predicted_default["layouts"]}
    rows = _rows(
        run,
        {
            "pre_run_default": lambda r: default_pre.get(r["layout_id"]),
            "pre_run_measured": lambda r: r["predicted"]["step_time_s"],
            "now_default": _today(gpu=gpu),
            "now_measured": _today(calibration_from_dict(floor_doc), gpu=gpu),
        },
    )
    peak_now = _today(key="peak_memory_gib", gpu=gpu)
    extra: dict[str, dict] = {}
    for line in (run / "results.jsonl").read_text().splitlines():
        r = json.loads(line)
        measured = r.get("measured") or {}
        if measured.get("host_timing"):
            host = measured["host_timing"]
            extra[r["layout_id"]] = {"host_fwd_ms": host["fwd_ms"], "host_bwd_ms": host["bwd_ms"]}
        if r["status"] == "ok" and measured.get("peak_gib"):
            extra.setdefault(r["layout_id"], {})["peak_memory_error_now"] = peak_now(r) / measured["peak_gib"] - 1
    for row in rows:
        row |= extra.get(row["layout_id"], {})
    floors = {"run": _floor_ms(floor_doc)}
    after = lease / "after/host_floor/host_floor.calibration.json"
    if after.is_file():
        floors["after"] = _floor_ms(json.loads(after.read_text()))
    testbench = lease / "testbench/host_floor.calibration.json"
    if testbench.is_file():
        floors["testbench"] = _floor_ms(json.loads(testbench.read_text()))
    return {"schema_version": 1, "source": str(lease.relative_to(ROOT)), "gpu": gpu, "floors_ms": floors, "rows": rows}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="exit 1 when comparison.json is not what this makes now")
    args = parser.parse_args(argv)
    docs = {RESULTS: compare()} | {VALIDATION / f: compare_later(f) for f in LATER_LEASES}
    docs |= {ROOT / "benchmarks/results" / f: compare_probe(f) for f in PROBE_LEASES}
    stale = []
    for folder, doc in docs.items():
        text = json.dumps(doc, indent=1, default=float) + "\n"
        out = folder / "comparison.json"
        if args.check:
            if not out.is_file() or json.loads(out.read_text()) != json.loads(text):
                stale.append(str(out.relative_to(ROOT)))
            continue
        out.write_text(text)
        print(f"== {doc['source']}")
        for row in doc["rows"]:
            if row["status"] != "ok":
                print(f"{row['label']:34} {row['status']}: {row['error']}")
                continue
            errs = " ".join(f"{k} {row[k + '_error']:+.1%}" for k in ERROR_KEYS if k + "_error" in row)
            host = (
                f"  host/layer {row['host_fwd_ms']:.2f}/{row['host_bwd_ms'] or 0:.2f} ms"
                if "host_fwd_ms" in row
                else ""
            )
            print(
                f"{row['label']:34} measured {row['measured_s'] * 1e3:6.1f} ms  {errs}"
                f"  peak {row['peak_memory_error']:+.1%}{host}"
            )
        if "floors_ms" in doc:
            print(f"floors (ms): {doc['floors_ms']}")
    for out in stale:
        print(f"{out} is out of date: run python benchmarks/host_bound.py")
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
