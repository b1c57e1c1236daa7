"""Predicted vs measured single-layer times on H200: the testbench's decoder cases of 2x H200
(benchmarks/results/testbench_h200_x2), the same cases at TP 1 on one H200 with the host's time of each phase and the
prediction written before that lease (validation_h200_x1/host_probe), ten more layers predicted before a second
lease (validation_h200_x1/issue_order), and whole layers timed by the overlap tuner's layer check at TP 1 (one
H200) and TP 2 (2x H200, overlap_h200_x2).

The testbench times one TE decoder layer with CUDA events around forward and backward (`testbench.measure`), each
phase from an empty launch queue right after a synchronize: the forward waits for the host to launch each op group
(`costmodel.layer.empty_queue_forward_s`), the backward takes the longer of its GPU and host time. The 2x H200 run
built its layers with the unfused SwiGLU (`theory.memory.ActivationOptions.fused_bias_activation`), later runs fused.

    python benchmarks/measured.py                     -> benchmarks/results/measured_comparison.json
    python benchmarks/measured.py predict CASES GPU   -> the prediction to write before a lease of CASES
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from megatron_autotuner import SCHEMA_VERSION, __version__
from megatron_autotuner.costmodel import defaults
from megatron_autotuner.costmodel.layer import (
    LayerContext,
    dense_host_s,
    empty_queue_phases_s,
    forward_issue_groups_s,
    layer_cost,
)
from megatron_autotuner.specs import ClusterSpec, get_gpu_spec, load_model_spec

ROOT = Path(__file__).resolve().parent


def _layer(model_name: str, gpu_name: str, tp: int, sp: bool, seq_length: int, mbs: int, fused: bool, **options):
    """(model spec, `LayerContext`) of layer 0 on one rank; `fused`: the SwiGLU fused as megatron-core builds it by
    default (the 2x H200 testbench cases ran it unfused); `options`: more `LayerContext` fields."""
    gpu = get_gpu_spec(gpu_name)
    ctx = LayerContext(
        cluster=ClusterSpec(gpu, tp),
        tp=tp,
        sequence_parallel=sp,
        tokens=mbs * seq_length,
        seq_length=seq_length,
        fused_bias_activation=fused,
        **options,
    )
    return load_model_spec(model_name), ctx


def predict_decoder_ms(
    model_name: str, gpu_name: str, tp: int, sp: bool, seq_length: int, mbs: int = 1, fused: bool = False, **options
) -> tuple[float, float]:
    """(fwd_ms, bwd_ms) of the layer's GPU work (`layer_cost`), as inside a step where the host runs ahead."""
    model, ctx = _layer(model_name, gpu_name, tp, sp, seq_length, mbs, fused, **options)
    lc = layer_cost(model, 0, ctx)
    return lc.fwd.total * 1e3, lc.bwd.total * 1e3


def predict_empty_queue_ms(
    model_name: str, gpu_name: str, tp: int, sp: bool, seq_length: int, mbs: int = 1, fused: bool = False,
    host_s: tuple[float, float] | None = None,
) -> tuple[float, float]:  # fmt: skip
    """(fwd_ms, bwd_ms) of the layer timed phase by phase from an empty launch queue, as the testbench times it
    (`empty_queue_phases_s`). `host_s`: the host's (forward, backward) seconds; None: the default floor at this TP
    size."""
    model, ctx = _layer(model_name, gpu_name, tp, sp, seq_length, mbs, fused)
    fwd, bwd = empty_queue_phases_s(model, 0, ctx, host_s)
    return fwd * 1e3, bwd * 1e3


def compare_decoder_rows(rows: list[dict[str, Any]], gpu_name: str) -> list[dict[str, Any]]:
    """For testbench summary rows of op `decoder` (dense, cp=ep=1): measured vs predicted per phase, by the GPU time
    alone (`gpu_only_ms`) and as the testbench times it, from an empty queue with the default host floor
    (`predicted_ms`)."""
    out = []
    for r in rows:
        if r.get("status") != "ok" or r["op"] != "decoder" or r["cp"] != 1 or r["ep"] != 1:
            continue
        args = (r["model"], gpu_name, r["tp"], r["sp"], r["seq_length"], r["micro_batch_size"])
        f, b = predict_decoder_ms(*args)
        qf, qb = predict_empty_queue_ms(*args)
        phases = [("fwd", r["fwd_ms"], f, qf), ("bwd", r["bwd_ms"], b, qb)]
        phases.append(("fwd+bwd", r["fwd_bwd_ms"], f + b, qf + qb))
        for phase, measured, gpu_only, predicted in phases:
            out.append(
                {
                    "case_id": r["case_id"],
                    "model": r["model"],
                    "tp": r["tp"],
                    "seq_length": r["seq_length"],
                    "phase": phase,
                    "measured_ms": measured,
                    "gpu_only_ms": gpu_only,
                    "gpu_only_error": gpu_only / measured - 1.0,
                    "predicted_ms": predicted,
                    "error": predicted / measured - 1.0,
                }
            )
    return out


