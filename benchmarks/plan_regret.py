"""Does `mat plan`'s first choice run fastest? The ranking benchmark of 4-GPU cases (dense and MoE, two sizes each).

    python benchmarks/plan_regret.py predict [--round r4]   # before a lease: the layouts and their predictions
    bash benchmarks/validation/x4_plan_regret.sh part1|part2   # on 4 GPUs (H100 or H200)
    python benchmarks/plan_regret.py report    # after it: regret, rank correlation, step / memory errors

`predict` plans each case under the assumptions the validate runner executes (`RUNNER_OPTIONS`: Megatron-LM's
unfused fp32 loss, no gradient-accumulation fusion without APEX, eager MoE, no TP-communication overlap, the host
floor), and keeps the plan's top `TOP_K` plus two lower-ranked layouts of other structures (tp pp vpp cp ep), for
H100-SXM and H200 (the kind lent decides which runs). It writes the layouts file the GPU script runs and the
predictions, made before the runs, beside it. The plan's numbers under its former defaults (TP overlap and fused
kernels assumed) are kept for each layout too, to show what the plan used to rank by.

`report` reads the runs (`benchmarks/results/plan_regret_<kind>/`): per case the regret (the measured step of the
plan's #1 over the best measured, minus 1), Spearman's rank correlation of predicted and measured steps, and each
layout's step and peak-memory error; writes benchmarks/results/plan_regret.json.
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from megatron_autotuner import __version__
from megatron_autotuner.costmodel.estimate import CostOptions, estimate
from megatron_autotuner.search import plan
from megatron_autotuner.specs import get_gpu_spec, load_model_spec
from megatron_autotuner.validate.agreement import spearman
from megatron_autotuner.validate.layout import Layout
from megatron_autotuner.validate.predict import predict

ROOT = Path(__file__).resolve().parents[1]
VALIDATION = ROOT / "benchmarks" / "validation"
RESULTS = ROOT / "benchmarks" / "results"
NUM_GPUS = 4
TOP_K = 4
LOWER = 2
WARMUP_STEPS = 3
STEPS = 4
GPUS = {"H100": "H100-SXM", "H200": "H200"}
# shapes chosen here (none is a case the plan was tuned on): two dense sizes, two MoE sizes
CASES: list[dict[str, Any]] = [
    {"case": "qwen3-4b", "model": "Qwen3-4B", "seq_length": 4096, "global_batch_size": 16},
    {"case": "llama31-8b", "model": "Llama-3.1-8B", "seq_length": 8192, "global_batch_size": 8},
    {
        "case": "qwen3-moe-e32-24l",
        "model": "benchmarks/validation/models/Qwen3-30B-A3B-E32.json",
        "num_layers": 24,
        "seq_length": 4096,
        "global_batch_size": 16,
    },
    {
        "case": "qwen3-moe-e64-12l",
        "model": "benchmarks/validation/models/Qwen3-30B-A3B-E64.json",
        "num_layers": 12,
        "seq_length": 4096,
        "global_batch_size": 32,
    },
]

# round 2, planned after the cost of hidden NCCL collectives (`defaults.NCCL_OVERLAP_COST`) was measured and charged:
# shapes none of the earlier runs had
CASES_R2: list[dict[str, Any]] = [
    {"case": "qwen3-8b-s4096", "model": "Qwen3-8B", "seq_length": 4096, "global_batch_size": 16},
    {
        "case": "qwen3-moe-e32-12l-s8192",
        "model": "benchmarks/validation/models/Qwen3-30B-A3B-E32.json",
        "num_layers": 12,
        "seq_length": 8192,
        "global_batch_size": 16,
    },
]
# round 3, planned after the MoE dispatcher's permute / unpermute kernels and the NVLink all-to-all / send-recv
# bandwidth were measured (benchmarks/moe_permute.py, nccl_sweep_fit.json): two MoE shapes no run had (few large
# experts at top-2; the full 128 experts at top-8) and a dense model of a larger hidden size
CASES_R3: list[dict[str, Any]] = [
    {"case": "mixtral-8l-s4096", "model": "Mixtral-8x7B", "num_layers": 8, "seq_length": 4096, "global_batch_size": 16},
    {
        "case": "qwen3-moe-e128-8l",
        "model": "Qwen3-30B-A3B",
        "num_layers": 8,
        "seq_length": 4096,
        "global_batch_size": 32,
    },
    {"case": "qwen3-32b-16l", "model": "Qwen3-32B", "num_layers": 16, "seq_length": 4096, "global_batch_size": 16},
]
# round 4, planned with PyTorch's expandable segments (PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True, which the
# runner sets for these layouts): under the default allocator the MoE peaks missed by up to 23% on reserved memory the
# allocator's request order decides (docs/accuracy.md, "MoE reserved memory"). Shapes no run had: a dense model of
# hidden size 8192 (Llama-3.1-70B's), Qwen3-235B-A22B's large experts (hidden 4096, 128 x 1536, top-8), and
# Mixtral-8x7B at seq 8192
CASES_R4: list[dict[str, Any]] = [
    {"case": "qwen3-235b-4l", "model": "Qwen3-235B-A22B", "num_layers": 4, "seq_length": 4096, "global_batch_size": 32},
    {"case": "llama31-70b-8l", "model": "Llama-3.1-70B", "num_layers": 8, "seq_length": 4096, "global_batch_size": 16},
    {"case": "mixtral-6l-s8192", "model": "Mixtral-8x7B", "num_layers": 6, "seq_length": 8192, "global_batch_size": 16},
]
# round 5, planned by the model as it stands after the expert-TP term, expandable segments and the pipeline
# queued-frees term, at full depth where a model fits: a dense model with q/k/v biases at seq 8192 (Qwen2.5-7B, whose
# lower-ranked picks include TP 4), a small dense model at seq 16384 (long-sequence CP and an uneven interleaved
# pipeline), the small-MoE shape the 4-GPU report of #37 found the plan's #1 8% slower than its #4 on (60 experts
# top-4 with a shared expert: Qwen1.5-MoE-A2.7B, all 24 layers), and a multi-latent-attention MoE with 64 experts
# top-6 and a dense first layer (Moonlight-16B-A3B, 8 layers)
CASES_R5: list[dict[str, Any]] = [
    {"case": "qwen25-7b-s8192", "model": "Qwen2.5-7B", "seq_length": 8192, "global_batch_size": 8},
    {"case": "qwen3-1.7b-s16384", "model": "Qwen3-1.7B", "seq_length": 16384, "global_batch_size": 8},
    {"case": "qwen15-moe-a2.7b", "model": "Qwen1.5-MoE-A2.7B", "seq_length": 4096, "global_batch_size": 32},
    {
        "case": "moonlight-8l",
        "model": "Moonlight-16B-A3B",
        "num_layers": 8,
        "seq_length": 4096,
        "global_batch_size": 32,
    },
]
# folder / layouts-file suffix of each round
ROUNDS: dict[str, list[dict[str, Any]]] = {
    "": CASES,
    "_r2": CASES_R2,
    "_r3": CASES_R3,
    "_r4": CASES_R4,
    "_r5": CASES_R5,
}
# run settings a round plans and runs under beside `runner_options`' (a layout carries them to the runner)
ROUND_OPTIONS: dict[str, dict[str, Any]] = {"_r4": {"expandable_segments": True}, "_r5": {"expandable_segments": True}}


def runner_options(suffix: str = "") -> CostOptions:
    """What the validate runner on the lease executes: the cost model's defaults (Megatron-LM's, `CostOptions`) without
    gradient-accumulation fusion, as APEX is absent there (every committed GPU record says
    gradient_accumulation_fusion false); `mat plan --validate` plans so on such a machine too. `suffix`: the round,
    whose `ROUND_OPTIONS` are added."""
    return CostOptions(gradient_accumulation_fusion=False, **ROUND_OPTIONS.get(suffix, {}))


def model_of(case: dict[str, Any]):
    spec = load_model_spec(str(ROOT / case["model"]) if case["model"].endswith(".json") else case["model"])
    return spec.with_num_layers(case["num_layers"]) if case.get("num_layers") else spec


def structure(layout: Layout) -> tuple:
    return (layout.tp, layout.pp, layout.vpp, layout.pipeline_layout, layout.cp, layout.ep)


def choose(case: dict[str, Any], gpu_name: str, options: CostOptions) -> list[dict[str, Any]]:
    """The plan's top K and LOWER lower-ranked layouts of structures not in the top K, each with its rank, the
    prediction the runner will be compared with, and the plan's number under its former defaults. `options`: what
    the plan assumes and the layouts carry to the runner (`runner_options`)."""
    gpu = get_gpu_spec(gpu_name)
    model = model_of(case)
    seq, gbs = case["seq_length"], case["global_batch_size"]
    result = plan(model, gpu, NUM_GPUS, seq, gbs, options=options, tp_comm_overlap=False)
    cands = list(result.candidates)

    def layout_of(c) -> Layout:
        return Layout.from_configs(
            case["model"],
            c.parallel,
            c.workload,
            num_layers=case.get("num_layers"),
            options=options,
            warmup_steps=WARMUP_STEPS,
            steps=STEPS,
            name=f"{case['case']} #{c.rank} {c.label}",
        )

    picked = [(c, layout_of(c)) for c in cands[:TOP_K]]
    seen = {structure(lay) for _, lay in picked}
    # lower-ranked: the best layout of a structure not yet picked, right after the top K and a tenth down the ranking
    for start in (TOP_K, len(cands) // 10):
        for c in cands[max(start, TOP_K) :]:
            lay = layout_of(c)
            if structure(lay) not in seen:
                picked.append((c, lay))
                seen.add(structure(lay))
                break
    # the plan's defaults before this benchmark (fused loss, MoE not held to its host floor, TP overlap with SP)
    former = CostOptions(fused_cross_entropy=True, moe_host_bound=False)
    rows = []
    for c, lay in picked:
        pred = predict(lay, gpu, gradient_accumulation_fusion=False)
        old = estimate(model, c.parallel.replace(tp_comm_overlap=c.parallel.sequence_parallel), c.workload, gpu, former)
        rows.append(
            {
                "case": case["case"],
                "rank": c.rank,
                "of": len(cands),
                "label": lay.label,
                "layout": lay.to_dict(),
                "plan_step_time_s": c.estimate.step_time_s,
                "plan_peak_memory_gib": c.estimate.peak_memory_gib,
                "predicted": pred,
                "former_plan_step_time_s": old.step_time_s,
            }
        )
    return rows


def cmd_predict(only: str | None = None) -> int:
    """Predict every round without runs (`only`: that round's suffix, e.g. "_r4", alone)."""
    for suffix, cases in ROUNDS.items():
        if only is not None and suffix != only:
            continue
        for kind, gpu_name in GPUS.items():
            folder = RESULTS / f"plan_regret_{kind.lower()}_x4{suffix}"
            if any(folder.glob("*/results.jsonl")):
                print(f"{folder.name}: runs exist, so its predictions made before them stay as they are")
                continue
            options = runner_options(suffix)
            rows = [row for case in cases for row in choose(case, gpu_name, options)]
            layouts = {"gpu": gpu_name, "layouts": [row["layout"] for row in rows]}
            path = VALIDATION / f"x4_plan_regret_{kind.lower()}{suffix}_layouts.json"
            path.write_text(json.dumps(layouts, indent=1) + "\n")
            doc = {
                "kind": "plan-regret-prediction",
                "tool_version": __version__,
                "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                "gpu": gpu_name,
                "num_gpus": NUM_GPUS,
                "assumptions": {k: v for k, v in options.__dict__.items() if isinstance(v, (bool, str, float))},
                "rows": rows,
            }
            folder.mkdir(parents=True, exist_ok=True)
            (folder / "predicted.json").write_text(json.dumps(doc, indent=1) + "\n")
            for row in rows:
                p = row["predicted"]
                print(
                    f"{kind} {row['case']:24s} #{row['rank']:<3d}/{row['of']:<4d} {row['label'][:60]:60s} "
                    f"{p.get('step_time_s', float('nan')):7.3f} s {p.get('peak_memory_gib', float('nan')):6.1f} GiB "
                    f"(plan {row['plan_step_time_s']:.3f}, former {row['former_plan_step_time_s']:.3f})"
                )
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=("predict", "report"))
    parser.add_argument("--round", choices=[s.lstrip("_") for s in ROUNDS if s], help="predict this round alone")
    args = parser.parse_args(argv)
    if args.command == "predict":
        return cmd_predict(None if args.round is None else f"_{args.round}")
    return cmd_report()


