"""How many GPU operations a MoE layer launches, and what waits in the launch queue of a padded MoE step.

    python benchmarks/moe_launches.py count TRACE...   # on the GPU machine: launches per profiled step, by thread
    python benchmarks/moe_launches.py                  # the report: results/moe_launches_h200/report.json

`costmodel.queued_frees` sizes the host's lead over the GPU by the operations a micro-batch launches
(`queued_frees.rank_launches`). A padded MoE step never waits for the token counts, so a GPU-paced one keeps CUDA's
launch queue full and the weight gradients freed within it wait for their stream event at the peak. The count per MoE
layer (`defaults.MOE_LAUNCHES_PER_LAYER`, `MOE_LAUNCHES_PER_LOCAL_EXPERT`) came from earlier profiled steps; this
round (`benchmarks/validation/h200_x1_moe_launches.sh`, predicted before the run with that count, `predicted.json`,
and with the dense layer's count it replaced, `predicted_dense_launches.json`) records the allocator histories of
padded steps (what awaited its event at the peak) and profiles two of them (their launches per layer pass).
"""

from __future__ import annotations

import gzip
import json
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks/results/moe_launches_h200"
GIB = 2**30
GPU_OPS = ("kernel", "gpu_memcpy", "gpu_memset")


def count_launches(path: str | Path) -> dict:
    """GPU operations (kernels, memcpys, memsets) launched inside the profiled `train_step` before the optimizer's
    step, by host thread: the forward runs on the main thread, the backward on autograd's (the busier one)."""
    with gzip.open(path) as f:
        events = json.load(f)["traceEvents"]
    on_gpu = {
        e["args"]["correlation"] for e in events if e.get("cat") in GPU_OPS and "correlation" in e.get("args", {})
    }
    marks = [e for e in events if e.get("cat") == "user_annotation"]
    start = min((e["ts"] for e in marks if e.get("name") == "train_step"), default=float("-inf"))
    end = min((e["ts"] for e in marks if str(e.get("name", "")).startswith("Optimizer.step")), default=float("inf"))
    by_thread = Counter(
        e["tid"]
        for e in events
        if e.get("cat") in ("cuda_runtime", "cuda_driver")
        and e.get("args", {}).get("correlation") in on_gpu
        and start <= e["ts"] < end
    )
    counts = sorted(by_thread.values(), reverse=True)
    return {"backward": counts[0] if counts else 0, "forward": sum(counts[1:]), "threads": len(counts)}


def _predicted(name: str) -> dict[str, dict]:
    return {row["layout_id"]: row["predicted"] for row in json.loads((RESULTS / name).read_text())["layouts"]}


def _history(layout_id: str) -> dict | None:
    """The replay of the layout's allocator history (`mat trace memory-history`), where it recorded one."""
    path = RESULTS / "memory" / layout_id / "rank_0.history.json"
    return json.loads(path.read_text()) if path.exists() else None


def layout_rows() -> list[dict]:
    """Per layout: the step and peak measured and predicted before the run with the MoE layer's launch count and
    with the dense layer's; the frees predicted awaiting their event at the peak, and, where the allocator history
    was recorded, what awaited and what the cache held free then."""
    now, dense = _predicted("predicted.json"), _predicted("predicted_dense_launches.json")
    rows = []
    for line in (RESULTS / "results.jsonl").open():
        run = json.loads(line)
        lid, measured = run["layout_id"], run["measured"]
        history = _history(lid)
        rows.append(
            {
                "label": run["label"],
                "layout_id": lid,
                "step_s": measured["step_time_s"],
                "pred_step_s": now[lid]["step_time_s"],
                "peak_gib": measured["peak_gib"],
                "allocated_gib": measured["max_allocated_gib"],
                "pred_peak_gib": now[lid]["peak_memory_gib"],
                "pred_peak_dense_launches_gib": dense[lid]["peak_memory_gib"],
                "pred_awaiting_gib": now[lid]["memory_breakdown_gib"]["queued_frees"],
                "pred_awaiting_dense_launches_gib": dense[lid]["memory_breakdown_gib"]["queued_frees"],
                "awaiting_at_peak_gib": history["awaiting_at_peak_bytes"] / GIB if history else None,
                "reserved_unallocated_at_peak_gib": (
                    history["reserved_unallocated_at_peak_bytes"] / GIB if history else None
                ),
            }
        )
    return rows


def launch_rows() -> list[dict]:
    """Per profiled layout: the launches of its profiled step per layer pass (layers x micro-batches) against
    `queued_frees.rank_launches` for its layers."""
    from megatron_autotuner.costmodel.queued_frees import rank_launches
    from megatron_autotuner.validate.layout import Layout

    counts = json.loads((RESULTS / "traces/launches.json").read_text())
    runs = {json.loads(line)["layout_id"]: json.loads(line) for line in (RESULTS / "results.jsonl").open()}
    rows = []
    for lid, count in counts.items():
        lay = Layout.from_record(runs[lid])
        model = lay.model_spec()
        passes = model.num_layers * runs[lid]["predicted"]["num_microbatches"]
        moe_layers = sum(1 for i in range(model.num_layers) if model.is_moe_layer(i))
        modelled = rank_launches(
            model.num_layers - moe_layers,
            moe_layers,
            tp_gt1=lay.tp > 1,
            local_experts=model.num_moe_experts // lay.ep,
            expert_bias=model.add_bias_linear,
            # as the run predicted itself
            gradient_accumulation_fusion=runs[lid]["predicted"]["assumed"]["gradient_accumulation_fusion"],
        )
        rows.append(
            {
                "label": runs[lid]["label"],
                "layer_passes": passes,
                "forward_per_pass": count["forward"] / passes,
                "backward_per_pass": count["backward"] / passes,
                "measured_per_pass": (count["forward"] + count["backward"]) / passes,
                "model_per_pass": modelled / model.num_layers,
            }
        )
    return rows


def build_report() -> dict:
    versions = (RESULTS / "versions.txt").read_text().strip()
    return {"gpu": (RESULTS / "gpus.txt").read_text().strip(), "versions": versions, "layouts": layout_rows(),
            "launches": launch_rows()}  # fmt: skip


def _gib(value: float | None) -> str:
    return "    -" if value is None else f"{value:5.2f}"


def main(argv: list[str]) -> int:
    if argv[:1] == ["count"]:
        print(json.dumps({Path(p).parent.name: count_launches(p) for p in argv[1:]}, indent=1))
        return 0
    if argv:
        raise SystemExit("usage: moe_launches.py [count TRACE...]")
    report = build_report()
    (RESULTS / "report.json").write_text(json.dumps(report, indent=1) + "\n")
    for row in report["layouts"]:
        print(
            f"{row['label']:42} peak {row['peak_gib']:6.2f} pred {row['pred_peak_gib']:6.2f} "
            f"({row['pred_peak_gib'] / row['peak_gib'] - 1:+.1%}; "
            f"dense count {row['pred_peak_dense_launches_gib']:6.2f}) "
            f"awaiting {_gib(row['awaiting_at_peak_gib'])} pred {row['pred_awaiting_gib']:5.2f} "
            f"(dense count {row['pred_awaiting_dense_launches_gib']:5.2f})"
        )
    for row in report["launches"]:
        print(
            f"{row['label']:42} launches a layer pass {row['measured_per_pass']:.0f}, model {row['model_per_pass']:.0f}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
