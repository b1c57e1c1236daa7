"""Grok-1's MoE block as one rank of dgxc's H100 layout runs it, on one H200, beside the cost model.

dgxc's Grok-1 proxies (tp 4 = etp 4, ep 2-8; `tests/fixtures/published_runs_modern.csv`) come out 10-15% faster in the
model than published once the all-to-all is counted as megatron-core moves it (docs/megatron_launches.md). At 8 GPUs
(tp 4, ep 2, one node) the step is 74% GEMM in the model, most of it the routed experts. One rank of that layout holds
4 of the 8 experts, each a quarter as wide (ffn 32768 / etp 4 = 8192), and takes 4096 x top-2 = 8192 routed rows
after the expert-TP gather: the testbench `moe` case of `validation/models/Grok1-tp4-ep2-local.json` at 4096 tokens
(ep 1, tp 1, balanced routing) runs that grouped GEMM, in bf16 and fp8 (delayed), and at 8192 tokens (GPU-bound:
the host floor no longer hides the GEMMs), beside Mixtral-8x7B's full block, which other hosts measured.

    python benchmarks/grok_moe_block.py predict    # before the run: results/grok_moe_block_h200/predicted.json
    bash benchmarks/testbench/h200_x1_grok_moe.sh   # on the GPU machine ($OUT/evidence -> results/grok_moe_block_h200)
    python benchmarks/grok_moe_block.py            # results/grok_moe_block_h200/comparison.json

The forward at 8192 tokens ran 21% over the model (9.72 vs 7.70 ms) where the backward came within 1.5%. A
torch-profiler trace of that case on another H200 (`PART=grok bash benchmarks/validation/x2_moe_r7.sh`, kept in
results/moe_r7_h200_x2/grok) shows why: the block's kernels keep the GPU busy for 6.9-7.0 ms of the forward, under the
model's 7.70, and the rest is the GPU waiting while the host issues the router and waits for the token counts before
the first expert GEMM, from the empty queue the testbench times it from. In a model that prologue overlaps the
previous layer's GPU work, so it says nothing of the published rows' gap (`profile` in comparison.json).
"""

from __future__ import annotations

import datetime as dt
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent
CASES = ROOT / "testbench/h200_x1_grok_moe_cases.json"
LEASE = ROOT / "results/grok_moe_block_h200"
PROFILE = ROOT / "results/moe_r7_h200_x2/grok"
GPU = "H200"


def predict() -> dict[str, Any]:
    from megatron_autotuner import __version__
    from megatron_autotuner.testbench.calibration import moe_block_prediction

    rows = [{"case": c, **moe_block_prediction(c, GPU)} for c in json.loads(CASES.read_text())]
    doc = {"gpu": GPU, "tool_version": __version__, "date": dt.datetime.now(dt.UTC).isoformat(), "rows": rows}
    LEASE.mkdir(parents=True, exist_ok=True)
    (LEASE / "predicted.json").write_text(json.dumps(doc, indent=1) + "\n")
    return doc


def report() -> dict[str, Any]:
    """Per case: the block's forward and backward predicted before the run and measured (CUDA events, median)."""
    from megatron_autotuner.testbench.results import all_records, latest_by_case

    predicted = json.loads((LEASE / "predicted.json").read_text())
    measured = {r["case_id"]: r for r in latest_by_case(all_records(LEASE / "testbench"), 0).values()
                if r["status"] == "ok"}  # fmt: skip
    rows = []
    for pred in predicted["rows"]:
        rec = measured.get(pred["case_id"])
        if rec is None:
            continue
        real = rec["real"]
        row = {"case_id": pred["case_id"], "precision": pred["case"].get("dtype", "bf16")}
        row |= {"tokens": pred["case"]["seq_length"], "block_gpu_fwd_ms": pred["block_gpu_fwd_ms"]}
        row |= {"block_gpu_bwd_ms": pred["block_gpu_bwd_ms"]}
        for phase in ("fwd", "bwd"):
            row[f"measured_{phase}_ms"] = real[f"{phase}_ms"]["median"]
            row[f"host_{phase}_ms"] = real[f"host_{phase}_ms"]["median"]
            row[f"predicted_{phase}_ms"] = pred[f"predicted_{phase}_ms"]
            row[f"error_{phase}"] = pred[f"predicted_{phase}_ms"] / real[f"{phase}_ms"]["median"] - 1
        rows.append(row)
    env = next(iter(measured.values()))["env"] if measured else {}
    doc = {"gpu": GPU, "env": env, "predicted_at": predicted["date"], "rows": rows, "profile": profile(predicted)}
    (LEASE / "comparison.json").write_text(json.dumps(doc, indent=1) + "\n")
    return doc


def profile(predicted: dict[str, Any]) -> dict[str, Any] | None:
    """The profiled 8192-token bf16 case: per phase, the GPU time its kernels kept the GPU busy (the union of their
    spans, median over the profiled iterations) beside the model's GPU time of the block."""
    from megatron_autotuner.trace.analysis import find_ranges
    from megatron_autotuner.trace.intervals import busy_time
    from megatron_autotuner.trace.loader import load_trace

    path = PROFILE / "traces/rank_0.json.gz"
    if not path.exists():
        return None
    trace = load_trace(path)
    (case,) = json.loads((ROOT / "testbench/h200_grok_moe_profile_cases.json").read_text())
    pred = next(p for p in predicted["rows"] if p["case"] == case)
    out: dict[str, Any] = {"case_id": pred["case_id"], "trace": str(path.relative_to(ROOT.parent))}
    for phase in ("fwd", "bwd"):
        busy_ms = sorted(busy_time([(s, e) for _, s, e in r.spans]) / 1e3 for r in find_ranges(trace, f"moe.{phase}"))
        out[f"gpu_busy_{phase}_ms"] = busy_ms[len(busy_ms) // 2]
        out[f"model_block_gpu_{phase}_ms"] = pred[f"block_gpu_{phase}_ms"]
    return out


def main(argv: list[str]) -> int:
    doc = predict() if argv[:1] == ["predict"] else report()
    for r in doc["rows"]:
        if "measured_fwd_ms" in r:
            print(f"{r['case_id']:<58} fwd {r['measured_fwd_ms']:7.2f} ms ({r['error_fwd']:+.1%})"
                  f"  bwd {r['measured_bwd_ms']:7.2f} ms ({r['error_bwd']:+.1%})")  # fmt: skip
        else:
            print(
                f"{r['case_id']:<58} predicted fwd {r['predicted_fwd_ms']:7.2f} ms  bwd {r['predicted_bwd_ms']:7.2f} ms"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