H200_X1 = ROOT / "results/validation_h200_x1/host_probe"
ISSUE_ORDER_LEASE = ROOT / "results/validation_h200_x1/issue_order"


def _lease_cases(lease: Path, predictions: str, key: tuple[str, ...]):
    """Per successful testbench record of a one-H200 lease: (case, measured, the prediction written before the lease
    for it, matched on `key`, and the `_layer` arguments of its TP 1 layer with the fused SwiGLU)."""
    written = json.loads((lease / predictions).read_text())["cases"]
    predicted = {tuple(c[k] for k in key): c for c in written}
    for line in (lease / "testbench/collect/rank_0.jsonl").read_text().splitlines():
        rec = json.loads(line)
        if rec.get("status") != "ok":
            continue
        case = rec["case"]
        args = (case["model"], "H200", 1, False, case["seq_length"], case["micro_batch_size"], True)
        yield case, rec["real"], predicted[tuple(case[k] for k in key)], args


def compare_empty_queue(lease: Path = H200_X1) -> list[dict[str, Any]]:
    """The testbench's single decoder layers at TP 1 on one H200: per phase the CUDA-event time from an empty launch
    queue and the host's wall time of the call (`testbench.measure`). Against the prediction written before the
    lease (predicted_decoder.json: the larger of the GPU time and the default host floor), and against today's
    model of an empty queue (`predict_empty_queue_ms`) with the default floor (`now_default`) and with the host time
    measured in that case (`now_host_measured`, which tests the issue order alone)."""
    out = []
    for case, real, pre, args in _lease_cases(lease, "predicted_decoder.json", ("model", "seq_length")):
        host = tuple(real[f"host_{phase}_ms"]["median"] * 1e-3 for phase in ("fwd", "bwd"))
        now = {"now_default": predict_empty_queue_ms(*args), "now_host_measured": predict_empty_queue_ms(*args, host)}
        gpu = predict_decoder_ms(*args)
        for i, phase in enumerate(("fwd", "bwd")):
            measured = real[f"{phase}_ms"]["median"]
            row = {
                "model": case["model"],
                "seq_length": case["seq_length"],
                "phase": phase,
                "measured_ms": measured,
                "host_ms": host[i] * 1e3,
                "gpu_ms": gpu[i],
                "predicted_before_ms": pre[f"{phase}_ms"],
                "error_before": pre[f"{phase}_ms"] / measured - 1.0,
            }
            for key, ms in now.items():
                row[f"{key}_ms"] = ms[i]
                row[f"error_{key}"] = ms[i] / measured - 1.0
            out.append(row)
    return out


def predict_cases(cases_path: Path, gpu_name: str) -> dict[str, Any]:
    """Before a lease: for each TP 1 dense decoder case of a testbench case file, the forward's GPU time by issue
    group, the issue fractions, the backward's GPU time and both phases from an empty queue with the default floor.
    After it, `compare_issue_order` applies today's model to each case's measured host time; its test checks that
    the groups have not moved since."""
    out = []
    for case in json.loads(cases_path.read_text()):
        args = (case["model"], gpu_name, 1, False, case["seq_length"], case.get("micro_batch_size", 1), True)
        model, ctx = _layer(*args)
        fwd, bwd = predict_empty_queue_ms(*args)
        out.append(
            case
            | {
                "gpu_fwd_groups_ms": [g * 1e3 for g in forward_issue_groups_s(model, 0, ctx)],
                "issue_fractions": list(defaults.FORWARD_ISSUE_FRACTIONS[False]),
                "gpu_bwd_ms": layer_cost(model, 0, ctx).bwd.total * 1e3,
                "default_host_ms": [h * 1e3 for h in dense_host_s(ctx)],
                "fwd_ms_default_floor": fwd,
                "bwd_ms_default_floor": bwd,
            }
        )
    return {"schema_version": SCHEMA_VERSION, "tool_version": __version__, "gpu": gpu_name, "cases": out}