def _measured_rows(kind_dir: Path) -> dict[str, dict[str, Any]]:
    """The runs' comparison rows by layout label (every case folder's results.jsonl; the last row of a label wins,
    as `mat validate` appends a resumed layout's row again)."""
    rows: dict[str, dict[str, Any]] = {}
    for path in sorted(kind_dir.glob("*/results.jsonl")):
        for line in path.read_text().splitlines():
            row = json.loads(line)
            rows[row["label"]] = row
    return rows


def _rel(predicted: float | None, measured: float | None) -> float | None:
    return None if not predicted or not measured else predicted / measured - 1.0


def _predict_now(row: dict[str, Any], gpu: str) -> float | None:
    """Today's prediction of the row's layout (the runner's settings the layout stores)."""
    return predict(Layout.from_dict(row["layout"]), gpu).get("step_time_s")


def case_report(case: str, predicted_rows: list[dict[str, Any]], measured: dict[str, dict[str, Any]], gpu: str) -> dict:
    """Regret, rank correlation and per-layout errors of one case, against the predictions made before the runs."""
    layouts = []
    for row in predicted_rows:
        run = measured.get(row["label"], {})
        m = run.get("measured") or {}
        p = row["predicted"]
        now = _predict_now(row, gpu)
        layouts.append(
            {
                "rank": row["rank"],
                "label": row["label"],
                "status": run.get("status", "not run"),
                "predicted_step_time_s": p.get("step_time_s"),
                "measured_step_time_s": m.get("step_time_s"),
                "step_time_error": _rel(p.get("step_time_s"), m.get("step_time_s")),
                "predicted_peak_memory_gib": p.get("peak_memory_gib"),
                "measured_peak_memory_gib": m.get("peak_gib"),
                "peak_memory_error": _rel(p.get("peak_memory_gib"), m.get("peak_gib")),
                "former_plan_step_time_s": row["former_plan_step_time_s"],
                # today's model on the same layout, after the runs (the error above is the prediction made before)
                "predicted_step_time_s_now": now,
                "step_time_error_now": _rel(now, m.get("step_time_s")),
            }
        )
    ran = [lay for lay in layouts if lay["measured_step_time_s"]]
    out: dict[str, Any] = {"case": case, "layouts": layouts, "measured": len(ran), "planned": len(layouts)}
    if not ran:
        return out
    best = min(ran, key=lambda lay: lay["measured_step_time_s"])
    first = min(layouts, key=lambda lay: lay["rank"])
    out["measured_best"] = best["label"]
    out["plan_first"] = first["label"]
    if first["measured_step_time_s"]:
        out["regret"] = first["measured_step_time_s"] / best["measured_step_time_s"] - 1.0
    # today's model over the same measured layouts (after the runs, so not a blind test): its pick and that regret
    now_first = min(ran, key=lambda lay: lay["predicted_step_time_s_now"])
    out["model_now_first"] = now_first["label"]
    out["model_now_regret"] = now_first["measured_step_time_s"] / best["measured_step_time_s"] - 1.0
    out["spearman"] = spearman(
        [lay["predicted_step_time_s"] for lay in ran], [lay["measured_step_time_s"] for lay in ran]
    )
    # the former plan (TP overlap and fused kernels assumed, MoE not host-bound) over the same layouts
    out["former_plan_first"] = min(ran, key=lambda lay: lay["former_plan_step_time_s"])["label"]
    out["former_plan_regret"] = (
        min(ran, key=lambda lay: lay["former_plan_step_time_s"])["measured_step_time_s"] / best["measured_step_time_s"]
        - 1.0
    )
    return out


