"""Check a tuned ub yaml in a real megatron-core TE TransformerLayer: fwd+bwd ms with NCCL, TE default, tuned.

    torchrun --nproc-per-node 2 -m megatron_autotuner.overlap.layer_check --model Llama-3.1-8B \
        --seq-len 8192 --yaml optimal_tp_comm_overlap_cfg_tp2.yaml --out result.json

One layer from the TE spec (megatron-core `get_gpt_layer_with_transformer_engine_spec`), TP = world
size, sequence parallel, bf16, micro-batch 1, no RoPE. Setups, in this order, `--passes` times:
`nccl` (tp_comm_overlap=False), `te_default` (tp_comm_overlap=True, initialize_ub without ub_cfgs),
`tuned` (initialize_ub with the yaml). Userbuffers are re-initialised between setups (destroy_ub).
Rank 0 writes medians (CUDA events) and the speedup tuned / te_default to `--out`. On one GPU (TP 1) only the
plain layer runs (`nccl`; no userbuffers, no yaml): the baseline of the whole-layer TP scaling check
(`scaling.whole_layer_scaling`, which the tuning report reads from `layer_check*.json` in its folder).

Order (`measure_setups`): TE asserts at construction that userbuffers exist for a module with
overlap flags ("initialize_ub() must be called before layer construction", TE 2.x), so the overlap
layer is built once, after the first `initialize_ub`, and reused: TE modules look their communicators
up by name at every forward / backward (`get_ub`), so a re-initialisation with other ub_cfgs takes
effect without rebuilding (the tuner's TE backend does the same).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..files import write_text_atomic

SETUPS = ("nccl", "te_default", "tuned")


def _time(module, x, dy, warmup: int, repeats: int) -> list[float]:
    import torch

    def step():
        x.grad = None
        for p in module.parameters():
            p.grad = None
        out = module(x, attention_mask=None)
        out = out[0] if isinstance(out, tuple) else out
        return out

    for _ in range(warmup):
        step().backward(dy)
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        step().backward(dy)
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return times


def measure_setups(
    build_layer: Callable[[bool], Any],
    init_ub: Callable[[dict | None], None],
    destroy_ub: Callable[[], None],
    time_layer: Callable[[Any], float],
    tuned_cfg: dict,
    passes: int,
    ms: dict[str, list[float]] | None = None,
    setups: tuple[str, ...] = SETUPS,
) -> dict[str, list[float]]:
    """Median ms per pass of each setup, appended to `ms` (what was measured stays there after an error).

    `build_layer(overlap)` builds a layer (tp_comm_overlap on or off); `init_ub(cfg)` initialises
    userbuffers (cfg None: TE default); `time_layer(layer)` times fwd+bwd. The overlap layer is built
    after the first init_ub (TE refuses it before); userbuffers left initialised are destroyed on the
    way out, also after an error."""
    ms = {s: [] for s in setups} if ms is None else ms
    layers = {False: build_layer(False)}
    live = False
    try:
        for _ in range(passes):
            for setup in setups:
                overlap = setup != "nccl"
                if overlap:
                    if live:
                        destroy_ub()
                        live = False
                    init_ub(tuned_cfg if setup == "tuned" else None)
                    live = True
                    if True not in layers:
                        layers[True] = build_layer(True)
                ms[setup].append(time_layer(layers[overlap]))
    finally:
        if live:
            destroy_ub()
    return ms


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", action="append", required=True)
    ap.add_argument("--seq-len", type=int, default=8192)
    ap.add_argument("--yaml", action="append", default=[], help="tuned yaml per --model (same order; not at TP 1)")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--passes", type=int, default=2)
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    import gc

    import torch
    import torch.distributed as dist
    import yaml
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed
    from megatron.core.transformer.spec_utils import build_module
    from transformer_engine.pytorch.module import base

    from ..launch.environment import environment
    from ..testbench.cases import Case
    from ..testbench.operators import build_transformer_config, layer_spec

    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    dist.init_process_group("nccl")
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=world)
    model_parallel_cuda_manual_seed(1234)
    results = {"env": environment("cuda"), "tp": world, "seq_len": args.seq_len, "models": {}}
    setups = SETUPS if world > 1 else ("nccl",)  # TP 1: the plain layer, the scaling baseline
    yamls = args.yaml if world > 1 else [None] * len(args.model)
    if len(yamls) != len(args.model):
        ap.error("give one --yaml per --model at TP > 1")
    for name, ypath in zip(args.model, yamls, strict=True):
        res: dict = {"yaml": ypath, "ms": {s: [] for s in setups}}
        try:
            case = Case(model=name, op="decoder", seq_length=args.seq_len, tp=world)
            spec = case.model_spec()
            tuned = yaml.safe_load(Path(ypath).read_text()) if ypath else None
            x = torch.randn(
                args.seq_len // world, 1, spec.hidden_size, device="cuda", dtype=torch.bfloat16, requires_grad=True
            )
            dy = torch.randn_like(x)

            def build_layer(overlap: bool, spec=spec, case=case):
                cfg = build_transformer_config(
                    spec, case, True, "cuda", overrides={"num_layers": 1, "tp_comm_overlap": overlap}
                )
                return build_module(layer_spec(spec, True, False), config=cfg, layer_number=1)

            def init_ub(cfg: dict | None, hidden=spec.hidden_size) -> None:
                base.initialize_ub(
                    shape=[args.seq_len, hidden],
                    tp_size=world,
                    use_fp8=False,
                    dtype=torch.bfloat16,
                    ub_cfgs=cfg,
                    bootstrap_backend="nccl",
                )

            def destroy_ub() -> None:
                base.destroy_ub()
                gc.collect()
                torch.cuda.synchronize()

            def time_layer(layer, x=x, dy=dy) -> float:
                return statistics.median(_time(layer, x, dy, args.warmup, args.repeats))

            measure_setups(build_layer, init_ub, destroy_ub, time_layer, tuned, args.passes, res["ms"], setups)
            med = {k: statistics.median(v) for k, v in res["ms"].items()}
            res["median_ms"] = med
            if "tuned" in med:
                res["speedup_tuned_vs_te_default"] = med["te_default"] / med["tuned"]
                res["speedup_tuned_vs_nccl"] = med["nccl"] / med["tuned"]
            res["status"] = "ok"
        except Exception as exc:  # noqa: BLE001
            res["status"] = "failed"
            res["error"] = f"{type(exc).__name__}: {exc}"[:500]
            res["traceback"] = traceback.format_exc()[-2000:]
        finally:
            if getattr(base, "_ub_communicators", None) is not None:
                base.destroy_ub()
        results["models"][name] = res
        if rank == 0:
            print(
                name,
                json.dumps({k: res.get(k) for k in ("status", "median_ms", "speedup_tuned_vs_te_default", "error")}),
                flush=True,
            )
    if rank == 0:
        write_text_atomic(Path(args.out), json.dumps(results, indent=1))
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
