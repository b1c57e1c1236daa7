"""GPU backends of the overlap worker (torch, Transformer Engine imported lazily, inside methods).

TEBackend: the TE modules megatron-core builds for the four GEMMs (TELayerNormColumnParallelLinear =
`te.pytorch.LayerNormLinear`, TERowParallelLinear = `te.pytorch.Linear`, RMSNorm, no bias, bf16,
sequence parallel over the TP group), once without userbuffers (NCCL collectives: round `nccl`, or
`no_tp` at TP=1) and once with the userbuffers flags megatron-core sets for `tp_comm_overlap=True`
(column: ub_overlap_ag, ub_bulk_dgrad, ub_bulk_wgrad; row: ub_overlap_rs, ub_overlap_ag; ub_name =
the op). Each round re-initialises userbuffers with `initialize_ub(shape=[T, hidden], tp_size,
use_fp8=False, dtype=bf16, ub_cfgs=cfg, bootstrap_backend)` after `destroy_ub()`.

SymmMemBackend: the same GEMM shapes with PyTorch symmetric-memory async TP:
column op forward `fused_all_gather_matmul`, backward dgrad `fused_matmul_reduce_scatter`; row op
forward `fused_matmul_reduce_scatter`, backward `fused_all_gather_matmul` on the output gradient;
wgrad is a plain matmul. Round `nccl` runs the same math with NCCL all_gather_into_tensor /
reduce_scatter_tensor and unfused matmuls; round `symm_mem` the fused ops. No norm in either.

Timing: `warmup` forward+backward steps, then `repeats` steps each timed with CUDA events around the
forward and the backward (median reported); with profiling, one more step under torch.profiler with
record_function ranges `<op>.fwd` / `<op>.bwd`, exported by rank 0 and gzipped.
"""

from __future__ import annotations

import gc
import inspect
import os
from pathlib import Path
from typing import Any

from ..testbench.measure import _stats, export_trace_gz
from .jobs import NeedsFreshProcess


def time_ops(ops: dict[str, tuple[Any, Any, Any]], warmup: int, repeats: int) -> dict[str, Any]:
    """ops: name -> (forward callable taking x, x, dy). Returns per op fwd/bwd/fwd_bwd ms statistics."""
    import torch

    out: dict[str, Any] = {}
    for name, (fwd, x, dy) in ops.items():
        params = [p for p in getattr(fwd, "parameters", lambda: [])()]
        for _ in range(warmup):
            x.grad = None
            fwd(x).backward(dy)
        torch.cuda.synchronize()
        f_ms, b_ms = [], []
        for _ in range(repeats):
            x.grad = None
            for p in params:
                p.grad = None
            start, mid, end = (torch.cuda.Event(enable_timing=True) for _ in range(3))
            start.record()
            y = fwd(x)
            mid.record()
            y.backward(dy)
            end.record()
            end.synchronize()
            f_ms.append(start.elapsed_time(mid))
            b_ms.append(mid.elapsed_time(end))
            del y
        out[name] = {
            "fwd_ms": _stats(f_ms),
            "bwd_ms": _stats(b_ms),
            "fwd_bwd_ms": _stats([a + b for a, b in zip(f_ms, b_ms, strict=True)]),
        }
    return out


def profile_ops(ops: dict[str, tuple[Any, Any, Any]], path: Path | None, rank: int) -> str | None:
    """One more forward+backward of every op; rank 0 records it with torch.profiler and writes `path` (.json.gz)."""
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    def step() -> None:
        for name, (fwd, x, dy) in ops.items():
            x.grad = None
            with record_function(f"{name}.fwd"):
                y = fwd(x)
            with record_function(f"{name}.bwd"):
                y.backward(dy)
        torch.cuda.synchronize()

    if path is None or rank != 0:
        step()
        return None
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        step()
    return str(export_trace_gz(prof, path))


def _kwargs_for(cls: Any, kw: dict[str, Any]) -> dict[str, Any]:
    """Keep only the keyword arguments `cls` accepts (TE's module signatures move between versions)."""
    try:
        params = inspect.signature(cls.__init__).parameters
    except (TypeError, ValueError):
        return kw
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return kw
    return {k: v for k, v in kw.items() if k in params}


