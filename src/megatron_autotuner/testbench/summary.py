"""Real-vs-estimated summary rows of testbench results (rank 0 by default)."""

from __future__ import annotations

from typing import Any

GIB = 2**30


def summary_rows(records: list[dict[str, Any]], rank: int = 0) -> list[dict[str, Any]]:
    """One row per case: measured time, TFLOP/s, MFU, memory, and measured / estimated ratios; for dense decoder
    layers measured on a GPU preset the cost model's time beside it (`calibration.predicted_phases_ms`)."""
    from .calibration import predicted_phases_ms
    from .results import latest_by_case

    rows = []
    for rec in latest_by_case(records, rank).values():
        case = rec.get("case", {})
        row: dict[str, Any] = {
            "case_id": rec["case_id"],
            "model": case.get("model"),
            "op": case.get("op"),
            "tp": case.get("tp"),
            "cp": case.get("cp"),
            "ep": case.get("ep"),
            "sp": case.get("sequence_parallel"),
            "seq_length": case.get("seq_length"),
            "micro_batch_size": case.get("micro_batch_size"),
            "dtype": case.get("dtype", "bf16"),
            "status": rec.get("status"),
            "error": rec.get("error"),
            "layer_spec": rec.get("layer_spec"),
        }
        real, est = rec.get("real") or {}, rec.get("estimated") or {}
        if rec.get("status") == "ok":
            row.update(
                fwd_ms=real["fwd_ms"]["median"],
                bwd_ms=real["bwd_ms"]["median"],
                fwd_bwd_ms=real["fwd_bwd_ms"]["median"],
                fwd_bwd_spread_ms=real["fwd_bwd_ms"]["max"] - real["fwd_bwd_ms"]["min"],
                host_fwd_ms=(real.get("host_fwd_ms") or {}).get("median"),
                host_bwd_ms=(real.get("host_bwd_ms") or {}).get("median"),
                fwd_bwd_tflops=real.get("fwd_bwd_tflops"),
                fwd_bwd_mfu=real.get("fwd_bwd_mfu"),
                peak_allocated_gib=(real.get("peak_allocated_bytes") or 0) / GIB,
                activation_gib=(real.get("activation_bytes") or 0) / GIB,
                activation_estimated_gib=est.get("activation_bytes", 0) / GIB,
                activation_ratio=(rec.get("ratio") or {}).get("activation_bytes"),
                weight_ratio=(rec.get("ratio") or {}).get("weight_bytes"),
            )
            predicted = predicted_phases_ms(rec)
            if predicted:
                row.update(predicted, fwd_bwd_error=predicted["predicted_fwd_bwd_ms"] / row["fwd_bwd_ms"] - 1.0)
        rows.append(row)
    return rows
