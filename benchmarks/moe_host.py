"""The eager MoE block's host time with and without TE's fused token permute, and where in the block it goes.

NVIDIA's MoE recipes run `--moe-permute-fusion` without a CUDA graph over the MoE block (the published Megatron-Bridge
GPT-OSS, Qwen3 and DeepSeek-V3 runs; `tests/fixtures/published_runs_modern.csv`). Until this measurement the cost
model held only megatron-core's unfused block to a host floor and priced a fused block at its GPU time alone. Both
paths still issue the router, the dispatcher's preprocess (with its device-to-host wait for the token counts), the
permute, the grouped expert GEMMs and the unpermute from Python, one MoE layer at a time.

The testbench's `moe` operator (`mat profile`, router + dispatcher + experts of one layer on one GPU, EP 1: the local
experts of an EP rank are stood in for by a copy of the model with that many experts; the host work grows per local
expert, the GPU work does not) runs the cases of `testbench/h200_x1_moe_host_cases.json`: Qwen3-30B-A3B shapes at 128 /
32 / 16 / 8 experts and gpt-oss-120b shapes at 128 / 16 / 4 experts, 1024 and 4096 tokens, fused; three unfused cases
beside them; fp8 (tensorwise) fused at two expert counts. Each case records its forward's host time per MoELayer step
(`testbench.operators.MOE_FORWARD_STEPS`): what CUDA graphs of scope moe_router / moe_preprocess take off the host.

    python benchmarks/moe_host.py predict      # before the run: results/moe_host_h200/predicted.json
    bash benchmarks/testbench/h200_x1_moe_host.sh   # on the GPU machine ($OUT/evidence -> results/moe_host_h200)
    python benchmarks/moe_host.py              # comparison and fitted floors: results/moe_host_h200/comparison.json

Then seven 2-layer training steps with the fused permute (`validation/h200_x1_moe_fused.sh`, results/moe_fused_h200):
gpt-oss-120b and Qwen3-30B-A3B shapes at 16 / 4 / 128 experts, micro-batch 1 and 4, one unfused. Three predictions
stand beside each measured step: the default model's before the session (predicted_default.json, committed before
the run), the run's own (`mat validate --calibration` with the floors the machine had measured minutes before), and
the cost model's now (default floors, no calibration; `steps` in comparison.json). Two of them were profiled again
(results/moe_fused_h200/profile): megatron-core's native fused cross-entropy took 7.5 ps per logit entry forward and
4.3 backward in both, what `defaults.CROSS_ENTROPY_BYTES["native"]` prices now.

Last, six steps with token dropping (`validation/h200_x1_moe_token_drop.sh`, results/moe_token_drop_h200; the default
model's predictions committed first): padded to capacity, the Qwen3 steps ran at their GPU time, 59-67% under the
host-bound prediction, since megatron-core's dispatcher then never waits for the token counts on the host
(`token_drop_steps` in comparison.json: "now" prices them so, after the fact).
"""

from __future__ import annotations

import datetime as dt
import json
import statistics
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent
REPO = ROOT.parent
CASES = ROOT / "testbench/h200_x1_moe_host_cases.json"
LEASE = ROOT / "results/moe_host_h200"
STEPS = ROOT / "results/moe_fused_h200"
TOKEN_DROP = ROOT / "results/moe_token_drop_h200"
GPU = "H200"


def _cases() -> list[dict[str, Any]]:
    return json.loads(CASES.read_text())


def predict() -> None:
    from megatron_autotuner import __version__
    from megatron_autotuner.testbench.calibration import moe_block_prediction

    rows = [{"case": c, **moe_block_prediction(c, GPU)} for c in _cases()]
    LEASE.mkdir(parents=True, exist_ok=True)
    doc = {"gpu": GPU, "tool_version": __version__, "date": dt.datetime.now(dt.UTC).isoformat(), "rows": rows}
    (LEASE / "predicted.json").write_text(json.dumps(doc, indent=1) + "\n")
    for r in rows:
        print(f"{r['case_id']:<58} gpu {r['block_gpu_fwd_ms']:6.2f} / {r['block_gpu_bwd_ms']:6.2f} ms"
              f"  predicted {r['predicted_fwd_ms']:6.2f} / {r['predicted_bwd_ms']:6.2f} ms")  # fmt: skip


def _measured() -> dict[str, dict[str, Any]]:
    from megatron_autotuner.testbench.results import all_records, latest_by_case

    records = all_records(LEASE / "testbench")
    return {r["case_id"]: r for r in latest_by_case(records, 0).values() if r["status"] == "ok"}


def _row(pred: dict[str, Any], rec: dict[str, Any]) -> dict[str, Any]:
    real = rec["real"]
    steps = real.get("host_fwd_steps_ms") or {}
    host_fwd = real["host_fwd_ms"]["median"]
    return {
        "case_id": pred["case_id"],
        "model": Path(pred["case"]["model"]).name.removesuffix(".json"),
        "tokens": pred["case"]["seq_length"],
        "precision": pred["case"].get("dtype", "bf16"),
        "permute_fusion": bool(pred["case"].get("moe_permute_fusion", False)),
        "local_experts": pred["local_experts"],
        "measured_fwd_ms": real["fwd_ms"]["median"],
        "measured_bwd_ms": real["bwd_ms"]["median"],
        "host_fwd_ms": host_fwd,
        "host_bwd_ms": real["host_bwd_ms"]["median"],
        "host_fwd_steps_ms": steps,
        "predicted_fwd_ms": pred["predicted_fwd_ms"],
        "predicted_bwd_ms": pred["predicted_bwd_ms"],
        "block_gpu_fwd_ms": pred["block_gpu_fwd_ms"],
        "block_gpu_bwd_ms": pred["block_gpu_bwd_ms"],
        "error_fwd": pred["predicted_fwd_ms"] / real["fwd_ms"]["median"] - 1,
        "error_bwd": pred["predicted_bwd_ms"] / real["bwd_ms"]["median"] - 1,
    }


