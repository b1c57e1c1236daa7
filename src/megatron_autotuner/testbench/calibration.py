"""Turn testbench results into a calibration file for the cost model (achieved TFLOP/s by op and shape).

Schema (kind "megatron-autotuner-calibration", schema_version 1):
{"gpu": preset name, "device_name", "date", "versions", "source": [result dirs],
 "ops": [{"op", "phase", "flops", "time_ms", "achieved_tflops", "tokens", "tp", "cp", "ep", "seq_length",
          "micro_batch_size", "model", "precision", shape keys}],
 "layers": [{"model", "num_gpus", "tp", "cp", "ep", "sequence_parallel", "seq_length", "micro_batch_size",
             "precision", "phase", "time_ms", "model_flops", "activation_bytes", "activation_estimated_bytes"}],
 "memory": {}}
`ops` names are the testbench operators: attention (norm + qkv + core attention + proj), mlp (norm + fc1
+ fc2), moe, decoder, lm_head; column_linear (GEMM h -> fc1 width) and row_linear (GEMM ffn -> h) are
written as op "gemm" with m/n/k (`testbench_op` keeps the name), so they calibrate the cost model's
GEMMs (`costmodel.calibration`).
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any

from .. import SCHEMA_VERSION, __version__
from ..errors import ConfigError
from ..specs import load_model_spec
from .results import all_records, latest_by_case

LINEAR_OPS = ("column_linear", "row_linear")


def calibration_from_records(records: list[dict[str, Any]], gpu: str | None = None) -> dict[str, Any]:
    ok = [r for r in latest_by_case(records, 0).values() if r.get("status") == "ok" and r.get("gpu_preset")]
    if gpu is not None:
        ok = [r for r in ok if r["gpu_preset"] == gpu]
    presets = sorted({r["gpu_preset"] for r in ok})
    if not ok:
        raise ConfigError("results", "no successful GPU results to calibrate from")
    if len(presets) > 1:
        raise ConfigError("gpu", f"results come from several GPUs ({', '.join(presets)}); pick one with --gpu")
    first = ok[0]
    ops: list[dict[str, Any]] = []
    layers: list[dict[str, Any]] = []
    for rec in ok:
        case, real, est = rec["case"], rec["real"], rec["estimated"]
        common = {k: case[k] for k in ("model", "tp", "cp", "ep", "seq_length", "micro_batch_size")}
        common["precision"] = case.get("dtype", "bf16")  # fp8 cases calibrate fp8 GEMMs, never bf16 ones
        for phase, key in (("fwd", "fwd_flops"), ("bwd", "bwd_flops"), ("fwd+bwd", "fwd_bwd_flops")):
            ms = real[f"{phase.replace('+', '_')}_ms"]["median"]
            if not est.get(key) or ms <= 0:
                continue
            entry = {
                # a TE linear layer is one GEMM per phase: it calibrates the cost model's GEMMs
                "op": "gemm" if case["op"] in LINEAR_OPS else case["op"],
                "testbench_op": case["op"],
                "phase": phase,
                "flops": est[key],
                "time_ms": ms,
                "achieved_tflops": est[key] / (ms * 1e-3) / 1e12,
                "tokens": est["tokens_per_rank"],
                **common,
            }
            if case["op"] in LINEAR_OPS:
                spec = load_model_spec(case["model"])
                gate = 2 if spec.gated_linear_unit else 1
                tokens = est["tokens_per_rank"]
                if case["op"] == "column_linear":
                    entry.update(m=tokens, n=gate * spec.ffn_hidden_size // case["tp"], k=spec.hidden_size)
                else:
                    entry.update(m=tokens, n=spec.hidden_size, k=spec.ffn_hidden_size // case["tp"])
            ops.append(entry)
        if case["op"] == "decoder":
            for phase, key in (("fwd", "fwd_flops"), ("fwd+bwd", "fwd_bwd_flops")):
                layers.append(
                    {
                        **common,
                        "num_gpus": rec["world_size"],
                        "sequence_parallel": case["sequence_parallel"],
                        "phase": phase,
                        "time_ms": real[f"{phase.replace('+', '_')}_ms"]["median"],
                        "model_flops": est[key],
                        "activation_bytes": real.get("activation_bytes"),
                        "activation_estimated_bytes": est.get("activation_bytes"),
                    }
                )
    env = first.get("env", {})
    return {
        "schema_version": SCHEMA_VERSION,
        "tool_version": __version__,
        "kind": "megatron-autotuner-calibration",
        "gpu": presets[0],
        "device_name": env.get("device"),
        "date": dt.datetime.now(dt.timezone.utc).date().isoformat(),
        "versions": {k: env.get(k) for k in ("torch", "megatron_core", "transformer_engine", "cuda", "nccl")},
        "ops": ops,
        "layers": layers,
        "memory": {},
    }


def write_calibration(result_dirs: list[str | Path], out_path: str | Path, gpu: str | None = None) -> dict[str, Any]:
    records: list[dict[str, Any]] = []
    for d in result_dirs:
        records.extend(all_records(Path(d)))
    calibration = calibration_from_records(records, gpu)
    calibration["source"] = [str(d) for d in result_dirs]
    Path(out_path).write_text(json.dumps(calibration, indent=1) + "\n")
    return calibration
