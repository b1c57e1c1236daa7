"""Offload round trip of a megatron-core training state, the way verl moves it, measured against a prediction
made before the run.

    torchrun --standalone --nproc-per-node 1 benchmarks/validation/offload_roundtrip.py \
        --calibration OUT/copy_calibration.json --out OUT/offload_roundtrip.json

Builds a GPTModel (default Qwen3-8B reduced to 4 layers) with megatron-core DDP and the distributed optimizer on
one GPU (`validate.runner`: what `mat validate` trains), runs one training step so the optimizer state exists,
then `--repeats` times offloads and reloads it as verl/utils/megatron_utils.py does:
- offload_megatron_model_to_cpu (verl 0.9.1): per DDP buffer (`model.buffers`, `model.expert_parallel_buffers`)
  the bf16 `param_data` is copied synchronously into a pinned host buffer (`cpu_data`, allocated on the first
  offload and reused after: older verl re-pinned with `.cpu().pin_memory()` every time) and its storage freed;
  the fp32 `grad_data` storage is freed, not copied; then `empty_cache()`;
- offload_megatron_optimizer (through offload_megatron_copy_params): the distributed optimizer's fp32 master
  shards (`shard_fp32_from_float16_groups`) and Adam's `exp_avg` / `exp_avg_sq` go `.to("cpu", non_blocking=True)`
  (torch gives a non-blocking CUDA->CPU copy a pinned destination);
- load_megatron_model_to_gpu: grad storage re-allocated and zeroed, param storage re-allocated and filled from
  the pinned copy (`copy_(..., non_blocking=True)`);
- load_megatron_optimizer: master shards and Adam moments `.to(device, non_blocking=True)`.
Each phase is timed on the host around a CUDA synchronize (verl's callers wait for the moves the same way), and a
training step after the last reload checks that the state came back whole (finite loss).

Two predictions, written to the JSON before anything is timed: `predicted`, every tensor's bytes (counted on the
built objects) over the bandwidth the calibration's `host_copy` table gives for its size and direction
(`Calibration.host_copy_gbps`: pinned both ways), summed per phase; and
`predicted_offload_model`, what `mat rlhf`'s offload model (`rlhf.offload`: bytes from theory) says for the same
state. The first offload's pinning of host memory, the grad re-zeroing and empty_cache are not in them (no table
for them). Like verl's functions, no phase calls gc.collect: in a process that holds a model it took 0.26-0.35 s per
call on the H100 (measured with this script's laps), which is not a copy.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any


def _chained(optimizer: Any) -> list:
    return list(getattr(optimizer, "chained_optimizers", None) or [optimizer])


def _flat(groups: Any) -> list:
    out = []
    for g in groups or []:
        out.extend(g if isinstance(g, list) else [g])
    return [t for t in out if t is not None]


def state_tensors(model: list, optimizer: Any) -> dict[str, list]:
    """The tensors verl moves, by kind: param buffers, grad buffers (freed only), fp32 master shards, Adam moments."""
    params, grads = [], []
    for chunk in model:
        for buffer in [*chunk.buffers, *chunk.expert_parallel_buffers]:
            params.append(buffer.param_data)
            grads.append(buffer.grad_data)
    masters, moments = [], []
    for opt in _chained(optimizer):
        masters.extend(_flat(getattr(opt, "shard_fp32_from_float16_groups", None)))
        if opt.optimizer is not None:
            for state in opt.optimizer.state.values():
                moments.extend(state[k] for k in ("exp_avg", "exp_avg_sq") if k in state)
    return {"params": params, "grads": grads, "master_params": masters, "adam_moments": moments}


def nbytes(t) -> int:
    return t.numel() * t.element_size()


def predict(tensors: dict[str, list], calibration) -> dict[str, Any]:
    """Seconds per phase from the calibration's host copy bandwidths, per tensor size; None where unmeasured."""

    def seconds(kind: str, direction: str, pinned: bool) -> float | None:
        total = 0.0
        for t in tensors[kind]:
            gbps = calibration.host_copy_gbps(direction, pinned, nbytes(t)) if calibration else None
            if gbps is None:
                return None
            total += nbytes(t) / (gbps * 1e9)
        return total

    def add(*values):
        return None if any(v is None for v in values) else sum(values)

    phases = {
        "offload_model_s": seconds("params", "d2h", pinned=True),
        "offload_optimizer_s": add(seconds("master_params", "d2h", True), seconds("adam_moments", "d2h", True)),
        "load_model_s": seconds("params", "h2d", pinned=True),
        "load_optimizer_s": add(seconds("master_params", "h2d", True), seconds("adam_moments", "h2d", True)),
    }
    phases["round_trip_s"] = add(*phases.values())
    return phases