def _median_errors(rows: list[dict[str, Any]]) -> dict[str, float]:
    """Median |error| of the predictions made before the run, forward and backward, per permute path."""
    out = {}
    for path, fused in (("fused", True), ("unfused", False)):
        errors = [abs(r[k]) for r in rows if r["permute_fusion"] == fused for k in ("error_fwd", "error_bwd")]
        if errors:
            out[path] = statistics.median(errors)
    return out


def training_steps(lease: Path = STEPS, predicted: str = "predicted_default.json") -> list[dict[str, Any]]:
    """A batch of 2-layer training steps: measured step and peak beside the predictions made before the run
    (`predicted`), by the run itself, and by the cost model now."""
    from megatron_autotuner.validate.layout import Layout
    from megatron_autotuner.validate.predict import estimate_layout

    before = {r["layout_id"]: r["predicted"] for r in json.loads((lease / predicted).read_text())["layouts"]}
    rows = []
    for line in (lease / "results.jsonl").read_text().splitlines():
        run = json.loads(line)
        if run.get("status") != "ok":
            continue
        measured = run["measured"]
        layout = Layout.from_dict(run["layout"])
        est = estimate_layout(layout, GPU, None, gradient_accumulation_fusion=False)
        now = {"step_time_s": est.step_time_s, "peak_memory_gib": est.peak_memory_gib}
        # the step the model gives less the GPU's wait on the (default) host: its GPU time
        now_gpu_s = est.step_time_s - est.time.breakdown["host_bound"]
        row = {
            "label": run["label"],
            "measured_step_s": measured["step_time_s"],
            "measured_peak_gib": measured["peak_gib"],
            "now_gpu_step_s": now_gpu_s,
            "now_gpu_step_error": now_gpu_s / measured["step_time_s"] - 1,
        }
        for name, pred in (("before", before[run["layout_id"]]), ("at_run", run["predicted"]), ("now", now)):
            row[f"{name}_step_s"] = pred["step_time_s"]
            row[f"{name}_peak_gib"] = pred["peak_memory_gib"]
            row[f"{name}_step_error"] = pred["step_time_s"] / measured["step_time_s"] - 1
            row[f"{name}_peak_error"] = pred["peak_memory_gib"] / measured["peak_gib"] - 1
        rows.append(row)
    return rows


def report() -> dict[str, Any]:
    from megatron_autotuner.testbench.calibration import moe_host_floors_from_records

    predicted = json.loads((LEASE / "predicted.json").read_text())
    measured = _measured()
    rows = [_row(p, measured[p["case_id"]]) for p in predicted["rows"] if p["case_id"] in measured]
    floors = moe_host_floors_from_records(list(measured.values()))
    env = next(iter(measured.values()))["env"] if measured else {}
    summary = {
        "gpu": GPU,
        "env": env,
        "predicted_at": predicted["date"],
        "cases": len(predicted["rows"]),
        "measured": len(rows),
        "rows": rows,
        "fitted_floors": [{k: v for k, v in f.items() if k != "cases"} for f in floors],
        "median_abs_error_before": _median_errors(rows),
        "steps": training_steps(),
        "token_drop_steps": training_steps(TOKEN_DROP, "predicted.json"),
    }
    (LEASE / "comparison.json").write_text(json.dumps(summary, indent=1) + "\n")
    return summary


def print_report(summary: dict[str, Any]) -> None:
    print(f"{'case':<44} {'path':<8} {'E':>4} {'fwd ms':>7} {'pred':>7} {'host':>6} {'bwd ms':>7} {'pred':>7}"
          f" {'router':>6} {'prep':>6}")  # fmt: skip
    for r in summary["rows"]:
        steps = r["host_fwd_steps_ms"]
        router = steps.get("route", 0.0) + steps.get("shared_experts_compute", 0.0)
        path = ("fused" if r["permute_fusion"] else "unfused") + ("/fp8" if r["precision"] == "fp8" else "")
        print(
            f"{r['model'] + ' s' + str(r['tokens']):<44} {path:<8} {r['local_experts']:>4} {r['measured_fwd_ms']:7.2f}"
            f" {r['predicted_fwd_ms']:7.2f} {r['host_fwd_ms']:6.2f} {r['measured_bwd_ms']:7.2f}"
            f" {r['predicted_bwd_ms']:7.2f} {router:6.2f} {steps.get('preprocess', 0.0):6.2f}"
        )
    for f in summary["fitted_floors"]:
        print(json.dumps(f))
    print(f"\n{'2-layer step':<34} {'meas s':>7} {'before':>8} {'at run':>8} {'now':>8} {'peak GiB':>9} {'now':>7}")
    for r in summary["steps"] + summary["token_drop_steps"]:
        print(
            f"{r['label']:<34} {r['measured_step_s']:7.3f} {r['before_step_error']:+8.1%}"
            f" {r['at_run_step_error']:+8.1%} {r['now_step_error']:+8.1%}"
            f" {r['measured_peak_gib']:9.2f} {r['now_peak_error']:+7.1%}"
        )


def main(argv: list[str]) -> int:
    if argv[:1] == ["predict"]:
        predict()
        return 0
    print_report(report())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