class _Base:
    searchable = False

    def __init__(self, job: dict[str, Any], rank: int, world: int) -> None:
        import torch

        self.torch = torch
        self.job = job
        self.rank = rank
        self.world = world
        self.tp = job["tp"]
        if world != self.tp:
            raise SystemExit(f"job for TP={self.tp} started with {world} ranks")
        self.warmup = job.get("warmup", 3)
        self.repeats = job.get("repeats", 10)
        self.model = None
        self.shapes: list = []

    def _inputs(self, shape) -> tuple[Any, Any]:
        """Per-rank input (sequence-parallel shard for column ops) and output gradient, [s, b=1, features]."""
        torch = self.torch
        t, tp = shape.tokens, self.tp
        gen = torch.Generator(device="cuda").manual_seed(1234 + self.rank)
        if shape.parallel_mode == "column":
            x_shape, y_shape = (t // tp, 1, shape.in_features), (t, 1, shape.local_out)
        else:
            x_shape, y_shape = (t, 1, shape.local_in), (t // tp, 1, shape.out_features)
        x = torch.randn(x_shape, device="cuda", dtype=torch.bfloat16, generator=gen).requires_grad_(True)
        dy = torch.randn(y_shape, device="cuda", dtype=torch.bfloat16, generator=gen)
        return x, dy

    def _measure(self, ops: dict[str, tuple[Any, Any, Any]], trace: Path | None) -> tuple[dict, str | None]:
        timings = time_ops(ops, self.warmup, self.repeats)
        written = profile_ops(ops, trace, self.rank) if trace is not None else None
        return timings, written

    def end_model(self) -> None:
        self.model = None
        gc.collect()
        self.torch.cuda.synchronize()
        self.torch.cuda.empty_cache()


class TEBackend(_Base):
    searchable = True

    def __init__(self, job: dict[str, Any], rank: int, world: int) -> None:
        super().__init__(job, rank, world)
        try:
            import transformer_engine.pytorch as te  # noqa: F401
        except Exception as exc:  # noqa: BLE001
            raise SystemExit(f"backend te needs Transformer Engine (transformer_engine.pytorch): {exc}") from exc
        self.te = te
        self.ub_inits = 0
        self.plain: dict = {}
        self.ub: dict = {}

    def fixed_rounds(self) -> tuple[str, ...]:
        return ("no_tp",) if self.tp == 1 else ("nccl", "te_default")

    def _build(self, shape, ub: bool):
        te, torch = self.te, self.torch
        common = dict(
            bias=False,
            params_dtype=torch.bfloat16,
            device="cuda",
            tp_size=self.tp,
            tp_group=torch.distributed.group.WORLD if self.tp > 1 else None,
            sequence_parallel=self.tp > 1,
        )
        if shape.parallel_mode == "column":
            kw = dict(
                common,
                eps=1e-5,
                normalization="RMSNorm",
                parallel_mode="column" if self.tp > 1 else None,
                ub_overlap_ag=ub,
                ub_bulk_dgrad=ub,
                ub_bulk_wgrad=ub,
                ub_overlap_rs_dgrad=False,
                ub_name=shape.op if ub else None,
            )
            return te.LayerNormLinear(shape.in_features, shape.out_features, **_kwargs_for(te.LayerNormLinear, kw))
        kw = dict(
            common,
            parallel_mode="row" if self.tp > 1 else None,
            ub_overlap_rs=ub,
            ub_overlap_ag=ub,
            ub_name=shape.op if ub else None,
        )
        return te.Linear(shape.in_features, shape.out_features, **_kwargs_for(te.Linear, kw))

    def start_model(self, model, shapes) -> None:
        self.model, self.shapes = model, shapes
        self.plain = {s.op: (self._build(s, False), *self._inputs(s)) for s in shapes}
        self.ub = {}

    def _init_ub(self, cfg: dict | None) -> None:
        from transformer_engine.pytorch.module import base

        torch = self.torch
        if getattr(base, "_ub_communicators", None) is not None:
            if not hasattr(base, "destroy_ub"):
                raise NeedsFreshProcess("this TE has no destroy_ub()")
            base.destroy_ub()
            gc.collect()
            torch.cuda.synchronize()
        shape = [self.shapes[0].tokens, self.shapes[0].hidden_size]
        kw = dict(
            shape=shape,
            tp_size=self.tp,
            use_fp8=False,
            dtype=torch.bfloat16,
            ub_cfgs=cfg or None,
            bootstrap_backend=os.environ.get("MAT_UB_BOOTSTRAP", "nccl"),
        )
        try:
            try:
                base.initialize_ub(**kw)
            except TypeError as exc:
                if "bootstrap_backend" not in str(exc):
                    raise
                kw.pop("bootstrap_backend")
                base.initialize_ub(**kw)
        except Exception as exc:
            if self.ub_inits > 0:
                raise NeedsFreshProcess(f"initialize_ub failed after a re-initialisation: {exc}") from exc
            raise
        self.ub_inits += 1

    def run_round(self, label: str, cfg: dict | None, trace: Path | None):
        if label in ("nccl", "no_tp"):
            return self._measure(self.plain, trace)
        self._init_ub(cfg if label != "te_default" else None)
        if not self.ub:
            self.ub = {s.op: (self._build(s, True), *self._inputs(s)) for s in self.shapes}
        return self._measure(self.ub, trace)

    def end_model(self) -> None:
        self.plain, self.ub = {}, {}
        try:
            from transformer_engine.pytorch.module import base

            if getattr(base, "_ub_communicators", None) is not None and hasattr(base, "destroy_ub"):
                base.destroy_ub()
        except Exception:  # noqa: BLE001
            pass
        super().end_model()


class SymmMemBackend(_Base):
    def fixed_rounds(self) -> tuple[str, ...]:
        return ("nccl", "symm_mem")

    def start_model(self, model, shapes) -> None:
        torch = self.torch
        import torch.distributed as dist

        self.model, self.shapes = model, shapes
        self.group = dist.group.WORLD
        self.group_name = self.group.group_name
        try:
            import warnings

            from torch.distributed import _symmetric_memory as symm

            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                if hasattr(symm, "enable_symm_mem_for_group"):
                    symm.enable_symm_mem_for_group(self.group_name)
        except Exception as exc:  # noqa: BLE001
            raise RuntimeError(f"torch symmetric memory is not available: {exc}") from exc
        self.weights = {}
        for s in shapes:
            rows, cols = (s.local_out, s.in_features) if s.parallel_mode == "column" else (s.out_features, s.local_in)
            w = torch.empty(rows, cols, device="cuda", dtype=torch.bfloat16)
            torch.nn.init.normal_(w, std=0.02)
            self.weights[s.op] = torch.nn.Parameter(w)
        self.inputs = {s.op: self._inputs(s) for s in shapes}

    def run_round(self, label: str, cfg: dict | None, trace: Path | None):
        from .symm_mem_ops import column_fn, row_fn

        fused = label == "symm_mem"
        ops = {}
        for s in self.shapes:
            fn = column_fn if s.parallel_mode == "column" else row_fn
            w = self.weights[s.op]

            def fwd(x, fn=fn, w=w):
                return fn(x, w, self.group, self.group_name, fused)

            ops[s.op] = (fwd, *self.inputs[s.op])
        return self._measure(ops, trace)
