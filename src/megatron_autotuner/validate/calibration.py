"""Write a calibration file (`mat estimate --calibration`) from measured validation runs.

The format is `costmodel.calibration`'s (kind "megatron-autotuner-calibration", schema_version 1):
- `layers`: one entry per (model, tp, cp, ep, sequence parallel, seq, micro-batch, phase). The cost
  model scales its decoder-layer time by entry.time_ms / its own prediction of that layer (layer 0),
  so the entry's `time_ms` is solved for: the value that makes the predicted step equal the measured
  one. The predicted step is continuous and non-decreasing in time_ms but *not* affine: the
  data-parallel gradient reduce-scatter / parameter all-gather hide under the backward / forward only
  up to their own length (exposed = max(t - window, t * tail)), and the pipeline takes the slowest
  stage, so the slope changes where a communication stops being exposed. A line through two small
  probes therefore misses wherever the communication is exposed at the probes and hidden at the
  answer (Qwen3-30B-A3B with ep=1 and DP2: 2.4 G expert gradients over DP, +82% on the round trip);
  the solve brackets the root and refines it (Illinois false position, exact on a linear piece).
  Several runs with the same key: the median. `model_flops`: the model FLOPs of that layer per rank
  and micro-batch (the testbench's convention: FLOPs per token x b*s/cp tokens / tp, causal
  attention; fwd, or fwd+bwd = 3x the weight GEMMs' forward + 3x core attention's).
- `memory`: memory outside the caching allocator (`non_torch_gib`: CUDA context, NCCL buffers) and
  the reserved-but-unallocated fraction (`fragmentation_fraction`), medians over runs and ranks.
- `ops`: empty (operator tables come from the testbench).
"""

from __future__ import annotations

import datetime as dt
import json
import statistics
from pathlib import Path
from typing import Any

from .. import SCHEMA_VERSION, __version__
from ..errors import ConfigError
from ..files import write_text_atomic
from ..specs import get_gpu_spec
from ..theory.flops import layer_forward_flops_per_token, phase_flops
from ..theory.memory import GIB, ActivationOptions, MemoryAllowance, local_tokens, stage_memory
from .layout import Layout
from .predict import estimate_layout, predicted_allocated_gib

KIND = "megatron-autotuner-calibration"


def _document(
    gpu: str, device_name: str, versions: dict[str, Any], layers: list[dict[str, Any]], memory: Any
) -> dict[str, Any]:
    return {
        "schema_version": SCHEMA_VERSION,
        "tool_version": __version__,
        "kind": KIND,
        "gpu": gpu,
        "device_name": device_name,
        "date": dt.datetime.now(dt.timezone.utc).date().isoformat(),
        "versions": {k: v for k, v in versions.items() if v is not None},
        "source": "mat validate",
        "ops": [],
        "layers": layers,
        "memory": memory,
    }


def layer_model_flops(layout: Layout, convention: str = "causal") -> float:
    """Model FLOPs of decoder layer 0 (the layer the cost model's lookup compares with) for one
    micro-batch on one rank: fwd, or fwd + dgrad + wgrad when training."""
    spec = layout.model_spec()
    tokens = local_tokens(layout.workload(), layout.parallel())
    phases = ("fwd", "dgrad", "wgrad") if layout.mode == "train" else ("fwd",)
    total = 0.0
    for op, per_token in layer_forward_flops_per_token(spec, 0, layout.seq_length, convention).items():
        split = phase_flops(op, per_token * tokens / layout.tp)
        total += sum(split[ph] for ph in phases)
    return total


def _layer_entry(layout: Layout, time_ms: float, num_gpus: int, model_flops: float = 0.0) -> dict[str, Any]:
    spec = layout.model_spec()
    return {
        "model": spec.name,
        "num_gpus": num_gpus,
        "tp": layout.tp,
        "cp": layout.cp,
        "ep": layout.ep,
        "sequence_parallel": bool(layout.sequence_parallel),
        "seq_length": layout.seq_length,
        "micro_batch_size": layout.micro_batch_size,
        "phase": "fwd+bwd" if layout.mode == "train" else "fwd",
        "time_ms": time_ms,
        "model_flops": model_flops,
        "precision": layout.precision,
    }


def _key(entry: dict[str, Any]) -> tuple:
    from ..costmodel.calibration import LAYER_KEY_FIELDS  # lazily, as every costmodel import here

    return tuple(entry[k] for k in LAYER_KEY_FIELDS)


