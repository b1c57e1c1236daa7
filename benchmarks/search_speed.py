"""Time `mat plan` on the flagship cases of NVIDIA's recipes, and `mat plan` / `mat rlhf` on RLHF steps of real
lengths up to the 65,536 sequences the tool accepts (each in a fresh process: no warm caches), and write
benchmarks/results/search_speed.json. Target: under 10 s each on the 2-core CI machine (aim: 2 s).

    python benchmarks/search_speed.py [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CASES = [
    # (model, GPUs, seq, global batch, precision): the cases of the flagship recipes
    ("Llama-3.1-405B", 1024, 8192, 512, "fp8"),
    ("DeepSeek-V3", 1024, 4096, 8192, "bf16"),
    ("Qwen3-235B-A22B", 256, 4096, 2048, "bf16"),
]
# (label, command after `mat`, stdin): verl's Qwen3-8B GRPO example at 1,024 and 8,192 prompts x 8 responses with
# mean lengths (512 of 1,024 prompt, 2,500 of 4,096 response tokens), and `mat plan` of a 65,536-sequence step
EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "verl_grpo_qwen3_8b_h100_8gpu.sh"
MEANS = ["--mean-prompt-len", "512", "--mean-response-len", "2500"]
RLHF_CASES = [
    (f"mat rlhf, {prompts} prompts x 8", ["rlhf", "--verl-args", "-", "--gpu", "H100-SXM", *MEANS, "--json"], prompts)
    for prompts in (1024, 8192)
] + [
    ("mat plan, 65536 sequences", ["plan", "--model", "Qwen3-8B", "--gpu", "H100-SXM", "--num-gpus", "8",
     "--global-batch-size", "65536", "--prompt-len", "512:1024", "--response-len", "2500:4096", "--json"], None),
]  # fmt: skip
# The largest inputs within the tool's limits that an audit of #39 timed (DeepSeek-V3 on 1,024 and 16,384 GPUs,
# Qwen3-235B-A22B on 256, with tens of thousands of packed sequences or a histogram of 8,000 lengths): legitimate
# work past 10 s, which `mat plan` / `mat rlhf` show as a progress bar on a terminal. Target: LARGE_TARGET_S.
DSV3_VERL = (Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "launches" / "real" / "verl"
             / "volcengine__verl__examples__grpo_trainer__run_deepseek671b_math_megatron_80gb.sh")  # fmt: skip
HISTOGRAM_8000 = {str(length): 1 for length in range(64, 64 + 8000)}  # 8,000 distinct lengths, one each
RANGES = ["--prompt-len", "512:1024", "--response-len", "2500:4096"]
LARGE_CASES = [
    ("mat plan DeepSeek-V3 x 1024, 8000-length histogram", ["plan", "--model", "DeepSeek-V3", "--gpu", "H100-SXM",
     "--num-gpus", "1024", "--global-batch-size", "8000", "--length-histogram", "{histogram}", "--json"], None),
    ("mat plan Qwen3-235B-A22B x 256, 2048 sequences", ["plan", "--model", "Qwen3-235B-A22B", "--gpu", "H100-SXM",
     "--num-gpus", "256", "--global-batch-size", "2048", *RANGES, "--json"], None),
    ("mat plan DeepSeek-V3 x 1024, 65536 sequences", ["plan", "--model", "DeepSeek-V3", "--gpu", "H100-SXM",
     "--num-gpus", "1024", "--global-batch-size", "65536", *RANGES, "--json"], None),
    ("mat plan DeepSeek-V3 x 16384, seq 4096", ["plan", "--model", "DeepSeek-V3", "--gpu", "H100-SXM",
     "--num-gpus", "16384", "--seq-len", "4096", "--global-batch-size", "16384", "--json"], None),
    ("mat rlhf DeepSeek-V3 verl example, 16384 prompts x 4", ["rlhf", "--verl-args", "-", "--gpu", "H100-SXM",
     "--json"], (DSV3_VERL, 16384)),
]  # fmt: skip
LARGE_TARGET_S = 30.0  # the bound the fuzz test holds every command to (tests/cli/test_fuzz.py)
OUT = Path(__file__).resolve().parent / "results" / "search_speed.json"

CHILD = """
import json, sys, time
t0 = time.perf_counter()
from megatron_autotuner.search import plan
from megatron_autotuner.specs import get_gpu_spec, load_model_spec
name, gpus, seq, gbs, precision = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
r = plan(load_model_spec(name), get_gpu_spec("H100-SXM"), gpus, seq, gbs, precision=precision)
b = r.best
print(json.dumps({"plan_s": r.elapsed_s, "process_s": time.perf_counter() - t0, "considered": r.considered,
                  "feasible": len(r.candidates), "best": b.label, "best_step_time_s": b.estimate.step_time_s,
                  "best_mfu": b.estimate.mfu}))
