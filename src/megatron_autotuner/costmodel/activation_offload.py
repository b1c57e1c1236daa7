"""Time of activation offloading: how long the host copies take and how much of it the compute does not hide.

What megatron-core does (read in NVIDIA/Megatron-LM@d98e8a6 and NVIDIA/TransformerEngine main; the GPU machine runs
megatron-core 0.19.2 / TE 2.20.2, whose code paths are the same):

Fine-grained (`--fine-grained-activation-offloading --offload-modules ...`,
megatron/core/pipeline_parallel/fine_grained_activation_offload.py):
- forward: at the end of each offloaded module (`group_offload` -> `on_group_commit_forward`) the D2H stream waits
  for the compute stream, then copies the group's saved tensors into pinned host buffers (`bulk_offload_group`,
  its own `d2h_stream`); the compute stream goes on and never waits for it (no wait unless
  `--fine-grained-offloading-max-inflight-offloads`), but a tensor's GPU memory is reused only once its copy ends
  (`record_stream`) and every reload waits for its group's copy (`bulk_reload_group`: `wait_offload_event`).
- backward: when a group's backward ends (`on_group_start_backward`, the backward of the group's input) the H2D
  stream reloads the previous group in forward order (`bulk_reload`: one group of prefetch); the compute stream
  waits for that reload where the group's backward starts (`on_group_commit_backward`: `wait_reload_event`). So a
  reload overlaps exactly the backward of what runs between the two groups in forward order: nothing for adjacent
  modules (core_attn right after attn_proj), most of a layer for one module per layer.
D2H and H2D use separate streams and copy engines (PCIe is full duplex).

Layer-level (`--cpu-offloading-num-layers N`, transformer_engine/pytorch/cpu_offload.py `DefaultOffloadSynchronizer`,
TE >= 2.10 without NVTE_CPU_OFFLOAD_V1): one offload stream carries both directions. Layer i < N is copied once
layer i + 1 starts its forward and must be done before layer L - N + i starts (the compute stream waits,
`release_activation_forward_gpu_memory`); its reload starts before the backward of layer L - 1 - N + i and the
compute stream waits for it at layer i's backward (`pop_tensor`). `layer_level_exposed_s` runs that schedule.

The model, per micro-batch on one rank:
- fine-grained forward: a layer's groups are copied while the forward goes on; the D2H stream must move a layer's
  bytes per layer of compute, exposed = max(0, copy - window) per offloaded layer, window = the layer's forward
  (its backward too on a rank whose micro-batch waits for others' backward before its own: there the backlog drains
  in the other micro-batches' backward). What the D2H stream falls behind by is paid when the reloads wait for it.
- fine-grained backward: per group, exposed = max(0, reload - window), window = the backward of the layer's work
  between that group and the next offloaded one (`backward_windows_s`).
- layer-level: `layer_level_exposed_s`.
Reported as the step's "offload" component (time_breakdown_s["offload"]).

Copy bandwidth: `concurrent_copy_gbps` when given, else the calibration's measured table
(`Calibration.host_copy_gbps`, pinned, at the size of one layer's copies: the rows measured beside bf16 GEMMs,
`mat profile --mode copy-bandwidth --copy-interference gemm`, else the copy alone; on an H100 the two agree within
2.2% from 64 MiB up and differ by up to 21% either way at 1-4 MiB, benchmarks/results/testbench_h100_x1/host_floor),
else the GPU's host link (`GPUSpec.host_link_gbps`, a spec peak). Host buffers are pinned in both mechanisms
(`OffloadTensorPool(pin_memory=True)`; TE `torch.empty_like(..., pin_memory=True)`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..errors import ConfigError
from ..specs.hardware import GPUSpec
from ..specs.model import ModelSpec
from ..theory.memory import OffloadGroup

D2H = "d2h"
H2D = "h2d"
# A layer's backward work in forward order, as `backward_units_s` splits it; each offload module sits on one unit.
UNIT_ORDER = (
    "attn_norm",
    "qkv_linear",
    "core_attn",
    "attn_proj",
    "mlp_norm",
    "router",
    "expert_fc1",
    "moe_act",
    "mlp_rest",
    "other",
)
_UNIT_GEMMS = {
    "qkv_linear": ("qkv", "q_proj", "q_down", "q_up", "kv_down", "kv_up"),
    "attn_proj": ("proj",),
    "router": ("router",),
    "expert_fc1": ("experts_fc1",),
    "mlp_rest": ("experts_fc2", "shared_fc1", "shared_fc2", "fc1", "fc2"),
}


def offload_copy_gbps(
    gpu: GPUSpec,
    calibration: Any,
    direction: str,
    nbytes: float,
    concurrent_copy_gbps: float | None = None,
) -> tuple[float, str]:
    """(GB/s, source) of an activation copy of `nbytes` in `direction` (pinned host memory): `concurrent_copy_gbps`,
    else the calibration's measured host-copy table (beside GEMMs, else alone), else the GPU's host link (spec
    peak)."""
    if direction not in (D2H, H2D):
        raise ConfigError("direction", f"must be h2d or d2h, got {direction!r}")
    if concurrent_copy_gbps is not None:
        if not concurrent_copy_gbps > 0:
            raise ConfigError("concurrent_copy_gbps", f"must be > 0, got {concurrent_copy_gbps!r}")
        return float(concurrent_copy_gbps), "given (copy beside compute)"
    if calibration is not None:
        # the copies run beside the layers' kernels: the table measured beside GEMMs first, else the copy alone
        for interference in ("gemm", "none"):
            measured = calibration.host_copy_gbps(direction, True, int(max(nbytes, 1)), interference=interference)
            if measured:
                where = "beside GEMMs" if interference == "gemm" else "alone"
                return float(measured), f"measured {where} ({calibration.source or 'calibration'})"
    if gpu.host_link_gbps is None:
        raise ConfigError(
            "gpu.host_link_gbps",
            f"unknown for {gpu.name}: activation offloading needs host_link_gbps in --hardware-file or a calibration "
            "with a host-copy table",
        )
    return float(gpu.host_link_gbps), f"spec peak ({gpu.name} host link, not measured)"


def exposed_s(copy_s: float, window_s: float) -> float:
    """Copy time the compute does not hide: max(0, copy - window)."""
    return max(0.0, copy_s - window_s)


def backward_units_s(model: ModelSpec, layer_index: int, shapes: dict, bwd: dict[str, float]) -> dict[str, float]:
    """A layer's backward seconds (`bwd`: by class, one micro-batch) split over `UNIT_ORDER`: core attention (and its
    CP exchange) is core_attn's; the GEMM time is shared out by FLOPs over the GEMMs of each unit (`shapes`:
    `costmodel.layer.gemm_shapes`); the EP all-to-all half to the router (dispatch) and half to the rest of the MLP
    (combine); everything else (memory-bound kernels, TP collectives, recompute, host time) is "other", at the end of
    the layer (the residual, norm and dropout work around the layer boundary)."""
    flops = {op: 2.0 * m * n * k * g for op, (m, n, k, g) in shapes.items()}
    total_flops = sum(flops.values()) or 1.0
    gemm = bwd.get("gemm", 0.0)
    units = dict.fromkeys(UNIT_ORDER, 0.0)
    for unit, ops in _UNIT_GEMMS.items():
        units[unit] = gemm * sum(flops.get(op, 0.0) for op in ops) / total_flops
    units["core_attn"] = bwd.get("attention", 0.0) + bwd.get("cp", 0.0)
    ep = bwd.get("ep", 0.0)
    if model.is_moe_layer(layer_index):
        units["router"] += ep / 2
        units["mlp_rest"] += ep / 2
    else:
        units["mlp_rest"] += ep
    units["other"] = max(0.0, sum(bwd.values()) - sum(units.values()))
    return units


def backward_windows_s(modules: tuple[str, ...], units: dict[str, float]) -> dict[str, float]:
    """For each offloaded module of a layer: the backward seconds between the end of the next offloaded module's
    backward (forward order, wrapping to the next layer's first) and the start of its own, the time its reload has.
    One module per layer: the whole layer's backward but its own."""
    order = [u for u in UNIT_ORDER]
    positions = sorted(order.index(m) for m in modules)
    n = len(order)
    windows: dict[str, float] = {}
    for i, p in enumerate(positions):
        nxt = positions[(i + 1) % len(positions)] + (n if i + 1 == len(positions) else 0)
        windows[order[p]] = sum(units[order[q % n]] for q in range(p + 1, nxt))
    return windows


@dataclass(frozen=True)
class LayerOffloadTime:
    """One layer, one micro-batch: copy seconds each way and the exposed part, forward and backward."""

    d2h_s: float
    h2d_s: float
    exposed_fwd_s: float
    exposed_bwd_s: float


def fine_grained_layer_time(
    groups: tuple[OffloadGroup, ...],
    fwd_window_s: float,
    bwd_units_s: dict[str, float],
    d2h_gbps: float,
    h2d_gbps: float,
) -> LayerOffloadTime:
    """Exposed seconds of one fully offloaded layer (module doc): forward max(0, D2H - `fwd_window_s`), backward the
    sum over groups of max(0, reload - `backward_windows_s`)."""
    if not groups:
        return LayerOffloadTime(0.0, 0.0, 0.0, 0.0)
    copied = sum(g.copied_bytes for g in groups)
    d2h = copied / (d2h_gbps * 1e9)
    h2d = copied / (h2d_gbps * 1e9)
    windows = backward_windows_s(tuple(g.module for g in groups), bwd_units_s)
    bwd = sum(exposed_s(g.copied_bytes / (h2d_gbps * 1e9), windows[g.module]) for g in groups)
    return LayerOffloadTime(d2h, h2d, exposed_s(d2h, fwd_window_s), bwd)


def layer_level_exposed_s(
    fwd_s: list[float],
    bwd_s: list[float],
    d2h_s: list[float],
    h2d_s: list[float],
    num_offloaded: int,
    head_s: float,
) -> tuple[float, float]:
    """(forward, backward) seconds one micro-batch waits for Transformer Engine's layer-level offload
    (`DefaultOffloadSynchronizer`): layers 0..L-1 with forward / backward seconds `fwd_s` / `bwd_s`, the first
    `num_offloaded` copied out (`d2h_s`) and back (`h2d_s`) on one stream, `head_s` of work between the last
    forward and the first backward (the output layer and loss). Event times on one compute and one copy stream:

        layer j starts forward:  copy of layer j - 1 queued (if offloaded);
                                 compute waits for the copy of layer j - (L - N) to end
        layer j starts backward: reload of layer j - (L - 1 - N) queued;
                                 compute waits for layer j's reload (if offloaded)
    """
    layers = len(fwd_s)
    n = num_offloaded
    if not 0 <= n < layers:
        raise ConfigError("cpu_offloading_num_layers", f"{n} must be below the {layers} layers")
    t = 0.0
    stream = 0.0
    copied_at: dict[int, float] = {}
    waited_fwd = 0.0
    for j in range(layers):
        if 0 <= j - 1 < n:
            stream = max(stream, t) + d2h_s[j - 1]
            copied_at[j - 1] = stream
        i = j - (layers - n)
        if 0 <= i < n:
            waited_fwd += max(0.0, copied_at[i] - t)
            t = max(t, copied_at[i])
        t += fwd_s[j]
    t += head_s
    reloaded_at: dict[int, float] = {}
    waited_bwd = 0.0
    for j in range(layers - 1, -1, -1):
        i = j - (layers - 1 - n)
        if 0 <= i < n:
            stream = max(stream, t) + h2d_s[i]
            reloaded_at[i] = stream
        if j < n:
            waited_bwd += max(0.0, reloaded_at[j] - t)
            t = max(t, reloaded_at[j])
        t += bwd_s[j]
    return waited_fwd, waited_bwd