def solve_layer_time_ms(
    layout: Layout,
    measured_step_s: float,
    gpu: str,
    num_gpus: int,
    rel_tol: float = 1e-9,
    gradient_accumulation_fusion: bool | None = None,
) -> float | None:
    """The layer-entry time_ms that makes the cost model predict `measured_step_s` for `layout`.

    None when the cost model does not use the entry for this layout, or when the measured step is
    shorter than what the cost model predicts outside the decoder layers (no positive time fits).
    The predicted step is non-decreasing and piecewise linear in time_ms (see the module doc), and flat
    while the layers' GPU time stays under the host's issue time (`costmodel.layer.dense_host_s`): the
    bracket starts where the step first grows; the root is bracketed, then found by Illinois false position
    (exact once both ends of the bracket lie on the same linear piece). `gradient_accumulation_fusion`: as the run
    had it (None: as the runner on this machine would), so the unfused accumulation is not solved into the layer
    time.
    """
    from ..costmodel import calibration_from_dict

    def residual(time_ms: float) -> float:
        doc = _document(gpu, "", {}, [_layer_entry(layout, time_ms, num_gpus)], None)
        probe = calibration_from_dict(doc, "<probe>")
        est = estimate_layout(layout, gpu, probe, gradient_accumulation_fusion=gradient_accumulation_fusion)
        return est.step_time_s - measured_step_s

    tol = rel_tol * measured_step_s
    lo, hi = 1.0, 2.0
    f_lo, f_hi = residual(lo), residual(hi)
    while f_hi <= f_lo:  # flat: layers this short hide under the host's issue time (or the entry is unused)
        if hi > 1e9:
            return None  # the cost model did not use the entry for this layout
        lo, f_lo = hi, f_hi
        hi *= 4.0
        f_hi = residual(hi)
    while f_lo > 0:  # bracket from below: shrink toward 0
        if lo < 1e-9:
            return None
        hi, f_hi = lo, f_lo
        lo /= 16.0
        f_lo = residual(lo)
    while f_hi < 0:  # ... and from above
        if hi > 1e9:
            return None
        lo, f_lo = hi, f_hi
        hi *= 4.0
        f_hi = residual(hi)
    for x, fx in ((lo, f_lo), (hi, f_hi)):
        if abs(fx) <= tol:
            return x
    side = 0
    x = lo
    for _ in range(200):
        x = hi - f_hi * (hi - lo) / (f_hi - f_lo)
        fx = residual(x)
        if abs(fx) <= tol or hi - lo <= 1e-12 * hi:
            break
        if fx < 0:
            lo, f_lo = x, fx
            if side == -1:
                f_hi /= 2.0
            side = -1
        else:
            hi, f_hi = x, fx
            if side == 1:
                f_lo /= 2.0
            side = 1
    return x


def calibration_from_rows(rows: list[dict[str, Any]], gpu: str) -> dict[str, Any]:
    """The calibration document from comparison rows (successful runs only)."""
    ok = [r for r in rows if r.get("status") == "ok" and (r.get("measured") or {}).get("step_time_s")]
    if not ok:
        raise ConfigError("results", "no successful validation runs to calibrate from")
    get_gpu_spec(gpu)
    solved: dict[tuple, list[float]] = {}
    entries: dict[tuple, dict[str, Any]] = {}
    for row in ok:
        layout = Layout.from_record(row)
        probe = _layer_entry(layout, 1.0, layout.num_gpus, layer_model_flops(layout))
        key = _key(probe)
        num_gpus = entries.get(key, probe)["num_gpus"]
        value = solve_layer_time_ms(
            layout,
            row["measured"]["step_time_s"],
            gpu,
            num_gpus,
            gradient_accumulation_fusion=row.get("gradient_accumulation_fusion"),
        )
        if value is None:
            continue
        entries.setdefault(key, probe)
        solved.setdefault(key, []).append(value)
    layers = [{**entries[k], "time_ms": statistics.median(v), "runs": len(v)} for k, v in sorted(solved.items())]
    env = ok[0].get("env") or {}
    versions = {k: env.get(k) for k in ("torch", "megatron_core", "transformer_engine", "cuda", "nccl")}
    return _document(gpu, env.get("device") or "", versions, layers, memory_blocks_from_rows(ok))