"""


def _child_env() -> dict[str, str]:
    """This environment with the checkout's src/ first on PYTHONPATH: a fresh process runs this tree's code."""
    src = str(Path(__file__).resolve().parents[1] / "src")
    return {**os.environ, "PYTHONPATH": os.pathsep.join([src, os.environ.get("PYTHONPATH", "")])}


def run_case(case: tuple) -> dict:
    name, gpus, seq, gbs, precision = case
    started = time.perf_counter()
    out = subprocess.run(
        [sys.executable, "-c", CHILD, name, str(gpus), str(seq), str(gbs), precision],
        capture_output=True, text=True, check=True, env=_child_env(),
    )  # fmt: skip
    row = json.loads(out.stdout.strip().splitlines()[-1])
    return {"model": name, "num_gpus": gpus, "seq_length": seq, "global_batch_size": gbs, "precision": precision,
            "wall_s": time.perf_counter() - started, **row}  # fmt: skip


def run_command(case: tuple, histogram: Path | None = None) -> dict:
    """One `mat` command in a fresh process: its wall time and exit code. `case[2]`: the prompts of the step (verl's
    Qwen3-8B example), or (launch file, prompts), fed on standard input."""
    label, args, prompts = case
    args = [histogram.as_posix() if a == "{histogram}" else a for a in args]
    text = None
    if prompts is not None:
        launch, prompts = prompts if isinstance(prompts, tuple) else (EXAMPLE, prompts)
        text = re.sub(r"data\.train_batch_size=\d+", f"data.train_batch_size={prompts}", launch.read_text())
    started = time.perf_counter()
    out = subprocess.run([sys.executable, "-m", "megatron_autotuner.cli", *args], input=text, capture_output=True,
                         text=True, env=_child_env())  # fmt: skip
    return {"command": label, "args": args, "exit_code": out.returncode, "wall_s": time.perf_counter() - started}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print the JSON")
    args = ap.parse_args()
    from megatron_autotuner import __version__

    rows = [run_case(c) for c in CASES]
    commands = [run_command(c) for c in RLHF_CASES]
    with tempfile.TemporaryDirectory() as tmp:
        histogram = Path(tmp) / "histogram_8000.json"
        histogram.write_text(json.dumps(HISTOGRAM_8000))
        large = [run_command(c, histogram) for c in LARGE_CASES]
    data = {
        "schema_version": 1,
        "tool_version": __version__,
        "date": time.strftime("%Y-%m-%d"),
        "machine": {"cpu_count": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()},
        "target_s": 10.0,
        "cases": rows,
        "commands": commands,
        "large_target_s": LARGE_TARGET_S,
        "large_commands": large,
    }
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(data, indent=1) + "\n")
    if args.json:
        print(json.dumps(data, indent=1))
    else:
        for r in rows:
            print(f"{r['model']:>16} x {r['num_gpus']:>4}: plan {r['plan_s']:.2f} s (process {r['process_s']:.2f} s), "
                  f"{r['considered']} layouts, best {r['best']} MFU {r['best_mfu']:.3f}")  # fmt: skip
        for c in commands + large:
            print(f"{c['command']:>56}: {c['wall_s']:.2f} s (exit {c['exit_code']})")
    ok = all(r["plan_s"] < data["target_s"] for r in rows)
    ok = ok and all(c["exit_code"] == 0 and c["wall_s"] < data["target_s"] for c in commands)
    return 0 if ok and all(c["exit_code"] == 0 and c["wall_s"] < LARGE_TARGET_S for c in large) else 1


if __name__ == "__main__":
    sys.exit(main())
