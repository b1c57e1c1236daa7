"""NVIDIA's published recipes for the flagship models, given as Megatron-LM launches (tests/fixtures/launches), each
predicted as it is and against the best layout `mat plan --megatron-args` finds for the same model, GPUs, batch and
numerics; writes benchmarks/results/recipes_vs_best.json. An expert-tuned recipe far slower than the tool's pick
means the tool is wrong somewhere: the JSON keeps both time breakdowns to say where.

    python benchmarks/recipes_vs_best.py [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from megatron_autotuner import __version__
from megatron_autotuner.costmodel.estimate import CostOptions, estimate
from megatron_autotuner.search import plan
from megatron_autotuner.search.current import compare_with_best
from megatron_autotuner.specs import get_gpu_spec, load_model_spec
from megatron_autotuner.specs.megatron_args import launch_to_specs, read_launch_file

ROOT = Path(__file__).resolve().parents[1]
LAUNCHES = ROOT / "tests" / "fixtures" / "launches"
OUT = ROOT / "benchmarks" / "results" / "recipes_vs_best.json"
# (launch file, --model for what the flags leave out (Qwen's launch reads its vocabulary from the tokenizer))
RECIPES = [
    ("llama31_405b_h100_1024gpu_fp8cs.sh", None),
    ("deepseek_v3_h100_1024gpu.sh", None),
    ("qwen3_235b_a22b_h100_256gpu_fp8cs.sh", "Qwen3-235B-A22B"),
]


def compare(launch: str, base: str | None) -> dict:
    gpu = get_gpu_spec("H100-SXM")
    imported = launch_to_specs(read_launch_file(str(LAUNCHES / launch)), load_model_spec(base) if base else None)
    model, parallel, workload = imported.model, imported.parallel, imported.workload
    mine = estimate(model, parallel, workload, gpu, CostOptions(memory_margin=0.05, **imported.options))
    started = time.perf_counter()
    result = plan(
        model,
        gpu,
        parallel.num_gpus,
        workload.seq_length,
        workload.global_batch_size,
        precision=workload.precision,
        grad_reduce_in_fp32=parallel.grad_reduce_in_fp32,
        fp8_recipe=workload.fp8_recipe,
        fp8_param=workload.fp8_param,
        # every layout with the recipe's own run settings (fusions, MoE execution, TP overlap)
        options=CostOptions(memory_margin=0.05, **imported.options),
        tp_comm_overlap=parallel.tp_comm_overlap,
    )
    elapsed = time.perf_counter() - started
    run = compare_with_best(mine.with_notes((), imported.not_modelled), result.best.estimate, result.options)
    best = result.best.estimate
    return {
        "launch": f"tests/fixtures/launches/{launch}",
        "model": model.name if base else f"{model.num_layers} layers, hidden {model.hidden_size}",
        "num_gpus": parallel.num_gpus,
        "recipe_layout": f"tp{parallel.tp} pp{parallel.pp} vpp{parallel.vpp} cp{parallel.cp} ep{parallel.ep} "
        f"etp{parallel.etp} layout={parallel.pipeline_layout.describe() if parallel.pipeline_layout else 'even'}",
        "recipe_step_time_s": mine.step_time_s,
        "recipe_peak_memory_gib": mine.peak_memory_gib,
        "recipe_fits": mine.fits,
        "recipe_time_breakdown_s": mine.time.breakdown,
        "best_layout": result.best.label,
        "best_step_time_s": best.step_time_s,
        "best_time_breakdown_s": best.time.breakdown,
        "best_over_recipe_speedup": run.speedup,
        "within_10pct": run.speedup <= 1.10,
        "plan_s": elapsed,
        "flag_changes": [str(c) for c in run.changes],
        "not_modelled": list(imported.not_modelled),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    rows = [compare(launch, base) for launch, base in RECIPES]
    data = {"schema_version": 1, "tool_version": __version__, "date": time.strftime("%Y-%m-%d"), "gpu": "H100-SXM",
            "rows": rows}  # fmt: skip
    OUT.write_text(json.dumps(data, indent=1) + "\n")
    if args.json:
        print(json.dumps(data, indent=1))
        return 0
    for r in rows:
        gain = r["best_over_recipe_speedup"] - 1
        print(f"{r['launch'].split('/')[-1]:>40}: recipe {r['recipe_step_time_s']:.2f} s ({r['recipe_layout']}), "
              f"best {r['best_step_time_s']:.2f} s ({r['best_layout']}): best {gain:+.1%}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
