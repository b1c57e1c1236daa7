"""CPU offload of a colocated verl step: which tensors move between GPU and host, how many bytes per rank, and how
long the copies take.

What verl does (verl 0.9.1, `verl/utils/megatron_utils.py`; the legacy worker of volcengine/verl@b178a3c,
`verl/workers/megatron_workers.py`, calls the same functions):

- `actor.megatron.param_offload` -> `offload_megatron_model_to_cpu`: for every DDP buffer of the model chunks, the
  bf16 parameter buffer (`buffer.param_data`) is copied device-to-host into a *pinned* host buffer allocated once
  (`torch.empty(..., pin_memory=True)`), synchronously (`copy_(..., non_blocking=False)`), then its GPU storage is
  freed (`storage().resize_(0)`). The main-grad buffer (`buffer.grad_data`, fp32 with verl's default
  grad_reduce_in_fp32) is *not copied*: its storage is freed and, on `load_megatron_model_to_gpu(load_grad=True)`,
  re-allocated and zeroed on the GPU (a memset, no host traffic). `load_megatron_model_to_gpu` copies the bf16
  buffer back host-to-device from the pinned buffer (`copy_(cpu_data, non_blocking=True)`).
- `actor.megatron.optimizer_offload` -> `offload_megatron_optimizer`: the distributed optimizer's fp32 master
  shard (`shard_fp32_from_float16_groups`, megatron-core `DistributedOptimizer`) and Adam's `exp_avg` /
  `exp_avg_sq` (fp32) go `.to("cpu", non_blocking=True)`; PyTorch allocates the destination of a non-blocking
  CUDA->CPU copy pinned (`_to_copy`, aten/src/ATen/native/TensorConversions.cpp: `pin_out = non_blocking &&
  self.is_cuda() && options.device().is_cpu()`), so these copies are pinned both ways (`load_megatron_optimizer`
  brings them back with `.to(device, non_blocking=True)`). Without the distributed optimizer megatron-core keeps the
  fp32 masters in `fp32_from_float16_groups` (`Float16OptimizerWithFloat16Params`), which verl does not move: only
  the two moments (8 of the 12 bytes per parameter) leave the GPU.
- `grad_offload` (b178a3c only) is read into `_is_offload_grad` and used nowhere (megatron_workers.py:363); verl
  0.9.1 has no such key. Gradients follow `param_offload`, as above.
- The reference model (a forward-only engine, not wrapped in DDP: transformer_impl.py `wrap_with_ddp = False` for
  `forward_only`) with `ref.megatron.param_offload`: each parameter `param.data.to("cpu")` -- blocking, so a
  *pageable* destination -- and back with `.to(device, non_blocking=True)` from pageable memory.

When (verl 0.9.1 `verl/workers/engine/base.py` BaseEngineCtx._context_switch, `engine_workers.py`
ActorRolloutRefWorker.update_weights): every pass loads what it needs on entry and offloads on exit. Train mode
(actor update) loads parameters, grads and (with optimizer_offload) optimizer state; eval mode (old / ref
log-prob) loads parameters only; the weight sync loads parameters (`get_per_tensor_param`,
`load_grad=False`) and offloads them before the rollout's KV cache is resumed.

Time of one copy = bytes / bandwidth(direction, pinned, bytes): a measured host-copy table of the calibration
(`Calibration.host_copy_gbps`) when it has one, else the GPU preset's host link (`GPUSpec.host_link_gbps`, a spec
peak: real pinned copies reach somewhat less, pageable ones much less). The copies of one buffer are issued back to
back on one stream, so the table is read at the size of the whole buffer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..costmodel.compute import memory_bound_time_s
from ..errors import ConfigError
from ..specs.hardware import GPUSpec
from ..specs.model import ModelSpec
from ..specs.parallel import ParallelConfig, Workload
from ..theory.memory import FP32_BYTES, GIB, StageMemory, memory_per_stage

H2D = "h2d"
D2H = "d2h"
DIRECTIONS = (H2D, D2H)


@dataclass(frozen=True)
class ModelStateBytes:
    """Per-rank bytes of one training engine's model state (the pipeline rank with the most, which the others wait
    for), from `theory.memory`: bf16 weights, the main-grad buffer, Adam's state (fp32 master + two moments, a 1/dp
    shard with the distributed optimizer)."""

    stage: int
    params_bytes: float
    grads_bytes: float
    optimizer_bytes: float
    distributed_optimizer: bool

    @property
    def optimizer_moved_bytes(self) -> float:
        """What `offload_megatron_optimizer` moves: all of it with the distributed optimizer (master shard + moments,
        12 bytes per parameter of the shard); without it the two moments only (8 of 12: the fp32 masters in
        `fp32_from_float16_groups` stay)."""
        if self.distributed_optimizer:
            return self.optimizer_bytes
        return self.optimizer_bytes * (2 * FP32_BYTES) / (3 * FP32_BYTES)

    def to_dict(self) -> dict[str, Any]:
        return {
            "stage": self.stage,
            "params_gib": self.params_bytes / GIB,
            "grads_gib": self.grads_bytes / GIB,
            "optimizer_gib": self.optimizer_bytes / GIB,
            "optimizer_moved_gib": self.optimizer_moved_bytes / GIB,
        }


def model_state_bytes(model: ModelSpec, parallel: ParallelConfig, workload: Workload) -> ModelStateBytes:
    """`theory.memory.memory_per_stage` weights / gradients / optimizer of the rank that holds the most (training
    mode: a forward-only engine has no grads or optimizer). bf16 only: verl's param buffer is bf16."""
    if workload.precision != "bf16":
        raise ConfigError("precision", "the offload model covers bf16 training (verl's param buffer dtype)")
    stages = memory_per_stage(model, parallel, workload, padded_vocab_size=model.padded_vocab_size(parallel.tp))
    top: StageMemory = max(stages, key=lambda st: st.model_state_bytes)
    return ModelStateBytes(
        stage=top.stage,
        params_bytes=top.weights_bytes,
        grads_bytes=top.gradients_bytes,
        optimizer_bytes=top.optimizer_bytes,
        distributed_optimizer=parallel.use_distributed_optimizer,
    )