def _memory_comparable(row: dict[str, Any]) -> bool:
    # a layout that started in a process still holding earlier layouts' memory says nothing of its own
    return row.get("status") == "ok" and bool((row.get("measured") or {}).get("memory_comparable", True))


def memory_allowance_from_rows(rows: list[dict[str, Any]]) -> dict[str, float] | None:
    """Medians over runs and ranks of the memory outside the caching allocator (`non_torch_gib`) and of
    (reserved - allocated) / predicted activations (`fragmentation_fraction`, capped at 0.9; see
    `theory.memory.MemoryAllowance`); None without comparable runs."""
    non_torch, frag = [], []
    for row in filter(_memory_comparable, rows):
        activations_gib = ((row.get("predicted") or {}).get("memory_breakdown_gib") or {}).get("activations")
        for p in row.get("per_rank") or []:
            if p.get("non_torch_gib") is not None:
                non_torch.append(max(0.0, p["non_torch_gib"]))
            if activations_gib and p.get("max_allocated_gib") is not None and p.get("max_reserved_gib") is not None:
                frag.append(max(0.0, p["max_reserved_gib"] - p["max_allocated_gib"]) / activations_gib)
    if not (non_torch and frag):
        return None
    return {"non_torch_gib": statistics.median(non_torch), "fragmentation_fraction": min(statistics.median(frag), 0.9)}


def _expandable(row: dict[str, Any]) -> bool:
    return bool(row["layout"].get("expandable_segments", False))


def memory_blocks_from_rows(rows: list[dict[str, Any]]) -> dict[str, Any] | list[dict[str, Any]] | None:
    """The calibration file's `memory`: one allowance per allocator setting the runs used, each stating its
    setting (a single object when all runs used one setting); None without comparable runs."""
    blocks = []
    for setting in (False, True):
        memory = memory_allowance_from_rows([r for r in rows if _expandable(r) is setting])
        if memory is not None:
            blocks.append({**memory, "expandable_segments": setting})
    if not blocks:
        return None
    return blocks[0] if len(blocks) == 1 else blocks


def _peak_stage_activation_detail(layout: Layout, stage: int) -> dict[str, float]:
    """The theory's activation working sets of the predicted peak stage (what `MemoryAllowance.bytes_for` needs
    to count the pieces a forward-only MoE pass leaves under expandable segments)."""
    from ..costmodel.estimate import padded_vocab

    model, parallel = layout.model_spec(), layout.parallel()
    options = ActivationOptions(flash_attention=layout.use_te)
    padded = padded_vocab(model, parallel.tp)
    return stage_memory(model, parallel, layout.workload(), stage, options, padded_vocab_size=padded).activation_detail


def held_out_memory(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Peak memory of each comparable run predicted with the allowance calibrated from the *other* runs
    (leave-one-out, among runs with the same allocator setting): what `mat estimate --calibration` would say
    for a layout it has not seen. The allocator part is the cost model's (predicted total minus its own
    allowance)."""
    comparable = [r for r in rows if _memory_comparable(r) and (r.get("predicted") or {}).get("memory_breakdown_gib")]
    out = []
    for row in comparable:
        others = [r for r in comparable if r is not row and _expandable(r) == _expandable(row)]
        memory = memory_allowance_from_rows(others)
        measured = row["measured"].get("peak_gib")
        if memory is None or not measured:
            continue
        breakdown = row["predicted"]["memory_breakdown_gib"]
        allocated_gib = predicted_allocated_gib(row["predicted"])
        layout = Layout.from_record(row)
        allowance = MemoryAllowance(**memory, expandable_segments=_expandable(row)).bytes_for(
            breakdown["activations"] * GIB,
            layout.parallel(),
            layout.mode == "train",
            _peak_stage_activation_detail(layout, int(breakdown.get("stage", 0))),
        )
        predicted = allocated_gib + allowance / GIB
        out.append(
            {
                "layout_id": row["layout_id"],
                "label": row.get("label"),
                "measured_peak_gib": measured,
                "predicted_peak_gib": predicted,
                "allowance_from_others": memory,
                "error": predicted / measured - 1.0,
            }
        )
    return out


def write_calibration(rows: list[dict[str, Any]], gpu: str, path: str | Path) -> dict[str, Any]:
    """Write the calibration file and check that the cost model loads it back."""
    doc = calibration_from_rows(rows, gpu)
    write_text_atomic(Path(path), json.dumps(doc, indent=1) + "\n")
    from ..costmodel import load_calibration

    load_calibration(path)
    return doc
