"""Predictions for layouts (the cost model), and measured-vs-predicted comparison rows.

The cost model (`megatron_autotuner.costmodel.estimate`) is imported lazily: if it is missing or
fails, every prediction says why (`{"error": "costmodel unavailable: ..."}`) and the measured side
still stands. Measured MFU uses the cost model's model FLOPs per iteration (same FLOP convention)
and the GPU preset's dense bf16 peak.
"""

from __future__ import annotations

from typing import Any

from ..errors import AutotunerError, ConfigError
from ..specs import get_gpu_spec
from ..specs.hardware import GIB, GPUSpec
from .layout import Layout

PREDICTED_KEYS = (
    "step_time_s",
    "tokens_per_s_per_gpu",
    "mfu",
    "peak_memory_gib",
    "memory_breakdown_gib",
    "fits",
    "hbm_gib",
    "model_flops_per_iteration",
    "tokens_per_iteration",
    "num_microbatches",
    "notes",
    "step_time_range_s",
)


def _costmodel():
    try:
        from ..costmodel import CostOptions, estimate
    except Exception as exc:  # noqa: BLE001 - say clearly what is missing
        raise AutotunerError(f"costmodel unavailable: {type(exc).__name__}: {exc}") from exc
    return CostOptions, estimate


def runner_grad_accumulation_fusion(layout: Layout) -> bool:
    """Whether the run fuses wgrad accumulation, as the runner decides it
    (`runner.planned_gradient_accumulation_fusion`: the layout's field, else APEX on this machine)."""
    from .runner import planned_gradient_accumulation_fusion

    return planned_gradient_accumulation_fusion(layout, layout.use_te)


def cost_options(
    layout: Layout,
    calibration: Any = None,
    flops_convention: str = "causal",
    gradient_accumulation_fusion: bool | None = None,
):
    """The run settings the layout carries as cost-model options: the defaults are what Megatron-LM and the runner
    do without a flag (`CostOptions`: unfused fp32 loss, eager MoE), the layout's fields say the rest; gradient
    accumulation fusion as the run had it (None: `runner_grad_accumulation_fusion`)."""
    CostOptions, _ = _costmodel()
    if gradient_accumulation_fusion is None:
        gradient_accumulation_fusion = runner_grad_accumulation_fusion(layout)
    return CostOptions(
        flops_convention=flops_convention,
        overlap_grad_reduce=layout.overlap_grad_reduce,
        overlap_param_gather=layout.overlap_param_gather,
        flash_attention=layout.use_te,
        fused_cross_entropy=layout.cross_entropy_fusion,
        cross_entropy_fusion_impl=layout.cross_entropy_fusion_impl,
        moe_permute_fusion=layout.moe_permute_fusion,
        gradient_accumulation_fusion=gradient_accumulation_fusion,
        expandable_segments=layout.expandable_segments,
        ddp_side_stream=layout.ddp_side_stream,
        calibration=calibration,
        cuda_device_max_connections=layout.cuda_device_max_connections,
    )


def _estimate(layout: Layout, gpu: str | GPUSpec, options: Any):
    _, estimate = _costmodel()
    gpu_spec = get_gpu_spec(gpu) if isinstance(gpu, str) else gpu
    return estimate(layout.model_spec(), layout.parallel(), layout.workload(), gpu_spec, options)


def estimate_layout(
    layout: Layout,
    gpu: str | GPUSpec,
    calibration: Any = None,
    flops_convention: str = "causal",
    gradient_accumulation_fusion: bool | None = None,
):
    """The cost model's `Estimate` for the layout (reduced model included). Raises on errors."""
    return _estimate(layout, gpu, cost_options(layout, calibration, flops_convention, gradient_accumulation_fusion))


