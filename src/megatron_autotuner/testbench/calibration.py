"""Turn testbench results into a calibration file for the cost model (achieved TFLOP/s by op and shape).

Schema (kind "megatron-autotuner-calibration", schema_version 1):
{"gpu": preset name, "device_name", "date", "versions", "source": [result dirs],
 "ops": [{"op", "phase", "flops", "time_ms", "achieved_tflops", "tokens", "tp", "cp", "ep", "seq_length",
          "micro_batch_size", "model", "precision", shape keys}],
 "layers": [{"model", "num_gpus", "tp", "cp", "ep", "sequence_parallel", "seq_length", "micro_batch_size",
             "precision", "phase", "time_ms", "model_flops", "activation_bytes", "activation_estimated_bytes"}],
 "memory": {}}
fp8 `ops` and `layers` come from delayed-scaling cases only (the cost model adds other recipes' costs itself).
`moe_host_floor` (a list, one entry per precision and fp8 recipe): the host time of an eager MoE block on this
machine, from the `moe` cases that are host-bound (`moe_host_floors_from_records`).
`ops` names are the testbench operators: attention (norm + qkv + core attention + proj), mlp (norm + fc1
+ fc2), moe, decoder, lm_head; column_linear (GEMM h -> fc1 width) and row_linear (GEMM ffn -> h) are
written as op "gemm" with m/n/k (`testbench_op` keeps the name), so they calibrate the cost model's
GEMMs (`costmodel.calibration`).
"""

from __future__ import annotations

import datetime as dt
import json
import statistics
from pathlib import Path
from typing import Any

from .. import SCHEMA_VERSION, __version__
from ..costmodel.calibration import precision_fields
from ..errors import ConfigError
from ..files import write_text_atomic
from ..specs import ClusterSpec, get_gpu_spec, load_model_spec
from .results import all_records, latest_by_case

LINEAR_OPS = ("column_linear", "row_linear")
# A `moe` case counts as host-bound when both phases took at least this many times the cost model's GPU time of the
# MoE block it ran (router, its permute path's dispatcher kernels, experts: `LayerCost.moe_gpu_*_s`).
HOST_BOUND_RATIO = 1.5


def layer_context_of(rec: dict[str, Any]):
    """The cost model's `LayerContext` of a testbench record measured on a GPU preset: its TP / CP / EP split,
    tokens, precision and the SwiGLU fusion its layer was built with."""
    from ..costmodel.layer import LayerContext

    case = rec["case"]
    return LayerContext(
        cluster=ClusterSpec(get_gpu_spec(rec["gpu_preset"]), rec["world_size"]),
        tp=case["tp"],
        sequence_parallel=case["sequence_parallel"],
        cp=case["cp"],
        ep=case["ep"],
        etp=case["etp"],
        tokens=case["micro_batch_size"] * case["seq_length"] / case["cp"],
        seq_length=case["seq_length"],
        precision=case.get("dtype", "bf16"),
        fp8_recipe=case.get("fp8_recipe", "delayed"),
        fused_bias_activation=rec.get("bias_activation_fusion", True),
        moe_permute_fusion=bool(case.get("moe_permute_fusion", False)),
    )


def predicted_phases_ms(rec: dict[str, Any]) -> dict[str, Any] | None:
    """The cost model beside a dense `decoder` record, each phase timed from an empty launch queue as the testbench
    times it (`costmodel.layer.empty_queue_forward_s`; the backward the longer of GPU and host time), with the
    host time the record measured (`host_*_ms`), else the default floor. None for other ops, MoE models and records
    without a GPU preset."""
    from ..costmodel.layer import empty_queue_phases_s

    case = rec.get("case") or {}
    if rec.get("status") != "ok" or case.get("op") != "decoder" or not rec.get("gpu_preset"):
        return None
    spec = load_model_spec(case["model"])
    if spec.is_moe_layer(0):
        return None
    real = rec["real"]
    measured = "host_fwd_ms" in real and "host_bwd_ms" in real
    host = tuple(real[f"host_{phase}_ms"]["median"] * 1e-3 for phase in ("fwd", "bwd")) if measured else None
    fwd, bwd = (t * 1e3 for t in empty_queue_phases_s(spec, 0, layer_context_of(rec), host))
    return {
        "predicted_fwd_ms": fwd,
        "predicted_bwd_ms": bwd,
        "predicted_fwd_bwd_ms": fwd + bwd,
        "predicted_host": "measured" if measured else "default floor",
    }


