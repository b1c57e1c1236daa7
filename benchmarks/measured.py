"""Predicted vs measured single-layer times on 2x H200 (benchmarks/results/testbench_h200_x2).

python benchmarks/measured.py  -> benchmarks/results/measured_comparison.json
"""

# Predicted vs measured time of single megatron-core layers (testbench `decoder` cases).
#
# The testbench times one TE decoder layer, micro-batch 1, with CUDA events around forward and
# backward (`testbench.measure`). The layers it built ran the unfused SwiGLU (see
# `theory.memory.ActivationOptions.fused_bias_activation`), so predictions use
# `fused_bias_activation=False`. Each forward starts on an idle GPU right after a synchronize, so
# the measured forward also holds the host's launch lag (~2 ms per layer in the H200 results,
# visible as measured forward minus predicted kernel time); the backward, launched by autograd's
# C++ engine while the GPU is busy, carries none. Both phases are reported.

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from megatron_autotuner import SCHEMA_VERSION, __version__
from megatron_autotuner.costmodel.layer import LayerContext, layer_cost
from megatron_autotuner.specs import ClusterSpec, get_gpu_spec, load_model_spec

ROOT = Path(__file__).resolve().parent


def predict_decoder_ms(model_name: str, gpu_name: str, tp: int, sp: bool, seq_length: int, mbs: int = 1):
    """(fwd_ms, bwd_ms) of layer 0 of `model_name` on one rank."""
    model = load_model_spec(model_name)
    gpu = get_gpu_spec(gpu_name)
    ctx = LayerContext(
        cluster=ClusterSpec(gpu, tp),
        tp=tp,
        sequence_parallel=sp,
        tokens=mbs * seq_length,
        seq_length=seq_length,
        fused_bias_activation=False,
    )
    lc = layer_cost(model, 0, ctx)
    return lc.fwd.total * 1e3, lc.bwd.total * 1e3


def compare_decoder_rows(rows: list[dict[str, Any]], gpu_name: str) -> list[dict[str, Any]]:
    """For testbench summary rows of op `decoder` (dense, cp=ep=1): measured vs predicted per phase."""
    out = []
    for r in rows:
        if r.get("status") != "ok" or r["op"] != "decoder" or r["cp"] != 1 or r["ep"] != 1:
            continue
        f, b = predict_decoder_ms(r["model"], gpu_name, r["tp"], r["sp"], r["seq_length"], r["micro_batch_size"])
        for phase, measured, predicted in (("bwd", r["bwd_ms"], b), ("fwd+bwd", r["fwd_bwd_ms"], f + b)):
            out.append(
                {
                    "case_id": r["case_id"],
                    "model": r["model"],
                    "tp": r["tp"],
                    "seq_length": r["seq_length"],
                    "phase": phase,
                    "measured_ms": measured,
                    "predicted_ms": predicted,
                    "error": predicted / measured - 1.0,
                }
            )
    return out


def main() -> int:
    rows = json.loads((ROOT / "results/testbench_h200_x2/dense_summary.json").read_text())["rows"]
    result = compare_decoder_rows(rows, "H200")
    for r in result:
        print(
            f"{r['case_id'][:44]:44s} {r['phase']:8s} measured {r['measured_ms']:7.2f} ms "
            f"predicted {r['predicted_ms']:7.2f} ms {r['error']:+6.1%}"
        )
    (ROOT / "results/measured_comparison.json").write_text(
        json.dumps(
            {"schema_version": SCHEMA_VERSION, "tool_version": __version__, "gpu": "H200", "rows": result}, indent=1
        )
        + "\n"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