def predict_with_offload_model(layout, calibration, device_name: str) -> dict[str, Any]:
    """The `mat rlhf` offload model's prediction (`rlhf.offload`: bytes from theory, bandwidth from the calibration
    or the GPU preset's host link) for the same state and moves, made before timing."""
    from megatron_autotuner.rlhf.offload import load_state, model_state_bytes, offload_state
    from megatron_autotuner.specs import get_gpu_spec
    from megatron_autotuner.testbench.worker import gpu_preset_for

    preset = gpu_preset_for(device_name)
    if preset is None:
        return {"error": f"no GPU preset for {device_name!r}"}
    gpu = get_gpu_spec(preset)
    state = model_state_bytes(layout.model_spec(), layout.parallel(), layout.workload())
    off = offload_state("offload", state, gpu, calibration, params=True, optimizer=True)
    load = load_state("load", state, gpu, calibration, params=True, grads=True, optimizer=True)
    return {
        "state": state.to_dict(),
        "offload": off.to_dict(),
        "load": load.to_dict(),
        "round_trip_s": off.time_s + load.time_s,
    }


class _Laps:
    """Seconds per sub-step of the param-buffer phases (a CUDA synchronize at each lap), to find where their time
    goes beyond the copy."""

    def __init__(self) -> None:
        self.parts: dict[str, float] = {}
        self._t = 0.0

    def start(self) -> None:
        import torch

        torch.cuda.synchronize()
        self._t = time.perf_counter()

    def lap(self, name: str) -> None:
        import torch

        torch.cuda.synchronize()
        now = time.perf_counter()
        self.parts[name] = self.parts.get(name, 0.0) + now - self._t
        self._t = now


LAPS = _Laps()


def offload_model(model: list) -> None:
    """verl offload_megatron_model_to_cpu, DDP branch."""
    import torch

    LAPS.start()
    with torch.no_grad():
        for chunk in model:
            for buffer in [*chunk.buffers, *chunk.expert_parallel_buffers]:
                if buffer.param_data.untyped_storage().size() > 0:
                    if getattr(buffer.param_data, "cpu_data", None) is None:  # first offload: pin once
                        buffer.param_data.cpu_data = torch.empty(
                            buffer.param_data.size(), dtype=buffer.param_data.dtype, device="cpu", pin_memory=True
                        )
                    LAPS.lap("offload.pin")
                    buffer.param_data.cpu_data.copy_(buffer.param_data.data, non_blocking=False)
                    LAPS.lap("offload.copy_params")
                    buffer.param_data_size = buffer.param_data.untyped_storage().size()
                    buffer.param_data.untyped_storage().resize_(0)
                    LAPS.lap("offload.free_params")
                if buffer.grad_data.untyped_storage().size() > 0:
                    buffer.grad_data_size = buffer.grad_data.untyped_storage().size()
                    buffer.grad_data.untyped_storage().resize_(0)
                    LAPS.lap("offload.free_grads")
    torch.cuda.empty_cache()
    LAPS.lap("offload.empty_cache")


def load_model(model: list) -> None:
    """verl load_megatron_model_to_gpu(load_grad=True), DDP branch."""
    import torch

    LAPS.start()
    with torch.no_grad():
        for chunk in model:
            for buffer in [*chunk.buffers, *chunk.expert_parallel_buffers]:
                if hasattr(buffer, "grad_data_size"):
                    buffer.grad_data.untyped_storage().resize_(buffer.grad_data_size)
                    LAPS.lap("load.alloc_grads")
                    buffer.grad_data.zero_()
                    LAPS.lap("load.zero_grads")
                if buffer.param_data.untyped_storage().size() == 0:
                    buffer.param_data.untyped_storage().resize_(buffer.param_data_size)
                    LAPS.lap("load.alloc_params")
                    buffer.param_data.copy_(buffer.param_data.cpu_data, non_blocking=True)
                    LAPS.lap("load.copy_params")
    torch.cuda.empty_cache()
    LAPS.lap("load.empty_cache")


def move_optimizer(optimizer: Any, device: str) -> None:
    """verl offload_megatron_optimizer (device "cpu") / load_megatron_optimizer (device "cuda")."""
    import torch

    target = "cpu" if device == "cpu" else torch.cuda.current_device()
    with torch.no_grad():
        for opt in _chained(optimizer):
            for t in _flat(getattr(opt, "shard_fp32_from_float16_groups", None)):
                t.data = t.data.to(target, non_blocking=True)
            if opt.optimizer is not None:
                for state in opt.optimizer.state.values():
                    for k in ("exp_avg", "exp_avg_sq"):
                        if k in state:
                            state[k] = state[k].to(target, non_blocking=True)
    torch.cuda.empty_cache()


