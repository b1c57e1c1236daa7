"""A synthetic backend for tests and dry runs: no GPU, no TE; deterministic costs and small Kineto traces.

Cost of an op's range (ms) = GEMM time + exposed communication, with
  GEMM time  = flops / 400 TFLOP/s x (1 + 0.01 x (num_sm of its overlaps)) (comm SMs slow the GEMM),
  comm time  = bytes / 150 GB/s (0 at TP=1),
  hidden     = comm x h(cfg), h = 0 for nccl, 0.5 for TE default, best (0.95) at num_sm 6 for bulk /
               pipeline, falling by 0.04 per SM away from it; ring_exchange 0.9; pipeline best at 4 splits.
Fault injection (environment): MAT_OVERLAP_FAKE_HANG=key=value (e.g. num_splits=8) hangs rank 0 on a round
with a variant that has it;
MAT_OVERLAP_FAKE_FAIL_SPLITS=s raises on a round using num_splits s.
"""

from __future__ import annotations

import gzip
import json
import os
import time
from pathlib import Path
from typing import Any

from .gemms import GemmShape


def _hidden_fraction(names: list[str], cfg: dict | None, label: str) -> tuple[float, int]:
    if label in ("nccl", "no_tp"):
        return 0.0, 0
    if label == "te_default" or not cfg:
        return 0.5, 16
    fr, sms = [], 0
    for n in names:
        v = cfg.get(n, {})
        m = v.get("method", "ring_exchange")
        if m == "ring_exchange":
            fr.append(0.9)
            continue
        sm = v.get("num_sm", 16)
        sms += sm
        f = 0.95 - 0.04 * abs(sm - 6)
        if m == "pipeline":
            f -= 0.05 * abs((v.get("num_splits") or 4) - 4) / 2
        fr.append(max(f, 0.0))
    return (sum(fr) / len(fr) if fr else 0.5), sms


def fake_times(shape: GemmShape, phase: str, cfg: dict | None, label: str) -> tuple[float, float, float]:
    """(total ms, gemm ms, comm ms) of one op's fwd or bwd range."""
    gemms = 1 if phase == "fwd" else 2
    names = [f"{shape.op}_fprop"] if phase == "fwd" else [f"{shape.op}_dgrad", f"{shape.op}_wgrad"]
    hidden, sms = _hidden_fraction(names, cfg, label)
    gemm_ms = gemms * shape.gemm_flops / 400e12 * 1e3 * (1 + 0.01 * sms)
    comm_ms = shape.comm_bytes() / 150e9 * 1e3
    if label == "symm_mem":
        hidden = 0.7
    return gemm_ms + comm_ms * (1 - hidden), gemm_ms, comm_ms


class FakeBackend:
    searchable = True

    def __init__(self, job: dict[str, Any], rank: int, world: int) -> None:
        self.job, self.rank, self.tp = job, rank, job["tp"]
        self.kind = job.get("fake_kind", "te")
        self.shapes: list[GemmShape] = []

    def fixed_rounds(self) -> tuple[str, ...]:
        if self.tp == 1:
            return ("no_tp",)
        return ("nccl", "symm_mem") if self.kind == "symm-mem" else ("nccl", "te_default")

    def start_model(self, model, shapes) -> None:
        self.shapes = shapes
        self.searchable = self.kind == "te"

    def end_model(self) -> None:
        self.shapes = []

    def run_round(self, label: str, cfg: dict | None, trace: Path | None):
        cfg = cfg or {}
        hang = os.environ.get("MAT_OVERLAP_FAKE_HANG")  # e.g. num_splits=8
        if hang and self.rank == 0:
            key, _, value = hang.partition("=")
            if any(str(v.get(key)) == value for v in cfg.values()):
                time.sleep(3600)
        fail = os.environ.get("MAT_OVERLAP_FAKE_FAIL_SPLITS")
        if fail and any(v.get("num_splits") == int(fail) for v in cfg.values()):
            raise RuntimeError(f"injected failure for num_splits={fail}")
        ops: dict[str, Any] = {}
        spans = []
        for s in self.shapes:
            row = {}
            for phase in ("fwd", "bwd"):
                total, gemm, comm = fake_times(s, phase, cfg, label)
                row[f"{phase}_ms"] = {"median": total, "min": total, "max": total, "std": 0.0, "n": 1}
                spans.append((f"{s.op}.{phase}", gemm, comm, total))
            row["fwd_bwd_ms"] = {"median": row["fwd_ms"]["median"] + row["bwd_ms"]["median"]}
            ops[s.op] = row
        written = None
        if trace is not None and self.rank == 0:
            write_fake_trace(trace, spans)
            written = str(trace)
        return ops, written


def write_fake_trace(path: Path, spans: list[tuple[str, float, float, float]]) -> None:
    """Kineto-like trace: per range a user_annotation, a GEMM kernel and a comm kernel launched inside it.

    The comm kernel starts at 0 and lasts comm ms; the GEMM starts when the exposed part has passed, so
    |overlap| = comm - exposed = gemm + comm - total.
    """
    events: list[dict[str, Any]] = []
    t, corr = 1000.0, 1
    for name, gemm_ms, comm_ms, total_ms in spans:
        g, c, tot = gemm_ms * 1e3, comm_ms * 1e3, total_ms * 1e3
        events.append(
            {
                "ph": "X",
                "cat": "user_annotation",
                "name": name,
                "pid": 1,
                "tid": 100,
                "ts": t,
                "dur": tot + 20,
                "args": {},
            }
        )
        for kname, start, dur, stream in (
            ("ncclDevKernel_AllGather_RING_LL(ncclDevComm*, unsigned long, ncclWork*)", t + 5, c, 21),
            ("nvjet_sm90_tst_fake_gemm", t + 5 + (tot - g), g, 7),
        ):
            if dur <= 0:
                continue
            events.append(
                {
                    "ph": "X",
                    "cat": "cuda_runtime",
                    "name": "cudaLaunchKernel",
                    "pid": 1,
                    "tid": 100,
                    "ts": t + 1,
                    "dur": 1.0,
                    "args": {"correlation": corr},
                }
            )
            events.append(
                {
                    "ph": "X",
                    "cat": "kernel",
                    "name": kname,
                    "pid": 0,
                    "tid": stream,
                    "ts": start,
                    "dur": dur,
                    "args": {"device": 0, "stream": stream, "correlation": corr},
                }
            )
            corr += 1
        t += tot + 100
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt") as f:
        json.dump({"schemaVersion": 1, "synthetic": True, "traceEvents": events}, f)