def moe_block_prediction(case: dict[str, Any], gpu: str) -> dict[str, Any]:
    """The cost model's MoE block of a testbench `moe` case on one `gpu` (a preset), before it runs: the block's GPU
    time, the host floor of its permute path (`costmodel.layer.moe_block_host_s`) and the time it predicts for the
    block, the longer of the two, forward and backward (ms)."""
    from ..costmodel.layer import layer_cost, moe_block_host_s
    from .cases import Case

    built = Case.from_dict(case)
    rec = {"case": built.to_dict(), "gpu_preset": gpu, "world_size": built.world_size}
    ctx = layer_context_of(rec)
    spec = built.model_spec()
    cost = layer_cost(spec, built.layer_index(spec), ctx)
    host_fwd, host_bwd = moe_block_host_s(spec, ctx)
    return {
        "case_id": built.case_id,
        "local_experts": spec.num_moe_experts // built.ep,
        "block_gpu_fwd_ms": cost.moe_gpu_fwd_s * 1e3,
        "block_gpu_bwd_ms": cost.moe_gpu_bwd_s * 1e3,
        "host_floor_fwd_ms": host_fwd * 1e3,
        "host_floor_bwd_ms": host_bwd * 1e3,
        "predicted_fwd_ms": max(cost.moe_gpu_fwd_s, host_fwd) * 1e3,
        "predicted_bwd_ms": max(cost.moe_gpu_bwd_s, host_bwd) * 1e3,
    }


def _moe_point(rec: dict[str, Any]) -> dict[str, Any]:
    """One `moe` case: measured fwd / bwd, its local experts, and the GPU time the cost model gives its layer."""
    from ..costmodel.layer import layer_cost

    case = rec["case"]
    spec = load_model_spec(case["model"])
    ctx = layer_context_of(rec)
    layer = next(i for i in range(spec.num_layers) if spec.is_moe_layer(i))
    gpu = layer_cost(spec, layer, ctx)
    real = rec["real"]
    fwd_ms, bwd_ms = real["fwd_ms"]["median"], real["bwd_ms"]["median"]
    steps = real.get("host_fwd_steps_ms") or {}
    host_fwd = (real.get("host_fwd_ms") or {}).get("median")
    return {
        "case_id": rec["case_id"],
        "local_experts": spec.num_moe_experts // case["ep"],
        "fwd_ms": fwd_ms,
        "bwd_ms": bwd_ms,
        # shares of the forward's host time in the steps CUDA-graph scopes capture (None: steps not timed)
        "router_share": _step_share(steps, MOE_ROUTER_STEPS, host_fwd),
        "preprocess_share": _step_share(steps, MOE_PREPROCESS_STEPS, host_fwd),
        "layer_gpu_fwd_ms": gpu.fwd.total * 1e3,
        "layer_gpu_bwd_ms": gpu.bwd.total * 1e3,
        "block_gpu_fwd_ms": gpu.moe_gpu_fwd_s * 1e3,
        "block_gpu_bwd_ms": gpu.moe_gpu_bwd_s * 1e3,
        "host_bound": fwd_ms >= HOST_BOUND_RATIO * gpu.moe_gpu_fwd_s * 1e3
        and bwd_ms >= HOST_BOUND_RATIO * gpu.moe_gpu_bwd_s * 1e3,
    }


# the MoE forward steps (`testbench.operators.MOE_FORWARD_STEPS`) under --cuda-graph-modules moe_router (the router and
# the shared experts) and, added to it, moe_preprocess (megatron-core transformer_layer.py `_get_submodules_under_
# cudagraphs`, moe_layer.py: a partial capture returns after `preprocess`)
MOE_ROUTER_STEPS = ("shared_experts_compute", "route")
MOE_PREPROCESS_STEPS = ("preprocess",)


def _step_share(steps: dict[str, float], names: tuple[str, ...], host_fwd_ms: float | None) -> float | None:
    if not steps or not host_fwd_ms:
        return None
    return min(1.0, sum(steps.get(name, 0.0) for name in names) / host_fwd_ms)


def _host_line(experts: list[int], seconds: list[float], default_line) -> tuple[float, float, str]:
    """(intercept, slope per local expert, how): least squares with two or more expert counts (slope >= 0),
    else `default_line(E) = (intercept, slope)` scaled to the one count measured."""
    if len(set(experts)) >= 2:
        slope, intercept = statistics.linear_regression(experts, seconds)
        if slope < 0:
            return statistics.mean(seconds), 0.0, "flat: the least-squares line fell with more experts"
        if intercept < 0:  # no negative host time: the least-squares line through the origin
            slope = sum(x * y for x, y in zip(experts, seconds, strict=True)) / sum(x * x for x in experts)
            return 0.0, slope, "least squares in local experts, through the origin"
        return intercept, slope, "least squares in local experts"
    intercept, slope = default_line
    if intercept + slope * experts[0] <= 0:
        return statistics.median(seconds), 0.0, "flat: one expert count measured, no default line"
    scale = statistics.median(seconds) / (intercept + slope * experts[0])
    return intercept * scale, slope * scale, "default line scaled to the one expert count measured"