def lease_cases(predicted: dict[str, Any], measured: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """`case_report` of every case of one lease's predictions (predicted.json), in their order."""
    return [
        case_report(case, [r for r in predicted["rows"] if r["case"] == case], measured, predicted["gpu"])
        for case in dict.fromkeys(r["case"] for r in predicted["rows"])
    ]


def cmd_report() -> int:
    doc: dict[str, Any] = {"kind": "plan-regret", "tool_version": __version__, "leases": []}
    for kind_dir in sorted(RESULTS.glob("plan_regret_*_x4*")):
        predicted = json.loads((kind_dir / "predicted.json").read_text())
        measured = _measured_rows(kind_dir)
        if not measured:
            continue
        env = next(iter(measured.values())).get("env", {})
        cases = lease_cases(predicted, measured)
        doc["leases"].append(
            {
                "folder": kind_dir.name,
                "gpu": predicted["gpu"],
                "predicted_at": predicted["date"],
                "measured_on": env.get("device"),
                "measured_at": env.get("date"),
                "versions": {k: env.get(k) for k in ("torch", "megatron_core", "transformer_engine", "nccl")},
                "cases": cases,
            }
        )
    (RESULTS / "plan_regret.json").write_text(json.dumps(doc, indent=1) + "\n")
    for lease in doc["leases"]:
        print(f"{lease['folder']} ({lease['measured_on']}, predicted {lease['predicted_at']})")
        for c in lease["cases"]:
            errs = [lay["step_time_error"] for lay in c["layouts"] if lay["step_time_error"] is not None]
            mems = [lay["peak_memory_error"] for lay in c["layouts"] if lay["peak_memory_error"] is not None]
            print(
                f"  {c['case']:20s} regret {c.get('regret', float('nan')):+.1%}  spearman {c.get('spearman') or 0:+.2f}"
                f"  step err {min(errs):+.1%}..{max(errs):+.1%}  mem err {min(mems):+.1%}..{max(mems):+.1%}"
                f"  (former plan regret {c.get('former_plan_regret', float('nan')):+.1%})"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