def host_copy_gbps(gpu: GPUSpec, calibration: Any, direction: str, pinned: bool, nbytes: float) -> tuple[float, str]:
    """(GB/s, source) of one host copy: the calibration's measured table (`host_copy_gbps(direction, pinned,
    nbytes)`, None where not measured) when present, else `gpu.host_link_gbps` (spec peak)."""
    if direction not in DIRECTIONS:
        raise ConfigError("direction", f"must be h2d or d2h, got {direction!r}")
    table = getattr(calibration, "host_copy_gbps", None) if calibration is not None else None
    if callable(table):
        measured = table(direction, pinned, int(nbytes))
        if measured:
            return float(measured), f"measured ({getattr(calibration, 'source', 'calibration')})"
    if gpu.host_link_gbps is None:
        raise ConfigError(
            "gpu.host_link_gbps",
            f"unknown for {gpu.name}: give host_link_gbps in --hardware-file, or a calibration with a host-copy table",
        )
    return gpu.host_link_gbps, f"spec peak ({gpu.name} host link, not measured)"


@dataclass(frozen=True)
class HostCopy:
    """One transfer between GPU and host: time_s = nbytes / (gbps * 1e9)."""

    tensor: str
    direction: str
    pinned: bool
    dtype: str
    nbytes: float
    gbps: float
    source: str

    @property
    def time_s(self) -> float:
        return self.nbytes / (self.gbps * 1e9) if self.nbytes > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "tensor": self.tensor,
            "direction": self.direction,
            "pinned": self.pinned,
            "dtype": self.dtype,
            "gib": self.nbytes / GIB,
            "gbps": self.gbps,
            "bandwidth_source": self.source,
            "time_s": self.time_s,
        }


def host_copy(
    tensor: str, direction: str, pinned: bool, dtype: str, nbytes: float, gpu: GPUSpec, calibration: Any = None
) -> HostCopy:
    gbps, source = host_copy_gbps(gpu, calibration, direction, pinned, nbytes)
    return HostCopy(tensor, direction, pinned, dtype, nbytes, gbps, source)


@dataclass(frozen=True)
class Transition:
    """Loading (onto the GPU) or offloading one engine's state around a pass: host copies plus the GPU-side
    re-allocation and zeroing of the grad buffer (a memset of `grads_bytes` at HBM speed)."""

    name: str
    copies: tuple[HostCopy, ...]
    memset_bytes: float
    memset_s: float

    @property
    def time_s(self) -> float:
        return sum(c.time_s for c in self.copies) + self.memset_s

    @property
    def moved_bytes(self) -> float:
        return sum(c.nbytes for c in self.copies)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "time_s": self.time_s,
            "moved_gib": self.moved_bytes / GIB,
            "grad_zero_gib": self.memset_bytes / GIB,
            "grad_zero_s": self.memset_s,
            "copies": [c.to_dict() for c in self.copies],
        }