def predict(
    layout: Layout,
    gpu: str | GPUSpec,
    calibration: Any = None,
    flops_convention: str = "causal",
    gradient_accumulation_fusion: bool | None = None,
) -> dict:
    """A compact prediction dict; `{"error": ...}` when the cost model cannot say."""
    try:
        options = cost_options(layout, calibration, flops_convention, gradient_accumulation_fusion)
        data = _estimate(layout, gpu, options).to_dict()
    except (AutotunerError, ConfigError, ValueError, ZeroDivisionError) as exc:
        return {"error": str(exc)}
    except Exception as exc:  # noqa: BLE001 - an evolving cost model must not stop a GPU batch
        return {"error": f"cost model failed: {type(exc).__name__}: {exc}"}
    out = {k: data.get(k) for k in PREDICTED_KEYS}
    out["assumed"] = {
        "gradient_accumulation_fusion": options.gradient_accumulation_fusion,
        "fused_cross_entropy": options.fused_cross_entropy,
        "cross_entropy_fusion_impl": options.cross_entropy_fusion_impl,
        "moe_host_bound": options.moe_host_bound,
        "moe_permute_fusion": options.moe_permute_fusion,
        "host_floor": options.host_floor,
        "expandable_segments": options.expandable_segments,
        "tp_comm_overlap": layout.tp_comm_overlap,
    }
    if layout.packed:
        out["assumed"]["packing"] = packing_assumption(layout)
    if layout.activation_offload is not None:
        # the step's exposed copy time and what sits in pinned host memory at the peak (not in peak_memory_gib)
        out["offload_s"] = (data.get("time_breakdown_s") or {}).get("offload")
        out["offloaded_gib"] = (data.get("memory_breakdown_gib") or {}).get("offloaded_to_host", 0.0)
        out["offload_copied_gib"] = offload_copied_gib(layout)
        out["assumed"]["activation_offload"] = layout.to_dict()["activation_offload"]
    return out


def offload_copied_gib(layout: Layout) -> float | None:
    """GiB one micro-batch copies to host memory on rank 0 once the offload margin stays on the GPU: what
    megatron-core's fine-grained `offload_summary_bytes` counts (every saved tensor of an offloaded group, so a tensor
    two groups save, like core_attn's output that is attn_proj's input, twice); None for layer-level offloading,
    which has no such counter."""
    workload = layout.workload()
    if not workload.activation_offload.fine_grained:
        return None
    from ..theory.memory import offloaded_per_chunk

    per_chunk, kept = offloaded_per_chunk(layout.model_spec(), layout.parallel(), workload, 0, copied=True)
    return (sum(per_chunk) - kept) / GIB


def packing_assumption(layout: Layout) -> dict[str, Any]:
    """What the prediction of a packed layout was given (the workload's max_token_len and lengths: the cost model
    packs the same sampled sequences the same way, `specs.parallel.packed_batch`) and what the run packs (tokens,
    padded tokens, sum of s_i^2, micro-batches), to check one against the other."""
    plan = layout.packing_plan()
    summary = plan.summary()
    lengths = layout.sequence_lengths()
    return {
        "workload_max_token_len": layout.max_token_len,
        "workload_lengths": None if lengths is None else lengths.to_dict(),
        "run_tokens_per_iteration": summary["tokens"],
        "run_padded_tokens_per_iteration": summary["padded_tokens"],
        "run_sum_sq_tokens": summary["sum_sq_tokens"],
        "run_num_microbatches": plan.num_microbatches,
        "mean_seq_length": summary["mean_seq_length"],
        "max_seq_length": summary["max_seq_length"],
    }


def edge_num_layers(layout: Layout, gpu: str | GPUSpec, which: str, max_layers: int = 512) -> int:
    """The layer count at the memory edge: 'max-fit' = most layers predicted to fit, 'min-oom' = the
    next valid count (predicted not to fit). Counts step by pp x vpp so every stage stays even."""
    if which not in ("max-fit", "min-oom"):
        raise ConfigError("num_layers", f"edge must be max-fit or min-oom, got {which!r}")
    step = layout.pp * (layout.vpp or 1)
    if layout.recompute == "full" and layout.recompute_method == "uniform":
        step *= layout.recompute_num_layers
    last_fit = None
    for n in range(step, max_layers + 1, step):
        est = estimate_layout(layout.replace(num_layers=n), gpu)
        if est.fits:
            last_fit = n
        else:
            if which == "min-oom":
                return n
            if last_fit is None:
                raise ConfigError("num_layers", f"even {n} layers are predicted not to fit")
            return last_fit
    raise ConfigError("num_layers", f"still predicted to fit with {max_layers} layers")