def _precision_key(case: dict[str, Any]) -> tuple[str, str | None]:
    """(precision, fp8 recipe or None) of a testbench case: what a host floor is measured per."""
    dtype = case.get("dtype", "bf16")
    return (dtype, case.get("fp8_recipe", "delayed") if dtype == "fp8" else None)


def _shares(points: list[dict[str, Any]]) -> dict[str, float]:
    """The median router and preprocess shares of the host-bound points that timed their steps; none: the
    defaults (`MoeHostFloor`)."""
    out = {}
    for key in ("router_share", "preprocess_share"):
        values = [p[key] for p in points if p.get(key) is not None]
        if values:
            out[key] = statistics.median(values)
    return out


def moe_host_floors_from_records(ok: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The eager MoE block's host floor per precision from host-bound `moe` cases (`costmodel.MoeHostFloor`):
    forward and backward each a line in the local experts (each local expert adds its own kernels), fitted by
    least squares when the cases hold two or more expert counts, else the default line scaled to the one count
    measured. Cases that are not host-bound (GPU work near the measured time) say nothing about the host and
    are left out."""
    from ..costmodel.calibration import DEFAULT_FUSED_MOE_HOST_FLOOR
    from ..costmodel.calibration import DEFAULT_MOE_HOST_FLOOR as default

    points: dict[tuple[str, str | None, bool], list[dict[str, Any]]] = {}
    for rec in ok:
        case = rec["case"]
        if case["op"] == "moe":
            key = (*_precision_key(case), bool(case.get("moe_permute_fusion", False)))
            points.setdefault(key, []).append(_moe_point(rec))
    floors = []
    for (precision, recipe, fused), pts in sorted(points.items(), key=lambda kv: (kv[0][0], kv[0][1] or "", kv[0][2])):
        used = [p for p in pts if p["host_bound"]]
        if not used:
            continue
        line = DEFAULT_FUSED_MOE_HOST_FLOOR if fused else default
        experts = [p["local_experts"] for p in used]
        fwd = _host_line(experts, [p["fwd_ms"] * 1e-3 for p in used], (line.fwd_s, line.fwd_per_local_expert_s))
        bwd = _host_line(experts, [p["bwd_ms"] * 1e-3 for p in used], (line.bwd_s, line.bwd_per_local_expert_s))
        floors.append(
            {
                **precision_fields(precision, recipe),
                "permute_fusion": fused,
                "fwd_s": fwd[0],
                "fwd_per_local_expert_s": fwd[1],
                "bwd_s": bwd[0],
                "bwd_per_local_expert_s": bwd[1],
                **_shares(used),
                "fit": {"fwd": fwd[2], "bwd": bwd[2]},
                "cases": pts,
            }
        )
    return floors


# the CUDA-event time of a host-bound phase exceeds the host's call by the last kernels' run (about 1-2% on the
# H100 lease's Qwen3-0.6B decoder at micro-batch 1)
HOST_BOUND_EVENT_RATIO = 1.05


def _floor_ms(cases: list[dict[str, Any]], phase: str) -> float:
    bound = [c for c in cases if c[f"gpu_event_{phase}_ms"] <= HOST_BOUND_EVENT_RATIO * c[f"host_{phase}_ms"]]
    return statistics.median(c[f"host_{phase}_ms"] for c in (bound or cases))


def dense_host_floors_from_records(ok: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The eager dense layer's host floor (`costmodel.DenseHostFloor`) per precision, fp8 recipe and TP size: the
    median over the host-bound dense `decoder` cases of the wall time of their forward and backward calls
    (`testbench.measure`: host_fwd_ms / host_bwd_ms, each a median over the case's timed iterations). A phase is
    host-bound when its CUDA-event time is within `HOST_BOUND_EVENT_RATIO` of the host's: the GPU waited on the
    host. Where the GPU is busy the host's calls run slower (4.8 vs 3.9 ms forward for Qwen3-4B at micro-batch 4 vs
    1 on an H100 lease), and there the host does not set the pace, so those phases are left out (the MoE floor
    does the same). Phases with no host-bound case use every case. `cases` keeps them all."""
    groups: dict[tuple[str, str | None, int, bool], list[dict[str, Any]]] = {}
    for rec in ok:
        case, real = rec["case"], rec.get("real") or {}
        if case["op"] != "decoder" or "host_fwd_ms" not in real or case.get("max_token_len"):
            continue
        if load_model_spec(case["model"]).is_moe:
            continue
        key = (*_precision_key(case), case["tp"], bool(case.get("sequence_parallel")))
        groups.setdefault(key, []).append(
            {
                "case_id": rec["case_id"],
                "host_fwd_ms": real["host_fwd_ms"]["median"],
                "host_bwd_ms": real["host_bwd_ms"]["median"],
                "gpu_event_fwd_ms": real["fwd_ms"]["median"],
                "gpu_event_bwd_ms": real["bwd_ms"]["median"],
            }
            | (
                {
                    "host_fwd_no_grad_ms": real["host_fwd_no_grad_ms"]["median"],
                    "gpu_event_fwd_no_grad_ms": real["fwd_no_grad_ms"]["median"],
                }
                if "host_fwd_no_grad_ms" in real
                else {}
            )
        )
    floors = []
    for (precision, recipe, tp, sp), cases in sorted(
        groups.items(), key=lambda kv: (kv[0][0], kv[0][1] or "", kv[0][2])
    ):
        floors.append(
            {
                **precision_fields(precision, recipe),
                "tp": tp,
                "sequence_parallel": sp,
                "fwd_s": _floor_ms(cases, "fwd") * 1e-3,
                "bwd_s": _floor_ms(cases, "bwd") * 1e-3,
                "cases": cases,
            }
        )
        no_grad = [c for c in cases if "host_fwd_no_grad_ms" in c]
        if no_grad:
            floors[-1]["fwd_no_grad_s"] = _floor_ms(no_grad, "fwd_no_grad") * 1e-3
    return floors


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
        if case.get("fp8_recipe", "delayed") != "delayed":
            # fp8 ops and layers calibrate the per-tensor fp8 GEMMs, on which the cost model adds each recipe's
            # own cost (`defaults.FP8_GEMM_TIME_FACTOR`, `FP8_CAST_*`): a tensorwise or blockwise case would count
            # its recipe twice. Such cases still give the MoE host floor of their recipe (below).
            continue
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
        "moe_host_floor": moe_host_floors_from_records(ok),
        "dense_host_floor": dense_host_floors_from_records(ok),
    }


