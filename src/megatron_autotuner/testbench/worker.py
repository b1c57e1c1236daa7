"""torchrun entry point: measure every case of a job file on this rank.

    torchrun --nproc-per-node W -m megatron_autotuner.testbench.worker --cases job.json --out-dir D --mode collect

Each case: initialise megatron-core model parallelism for its tp / cp / ep, build the operator,
measure, append one record to D/collect/rank_<r>.jsonl, tear down. A failing case (OOM, error) is
recorded as failed and the job goes on. Rank 0 writes the id of the case it is on to
D/collect/current_case.txt so the launcher can tell which case hung.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import traceback
from pathlib import Path
from typing import Any

from ..launch import append_record, exit_with_owner
from ..launch.environment import environment
from ..specs import GPU_PRESETS
from .cases import Case
from .estimates import estimate_case
from .measure import add_rates, export_trace_gz, measure_operator, ratios
from .results import rank_file


def gpu_preset_for(device_name: str) -> str | None:
    """Map torch's device name ('NVIDIA H100 80GB HBM3', 'NVIDIA H200') to a GPU preset."""
    name = device_name.upper()
    for key, preset in (("H200", "H200"), ("H100", "H100-SXM"), ("B200", "B200"), ("GB200", "GB200")):
        if key in name:
            return preset
    if "A100" in name:
        return "A100-80GB" if "80GB" in name else "A100-40GB"
    return None


def _init(device: str) -> tuple[int, int]:
    import torch

    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if device == "cuda":
        torch.cuda.set_device(local)
    torch.distributed.init_process_group(backend="nccl" if device == "cuda" else "gloo")
    return rank, world


def _setup_parallel(case: Case, device: str) -> None:
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

    parallel_state.initialize_model_parallel(
        tensor_model_parallel_size=case.tp,
        pipeline_model_parallel_size=1,
        context_parallel_size=case.cp,
        expert_model_parallel_size=case.ep,
        expert_tensor_parallel_size=case.etp,
    )
    if device == "cuda":
        model_parallel_cuda_manual_seed(1234)
    else:
        import torch

        torch.manual_seed(1234)


def _profile(op, case: Case, out_dir: Path, rank: int, steps: int) -> str:
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    trace_dir = out_dir / "torch_profiler" / case.case_id
    trace_dir.mkdir(parents=True, exist_ok=True)
    activities = [ProfilerActivity.CPU, ProfilerActivity.CUDA]
    with profile(activities=activities, record_shapes=True) as prof:
        for _ in range(steps):
            for p in op.module.parameters():
                p.grad = None
            with record_function(f"{case.op}.fwd"):
                out = op.forward()
            with record_function(f"{case.op}.bwd"):
                op.backward(out)
            torch.cuda.synchronize()
    gz = export_trace_gz(prof, trace_dir / f"rank_{rank}.json.gz")
    return str(gz.relative_to(out_dir))


def _memory_snapshot(op, case: Case, out_dir: Path, rank: int) -> dict[str, str]:
    import pickle

    import torch

    snap_dir = out_dir / "memory_snapshot" / case.case_id
    snap_dir.mkdir(parents=True, exist_ok=True)
    torch.cuda.memory._record_memory_history(max_entries=200_000)
    for p in op.module.parameters():
        p.grad = None
    op.backward(op.forward())
    torch.cuda.synchronize()
    snapshot = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    pickle_path = snap_dir / f"rank_{rank}.pickle"
    with open(pickle_path, "wb") as f:
        pickle.dump(snapshot, f)
    from torch.cuda._memory_viz import trace_plot

    html_path = snap_dir / f"rank_{rank}.html"
    html_path.write_text(trace_plot(snapshot))
    return {"pickle": str(pickle_path.relative_to(out_dir)), "html": str(html_path.relative_to(out_dir))}