def predicted_allocated_gib(predicted: dict[str, Any]) -> float | None:
    """What the caching allocator should hand out at the peak: the predicted total less the allowance (memory
    outside the allocator and reserved-but-unallocated); None without a memory prediction."""
    breakdown = predicted.get("memory_breakdown_gib") or {}
    if "total" not in breakdown:
        return None
    return breakdown["total"] - breakdown.get("allowance", 0.0)


def predicted_reserved_gib(predicted: dict[str, Any]) -> float | None:
    """What the caching allocator should reserve at the peak: the predicted total less the memory outside it;
    None without that split."""
    breakdown = predicted.get("memory_breakdown_gib") or {}
    if "total" not in breakdown or "non_torch" not in breakdown:
        return None
    return breakdown["total"] - breakdown["non_torch"]


def _rel(predicted: float | None, measured: float | None) -> float | None:
    if predicted is None or measured is None or measured == 0:
        return None
    return predicted / measured - 1.0


def compare(layout: Layout, measured_row: dict[str, Any] | None, predicted: dict[str, Any], gpu: GPUSpec | None):
    """One comparison row: measured (with derived tokens/s/GPU and MFU) vs predicted, relative errors."""
    row: dict[str, Any] = {
        "layout_id": layout.layout_id,
        "label": layout.label,
        "layout": layout.to_dict(),
        "predicted": predicted,
        "status": "pending",
    }
    if measured_row is not None:
        for key in (
            "status",
            "failure_kind",
            "error",
            "traceback",
            "layer_spec",
            "gradient_accumulation_fusion",
            "env",
            "per_rank",
            "traces",
            "log_tail",
            "stand_in",
            "packing",
            "activation_offload",
        ):
            if key in measured_row:
                row[key] = measured_row[key]
    m = dict((measured_row or {}).get("measured") or {})
    step = m.get("step_time_s")
    workload = layout.workload()
    if step:
        # packed: the real (unpadded) tokens the run trained on
        if layout.packed:
            tokens = sum(layout.packing_plan().lengths)
        else:
            tokens = workload.global_batch_size * workload.seq_length
        m["tokens_per_s_per_gpu"] = tokens / step / layout.num_gpus
        flops = predicted.get("model_flops_per_iteration")
        if flops and gpu is not None:
            m["mfu"] = flops / step / layout.num_gpus / (gpu.bf16_tflops * 1e12)
    row["measured"] = m
    fits = predicted.get("fits")
    row["predicted_oom"] = None if fits is None else not fits
    row["measured_oom"] = row["status"] == "failed" and row.get("failure_kind") == "oom"
    decided = row["status"] == "ok" or row["measured_oom"]
    row["oom_as_predicted"] = None if fits is None or not decided else row["measured_oom"] == (not fits)
    timed = not m.get("memory_history") and not m.get("stand_in")
    allocator_comparable = bool(m.get("peak_gib") or m.get("stand_in"))
    row["error_rel"] = {
        "step_time": _rel(predicted.get("step_time_s"), step) if timed else None,
        "peak_memory": _rel(predicted.get("peak_memory_gib"), m.get("peak_gib")),
        # the allocator's own peak (torch.cuda.max_memory_allocated) against the prediction without its allowance
        # (memory outside the allocator and reserved-but-unallocated): tensors alone
        "allocated_memory": _rel(predicted_allocated_gib(predicted), m.get("max_allocated_gib"))
        if allocator_comparable
        else None,
        # the allocator's reservation (torch.cuda.max_memory_reserved) against the prediction without the memory
        # outside it: what a memory stand-in measures in place of the device's peak
        "reserved_memory": _rel(predicted_reserved_gib(predicted), m.get("max_reserved_gib"))
        if allocator_comparable
        else None,
        "mfu": _rel(predicted.get("mfu"), m.get("mfu")) if timed else None,
    }
    if layout.activation_offload is not None:
        # fine-grained: bytes copied to host memory by one micro-batch, predicted vs megatron-core's own count after
        # its warm-up (`offload_copied_gib`)
        row["error_rel"]["offloaded_memory"] = _rel(predicted.get("offload_copied_gib"), m.get("offloaded_gib"))
    return row