def grad_dtype(parallel: ParallelConfig) -> str:
    return "fp32" if parallel.grad_reduce_in_fp32 else "bf16"


def load_state(
    name: str,
    state: ModelStateBytes,
    gpu: GPUSpec,
    calibration: Any,
    *,
    params: bool,
    grads: bool,
    optimizer: bool,
) -> Transition:
    """verl's `load_megatron_model_to_gpu(load_grad=grads)` (when `params`) and `load_megatron_optimizer` (when
    `optimizer`): H2D from pinned host buffers; the grad buffer is re-allocated and zeroed, not copied."""
    copies = []
    if params:
        copies.append(host_copy("params", H2D, True, "bf16", state.params_bytes, gpu, calibration))
    if optimizer:
        copies.append(host_copy("optimizer", H2D, True, "fp32", state.optimizer_moved_bytes, gpu, calibration))
    memset = state.grads_bytes if (params and grads) else 0.0
    return Transition(name, tuple(copies), memset, memory_bound_time_s(memset, gpu, 1) if memset else 0.0)


def offload_state(
    name: str, state: ModelStateBytes, gpu: GPUSpec, calibration: Any, *, params: bool, optimizer: bool
) -> Transition:
    """verl's `offload_megatron_model_to_cpu` (when `params`: bf16 params D2H into a pinned buffer, grad storage
    freed without a copy) and `offload_megatron_optimizer` (when `optimizer`: fp32 state D2H, pinned)."""
    copies = []
    if params:
        copies.append(host_copy("params", D2H, True, "bf16", state.params_bytes, gpu, calibration))
    if optimizer:
        copies.append(host_copy("optimizer", D2H, True, "fp32", state.optimizer_moved_bytes, gpu, calibration))
    return Transition(name, tuple(copies), 0.0, 0.0)


def ref_weights_bytes(model: ModelSpec, parallel: ParallelConfig) -> float:
    """bf16 weights per rank of the forward-only reference model (the rank with the most), `theory.memory`."""
    w = Workload(seq_length=1, mode="forward")
    stages = memory_per_stage(model, parallel, w, padded_vocab_size=model.padded_vocab_size(parallel.tp))
    return max(st.weights_bytes for st in stages)


def ref_transitions(weights_bytes: float, gpu: GPUSpec, calibration: Any) -> tuple[Transition, Transition]:
    """(load, offload) of the reference model with `ref.megatron.param_offload`: per-parameter `.to(device,
    non_blocking=True)` from, and `.to("cpu")` into, pageable host memory."""
    load = Transition(
        "load ref params", (host_copy("ref params", H2D, False, "bf16", weights_bytes, gpu, calibration),), 0, 0
    )
    off = Transition(
        "offload ref params", (host_copy("ref params", D2H, False, "bf16", weights_bytes, gpu, calibration),), 0, 0
    )
    return load, off


@dataclass(frozen=True)
class ResidentDuringRollout:
    """What a training engine leaves on the GPU while the rollout engine generates, and what offload freed."""

    resident_bytes: float
    freed_bytes: float

    def to_dict(self) -> dict[str, Any]:
        return {"resident_gib": self.resident_bytes / GIB, "freed_gib": self.freed_bytes / GIB}


def during_rollout(state: ModelStateBytes, *, param_offload: bool, optimizer_offload: bool) -> ResidentDuringRollout:
    """resident = params + grads (unless param_offload) + optimizer state (less what optimizer_offload moves);
    freed = the rest (params + grads with param_offload, the moved optimizer state with optimizer_offload)."""
    freed = 0.0
    if param_offload:
        freed += state.params_bytes + state.grads_bytes
    if optimizer_offload:
        freed += state.optimizer_moved_bytes
    total = state.params_bytes + state.grads_bytes + state.optimizer_bytes
    return ResidentDuringRollout(total - freed, freed)


__all__ = [
    "D2H",
    "H2D",
    "HostCopy",
    "ModelStateBytes",
    "ResidentDuringRollout",
    "Transition",
    "during_rollout",
    "host_copy",
    "host_copy_gbps",
    "load_state",
    "model_state_bytes",
    "offload_state",
    "ref_transitions",
    "ref_weights_bytes",
]
