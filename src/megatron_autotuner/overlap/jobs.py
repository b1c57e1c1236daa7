"""Jobs and rounds of a tuning run, and where their records live (no torch).

One job = one torchrun launch for one backend at one TP size over one or more models. Inside a job
the worker measures *rounds*: a round is one ub_cfgs (or a fixed setup: nccl, te_default,
symm_mem, no_tp) applied to all ops, each op timed forward and backward. Records (one JSON line per
round, appended by rank 0 to `collect/rank_0.jsonl`) are keyed by `case_id` = a hash of what the round
measures, so a resumed job finds them again; failures the launcher saw (timeouts, crashes) go to
`collect/launcher.jsonl` under the same key.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from ..launch.records import LAUNCHER_FILE, read_records
from ..testbench.results import rank_file

CURRENT_FILE = "current_case.txt"
REINIT_EXIT_CODE = 3  # worker asks for a fresh process (userbuffers could not be re-initialised in place)


class NeedsFreshProcess(RuntimeError):
    """Userbuffers cannot be set up again in this process: the worker exits with REINIT_EXIT_CODE and the
    launcher restarts the job."""


FIXED_LABELS = ("nccl", "te_default", "symm_mem", "no_tp")


def job_id(backend: str, tp: int, models: list[str]) -> str:
    return f"{backend}_tp{tp}_" + hashlib.sha1("|".join(models).encode()).hexdigest()[:8]


def round_id(backend: str, tp: int, model: str, tokens: int, label: str, cfg: Any, tag: str = "") -> str:
    text = json.dumps([backend, tp, model, tokens, label, cfg, tag], sort_keys=True)
    return f"{model}:{backend}:tp{tp}:{label}:" + hashlib.sha1(text.encode()).hexdigest()[:12]


def done_id(job: str) -> str:
    return f"{job}:done"


def all_round_records(out_dir: Path) -> dict[str, dict[str, Any]]:
    """Latest record per case_id: rank 0's results, then launcher failures for ids rank 0 never finished."""
    out: dict[str, dict[str, Any]] = {}
    for rec in read_records(rank_file(out_dir, 0)):
        if isinstance(rec.get("case_id"), str):  # a record without its key (edited, another tool's) is skipped
            out[rec["case_id"]] = rec
    for rec in read_records(Path(out_dir) / "collect" / LAUNCHER_FILE):
        if isinstance(rec.get("case_id"), str) and rec["case_id"] not in out:
            out[rec["case_id"]] = rec
    return out


def job_finished(out_dir: Path, job: str) -> bool:
    return done_id(job) in all_round_records(out_dir)