def timed(fn, *args) -> float:
    import torch

    torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn(*args)
    torch.cuda.synchronize()
    return time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="Qwen3-8B")
    parser.add_argument("--num-layers", type=int, default=4)
    parser.add_argument("--seq-length", type=int, default=4096)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--calibration", help="calibration JSON with a host_copy table (mat profile --mode copy-bandwidth)"
    )
    parser.add_argument("--out", required=True, help="JSON result path")
    args = parser.parse_args(argv)

    import torch

    from megatron_autotuner import __version__
    from megatron_autotuner.costmodel.calibration import load_calibration
    from megatron_autotuner.launch.environment import environment
    from megatron_autotuner.validate.layout import Layout
    from megatron_autotuner.validate.runner import (
        build_model,
        init_parallel,
        mock_iterators,
        train_step,
        wrap_for_training,
    )

    calibration = load_calibration(args.calibration) if args.calibration else None
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    torch.distributed.init_process_group(backend="nccl")
    layout = Layout(
        model=args.model, num_layers=args.num_layers, seq_length=args.seq_length, global_batch_size=1, name="offload"
    )
    init_parallel(layout, "cuda", 600)
    config, chunks = build_model(layout, "cuda", use_te=True)
    model, optimizer = wrap_for_training(layout, config, chunks, "cuda")
    del chunks
    iterators = mock_iterators(layout, model, "cuda")
    loss_before = train_step(layout, model, optimizer, iterators, "cuda")
    torch.cuda.synchronize()
    tensors = state_tensors(model, optimizer)
    out: dict[str, Any] = {
        "schema_version": 1,
        "tool_version": __version__,
        "kind": "offload-roundtrip",
        "env": environment("cuda"),
        "layout": layout.to_dict(),
        "calibration": args.calibration,
        "bytes": {kind: sum(nbytes(t) for t in ts) for kind, ts in tensors.items()},
        "tensors": {kind: len(ts) for kind, ts in tensors.items()},
        "copies": {
            "params": "D2H copy_ into a pinned buffer allocated on the first offload; back H2D, non_blocking",
            "grads": "storage freed on offload, re-allocated and zeroed on load: no bytes copied",
            "master_params": "D2H/H2D .to(..., non_blocking=True): pinned on the host",
            "adam_moments": "D2H/H2D .to(..., non_blocking=True): pinned on the host",
        },
        "predicted": predict(tensors, calibration),
        "predicted_offload_model": predict_with_offload_model(layout, calibration, torch.cuda.get_device_name()),
        "predicted_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
    }
    out["bytes"]["copied_each_way"] = sum(out["bytes"][k] for k in ("params", "master_params", "adam_moments"))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")  # the prediction is on disk before any timing
    del tensors
    runs = []
    for _ in range(args.repeats):
        allocated_before = torch.cuda.memory_allocated()
        LAPS.parts = {}
        run = {"offload_model_s": timed(offload_model, model)}
        run["offload_optimizer_s"] = timed(move_optimizer, optimizer, "cpu")
        run["allocated_offloaded_gib"] = torch.cuda.memory_allocated() / 2**30
        run["allocated_before_gib"] = allocated_before / 2**30
        run["load_model_s"] = timed(load_model, model)
        run["load_optimizer_s"] = timed(move_optimizer, optimizer, "cuda")
        run["round_trip_s"] = sum(
            run[k] for k in ("offload_model_s", "offload_optimizer_s", "load_model_s", "load_optimizer_s")
        )
        run["param_phase_laps_s"] = dict(LAPS.parts)
        runs.append(run)
        print(json.dumps(run), flush=True)
    loss_after = train_step(layout, model, optimizer, iterators, "cuda")
    # the first round trip allocates the pinned host buffers (cudaHostAlloc); a training run pays that once, every
    # later step pays the steady state, which is what the prediction is for
    steady = runs[1:] or runs
    measured = {k: statistics.median(r[k] for r in steady) for k in out["predicted"]}
    out.update(
        measured=measured,
        first_round_trip=runs[0],
        runs=runs,
        loss_before=loss_before,
        loss_after_reload=loss_after,
        state_restored=loss_after is not None and math.isfinite(loss_after),
        error_rel={
            k: (out["predicted"][k] / measured[k] - 1.0) if out["predicted"][k] and measured[k] else None
            for k in measured
        },
    )
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps({"predicted": out["predicted"], "measured": measured, "bytes": out["bytes"]}, indent=1))
    torch.distributed.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