def run_case(case: Case, args: argparse.Namespace, rank: int, world: int, env: dict[str, Any]) -> dict[str, Any]:
    import torch
    from megatron.core import parallel_state

    from .operators import build_operator, uses_bias_activation_fusion

    out_dir = Path(args.out_dir)
    record: dict[str, Any] = {
        "case_id": case.case_id,
        "case": case.to_dict(),
        "rank": rank,
        "world_size": world,
        "mode": args.mode,
        "env": env,
    }
    estimated = estimate_case(case)
    record["estimated"] = estimated
    if case.max_token_len is not None:
        # the packed row measured: tokens and sum of s_i^2 (the estimate above is for seq_length x micro-batch)
        record["packing"] = case.packed_micro_batch().summary()
    op = None
    try:
        if os.environ.get("MAT_TESTBENCH_HANG_OP") == case.op:
            # fault injection for the launcher's tests: behave like a hung NCCL / userbuffers case
            import time

            time.sleep(3600)
        _setup_parallel(case, args.device)
        if args.device == "cuda":
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
        op = build_operator(case, args.device)
        weights_alloc = torch.cuda.memory_allocated() - base if args.device == "cuda" else None
        record["layer_spec"] = op.layer_spec
        record["bias_activation_fusion"] = uses_bias_activation_fusion(case.model_spec())
        record["description"] = op.description
        real = measure_operator(op, args.warmup, args.repeats, args.device, weights_alloc)
        preset = gpu_preset_for(env["device"]) if args.device == "cuda" else None
        peak = GPU_PRESETS[preset].peak_tflops(case.dtype) if preset else None
        record["gpu_preset"] = preset
        record["real"] = add_rates(real, estimated, peak)
        record["ratio"] = ratios(real, estimated)
        if args.mode == "torch-profile" and args.device == "cuda":
            record["trace"] = _profile(op, case, out_dir, rank, args.profile_steps)
        if args.mode == "memory-snapshot" and args.device == "cuda":
            record["memory_snapshot"] = _memory_snapshot(op, case, out_dir, rank)
        record["status"] = "ok"
        record["error"] = None
    except Exception as exc:  # noqa: BLE001 - a failing case is recorded, the job goes on
        oom = args.device == "cuda" and isinstance(exc, torch.cuda.OutOfMemoryError)
        record["status"] = "failed"
        record["error"] = ("OOM: " if oom else "") + f"{type(exc).__name__}: {exc}".splitlines()[0][:500]
        record["traceback"] = traceback.format_exc()[-3000:]
    finally:
        del op
        if args.device == "cuda":
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
        parallel_state.destroy_model_parallel()
    return record


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--cases", required=True, help="JSON list of case objects (one world size)")
    parser.add_argument("--out-dir", required=True)
    parser.add_argument("--mode", default="collect", choices=["collect", "torch-profile", "memory-snapshot", "nsys"])
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--profile-steps", type=int, default=2)
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"], help="cpu: functional tests only")
    args = parser.parse_args(argv)
    exit_with_owner()
    cases = [Case.from_dict(c) for c in json.loads(Path(args.cases).read_text())]
    rank, world = _init(args.device)
    env = environment(args.device)
    out_dir = Path(args.out_dir)
    current = out_dir / "collect" / "current_case.txt"
    import torch

    for case in cases:
        if case.world_size != world:
            raise SystemExit(f"case {case.case_id} needs {case.world_size} ranks, job has {world}")
        if rank == 0:
            current.parent.mkdir(parents=True, exist_ok=True)
            current.write_text(case.case_id)
        torch.distributed.barrier()
        record = run_case(case, args, rank, world, env)
        append_record(rank_file(out_dir, rank), record)
        if rank == 0:
            status = record["status"]
            detail = record.get("error") or f"{record['real']['fwd_bwd_ms']['median']:.3f} ms"
            print(f"[{status}] {case.case_id}: {detail}", flush=True)
    if rank == 0 and current.exists():
        current.unlink()
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