def write_calibration(result_dirs: list[str | Path], out_path: str | Path, gpu: str | None = None) -> dict[str, Any]:
    records: list[dict[str, Any]] = []
    for d in result_dirs:
        records.extend(all_records(Path(d)))
    calibration = calibration_from_records(records, gpu)
    calibration["source"] = [str(d) for d in result_dirs]
    write_text_atomic(Path(out_path), json.dumps(calibration, indent=1) + "\n")
    return calibration


def write_host_copy_calibration(summary: dict[str, Any], out_path: str | Path) -> dict[str, Any]:
    """Put a copy-bandwidth run's `host_copy` table (`testbench.copy_bandwidth`) into a calibration file: merged
    into the file when it already is a calibration of the same GPU (its other tables stay, its old `host_copy`
    goes), else a new file holding only that table. Returns what was written."""
    from ..costmodel.calibration import calibration_from_dict
    from .worker import gpu_preset_for

    env = summary.get("env") or {}
    preset = gpu_preset_for(env.get("device") or "")
    if preset is None:
        raise ConfigError("gpu", f"no GPU preset for device {env.get('device')!r}: cannot label the calibration")
    path = Path(out_path)
    if path.exists() and path.stat().st_size:
        from ..files import DATA_LIMIT_BYTES, read_json_bounded

        calibration = read_json_bounded(path, "calibration_out", DATA_LIMIT_BYTES)
        calibration_from_dict(calibration, source=str(path))  # a malformed file is refused, not overwritten
        if calibration["gpu"] != preset:
            raise ConfigError("calibration_out", f"{path} is a calibration of {calibration['gpu']}, not {preset}")
    else:
        calibration = {
            "schema_version": SCHEMA_VERSION,
            "tool_version": __version__,
            "kind": "megatron-autotuner-calibration",
            "gpu": preset,
            "device_name": env.get("device"),
            "date": dt.datetime.now(dt.timezone.utc).date().isoformat(),
            "versions": {k: env.get(k) for k in ("torch", "megatron_core", "transformer_engine", "cuda", "nccl")},
            "ops": [],
        }
    calibration["host_copy"] = summary["host_copy"]
    calibration["host_copy_source"] = {
        "world_size": summary.get("world_size"),
        "date": env.get("date"),
        "hostname": env.get("hostname"),
        "interferences_not_run": summary.get("interferences_not_run", {}),
    }
    calibration_from_dict(calibration, source=str(path))
    write_text_atomic(path, json.dumps(calibration, indent=1) + "\n")
    return calibration
