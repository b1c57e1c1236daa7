"""Write a calibration file (`mat estimate --calibration`) from measured validation runs.

The format is `costmodel.calibration`'s (kind "megatron-autotuner-calibration", schema_version 1):
- `layers`: one entry per (model, tp, cp, ep, sequence parallel, seq, micro-batch, phase). The cost
  model scales its decoder-layer time by entry.time_ms / its own prediction of that layer, so the
  entry's `time_ms` is solved for: step time is affine in that scale (the decoder layers scale, the
  rest does not), so two probe estimates (time_ms = 1 ms and 2 ms) give the line and the value that
  makes the predicted step equal the measured one. Several runs with the same key: the median.
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
from ..specs import get_gpu_spec
from .layout import Layout
from .predict import estimate_layout

KIND = "megatron-autotuner-calibration"


def _document(
    gpu: str, device_name: str, versions: dict[str, Any], layers: list[dict[str, Any]], memory: dict[str, float] | None
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


def _layer_entry(layout: Layout, time_ms: float, num_gpus: int) -> dict[str, Any]:
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
        "model_flops": 0.0,
    }


def _key(entry: dict[str, Any]) -> tuple:
    return tuple(
        entry[k] for k in ("model", "tp", "cp", "ep", "sequence_parallel", "seq_length", "micro_batch_size", "phase")
    )


def solve_layer_time_ms(layout: Layout, measured_step_s: float, gpu: str, num_gpus: int) -> float | None:
    """The layer-entry time_ms that makes the cost model predict `measured_step_s` for `layout`."""
    from ..costmodel import calibration_from_dict

    def step_with(time_ms: float) -> float:
        doc = _document(gpu, "", {}, [_layer_entry(layout, time_ms, num_gpus)], None)
        return estimate_layout(layout, gpu, calibration_from_dict(doc, "<probe>")).step_time_s

    t1, t2 = step_with(1.0), step_with(2.0)
    slope = t2 - t1
    if slope <= 0:
        return None  # the cost model did not use the entry for this layout
    value = 1.0 + (measured_step_s - t1) / slope
    return value if value > 0 else None


def calibration_from_rows(rows: list[dict[str, Any]], gpu: str) -> dict[str, Any]:
    """The calibration document from comparison rows (successful runs only)."""
    ok = [r for r in rows if r.get("status") == "ok" and (r.get("measured") or {}).get("step_time_s")]
    if not ok:
        raise ConfigError("results", "no successful validation runs to calibrate from")
    get_gpu_spec(gpu)
    solved: dict[tuple, list[float]] = {}
    entries: dict[tuple, dict[str, Any]] = {}
    for row in ok:
        layout = Layout.from_dict(row["layout"])
        probe = _layer_entry(layout, 1.0, layout.num_gpus)
        key = _key(probe)
        num_gpus = entries.get(key, probe)["num_gpus"]
        value = solve_layer_time_ms(layout, row["measured"]["step_time_s"], gpu, num_gpus)
        if value is None:
            continue
        entries.setdefault(key, probe)
        solved.setdefault(key, []).append(value)
    layers = [{**entries[k], "time_ms": statistics.median(v), "runs": len(v)} for k, v in sorted(solved.items())]
    non_torch, frag = [], []
    for row in ok:
        if not row["measured"].get("memory_comparable", True):
            continue  # started in a process that still held earlier layouts' memory
        for p in row.get("per_rank") or []:
            if p.get("non_torch_gib") is not None:
                non_torch.append(max(0.0, p["non_torch_gib"]))
            if p.get("max_allocated_gib") and p.get("max_reserved_gib") is not None:
                frag.append(max(0.0, p["max_reserved_gib"] / p["max_allocated_gib"] - 1.0))
    memory = None
    if non_torch and frag:
        memory = {
            "non_torch_gib": statistics.median(non_torch),
            "fragmentation_fraction": min(statistics.median(frag), 0.5),
        }
    env = ok[0].get("env") or {}
    versions = {k: env.get(k) for k in ("torch", "megatron_core", "transformer_engine", "cuda", "nccl")}
    return _document(gpu, env.get("device") or "", versions, layers, memory)


def write_calibration(rows: list[dict[str, Any]], gpu: str, path: str | Path) -> dict[str, Any]:
    """Write the calibration file and check that the cost model loads it back."""
    doc = calibration_from_rows(rows, gpu)
    Path(path).write_text(json.dumps(doc, indent=1) + "\n")
    from ..costmodel import load_calibration

    load_calibration(path)
    return doc