def compare_issue_order(lease: Path = ISSUE_ORDER_LEASE) -> list[dict[str, Any]]:
    """A lease's testbench decoder layers against the prediction written before it (predicted_issue_order.json):
    each phase from an empty queue with the host time the case measured (training forward, no-grad forward,
    backward), and with the default floor."""
    out = []
    key = ("model", "seq_length", "micro_batch_size")
    for case, real, pre, args in _lease_cases(lease, "predicted_issue_order.json", key):
        for phase, host_key in (("fwd", "host_fwd_ms"), ("fwd_no_grad", "host_fwd_no_grad_ms"), ("bwd", "host_bwd_ms")):
            measured, host_s = real[f"{phase}_ms"]["median"], real[host_key]["median"] * 1e-3
            mine = predict_empty_queue_ms(*args, (host_s, host_s))[0 if phase != "bwd" else 1]
            # the default floor's no-grad forward was not written before the lease
            default = {"fwd": pre["fwd_ms_default_floor"], "bwd": pre["bwd_ms_default_floor"]}.get(phase)
            out.append(
                {
                    "model": case["model"],
                    "seq_length": case["seq_length"],
                    "micro_batch_size": case["micro_batch_size"],
                    "phase": phase,
                    "measured_ms": measured,
                    "host_ms": host_s * 1e3,
                    "gpu_ms": pre["gpu_bwd_ms"] if phase == "bwd" else sum(pre["gpu_fwd_groups_ms"]),
                    "predicted_ms": mine,
                    "error": mine / measured - 1.0,
                    "default_floor_error": None if default is None else default / measured - 1.0,
                }
            )
    return out


OVERLAP_H200_X2 = ROOT / "results/overlap_h200_x2"


def compare_layer_check(
    tp1_path: Path = H200_X1 / "layer_check_tp1.json", tp2_path: Path = OVERLAP_H200_X2 / "layer_check.json"
) -> list[dict[str, Any]]:
    """Whole TE layers fwd + bwd timed back to back (the overlap tuner's layer check: no RoPE, fused SwiGLU, seq
    8192, micro-batch 1; TP 2 with sequence parallelism) against the cost model: TP 1 on one H200, TP 2 on 2x H200
    without overlap (`nccl`) and with TE's userbuffers (`te_default`, `tuned`; `tp_comm_overlap`)."""
    out = []
    for path in (tp1_path, tp2_path):
        doc = json.loads(path.read_text())
        tp, seq = doc["tp"], doc["seq_len"]
        for model, entry in doc["models"].items():
            for setup, measured in (entry.get("median_ms") or {}).items():
                if measured is None:
                    continue
                f, b = predict_decoder_ms(model, "H200", tp, tp > 1, seq, 1, True, tp_comm_overlap=setup != "nccl")
                out.append(
                    {
                        "model": model,
                        "tp": tp,
                        "seq_length": seq,
                        "setup": setup,
                        "measured_ms": measured,
                        "predicted_ms": f + b,
                        "error": (f + b) / measured - 1.0,
                        "source": str(path.relative_to(ROOT.parent)),
                    }
                )
    return out


def main(argv: list[str] | None = None) -> int:
    import sys

    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["predict"]:
        # python benchmarks/measured.py predict CASES.json GPU > predicted_issue_order.json
        print(json.dumps(predict_cases(Path(argv[1]), argv[2]), indent=1))
        return 0
    rows = json.loads((ROOT / "results/testbench_h200_x2/dense_summary.json").read_text())["rows"]
    result = compare_decoder_rows(rows, "H200")
    for r in result:
        print(
            f"{r['case_id'][:44]:44s} {r['phase']:8s} measured {r['measured_ms']:7.2f} ms "
            f"GPU only {r['gpu_only_error']:+6.1%} empty queue {r['predicted_ms']:7.2f} ms {r['error']:+6.1%}"
        )
    empty_queue = compare_empty_queue()
    for r in empty_queue:
        print(
            f"1x H200 {r['model']:13s} s{r['seq_length']} {r['phase']} measured {r['measured_ms']:6.2f} ms "
            f"(host {r['host_ms']:5.2f}) before {r['error_before']:+6.1%} now {r['error_now_default']:+6.1%} "
            f"with its host {r['error_now_host_measured']:+6.1%}"
        )
    whole = compare_layer_check()
    for r in whole:
        print(
            f"layer check {r['model']:13s} tp{r['tp']} {r['setup']:10s} measured {r['measured_ms']:6.2f} ms "
            f"predicted {r['predicted_ms']:6.2f} ms {r['error']:+6.1%}"
        )
    issue_order = compare_issue_order(ISSUE_ORDER_LEASE)
    for r in issue_order:
        print(
            f"issue order {r['model']:13s} s{r['seq_length']} b{r['micro_batch_size']} {r['phase']:11s} "
            f"measured {r['measured_ms']:6.2f} ms (host {r['host_ms']:5.2f}) predicted {r['error']:+6.1%}"
        )
    doc = {
        "schema_version": SCHEMA_VERSION,
        "tool_version": __version__,
        "gpu": "H200",
        "rows": result,
        "empty_queue_h200_x1": empty_queue,
        "whole_layers": whole,
        "issue_order_h200_x1": issue_order,
    }
    (ROOT / "results/measured_comparison.json").write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
