"""torchrun entry point of the overlap tuner: measure rounds of one job on every rank.

    torchrun --nproc-per-node TP -m megatron_autotuner.overlap.worker --job job.json --out-dir D

Per model of the job: build the backend's modules, measure its fixed rounds (nccl, te_default, ...),
then (te backend, TP > 1) run the lockstep search (search.py) one round at a time, then the tuned
config and `verify_passes` more passes of te_default / tuned / nccl. Rank 0 measures, records and
decides; its record is broadcast so every rank follows the same search. A round that raises is recorded
as failed and the search goes on; a round that hangs is killed by the launcher, which records it, and the
restarted worker replays the recorded rounds (no re-measurement) and goes on after it.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import math
import os
import sys
import traceback
from pathlib import Path
from typing import Any

from ..launch import append_record, exit_with_owner
from ..specs import ModelSpec
from ..testbench.results import rank_file
from .candidates import SearchSpace, slots_for
from .gemms import gemm_shapes
from .jobs import CURRENT_FILE, REINIT_EXIT_CODE, NeedsFreshProcess, all_round_records, done_id, round_id
from .rules import cfg_from_dict, cfg_to_dict
from .search import plan_searches


def make_backend(job: dict[str, Any], rank: int, world: int):
    kind = job["backend"]
    if kind == "fake":
        from .fake import FakeBackend

        return FakeBackend(job, rank, world)
    if kind == "te":
        from .backends import TEBackend

        return TEBackend(job, rank, world)
    if kind == "symm-mem":
        from .backends import SymmMemBackend

        return SymmMemBackend(job, rank, world)
    raise SystemExit(f"unknown backend {kind!r}")


def _environment(device: str) -> dict[str, Any]:
    if device == "cuda":
        from ..launch.environment import environment

        return environment(device)
    import torch

    return {
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "torch": torch.__version__,
        "device": "cpu",
        "transformer_engine": None,
        "megatron_core": None,
    }


def _profiled(job: dict[str, Any], label: str, tag: str) -> bool:
    """profile: all (every round) | key (first nccl / te_default / tuned / symm_mem / no_tp rounds) | none."""
    mode = job.get("profile", "all")
    if mode is True:
        mode = "all"
    if mode in (False, None, "none"):
        return False
    return mode == "all" or (label != "search" and not tag)


def slot_costs(rec: dict[str, Any]) -> dict[str, float]:
    """Median forward / backward ms of each op of a round: the cost of slots `op.fwd` / `op.bwd`."""
    out: dict[str, float] = {}
    for op, m in (rec.get("ops") or {}).items():
        for phase in ("fwd", "bwd"):
            try:
                out[f"{op}.{phase}"] = float(m[f"{phase}_ms"]["median"])
            except (KeyError, TypeError):
                out[f"{op}.{phase}"] = math.inf
    return out


class Worker:
    def __init__(self, job: dict[str, Any], out_dir: Path, rank: int, world: int) -> None:
        import torch.distributed as dist

        self.dist = dist
        self.job = job
        self.out = out_dir
        self.rank = rank
        self.world = world
        self.env = _environment(job.get("device", "cuda"))
        cache = [all_round_records(out_dir) if rank == 0 else None]
        dist.broadcast_object_list(cache, src=0)
        self.cache: dict[str, dict[str, Any]] = cache[0]
        self.backend = make_backend(job, rank, world)
        self.rounds_measured = 0

    def _record(self, rec: dict[str, Any]) -> None:
        """Append one record of rank 0; the fake backend's are marked synthetic (it measures nothing)."""
        append_record(rank_file(self.out, 0), {**rec, **({"synthetic": True} if self.job["backend"] == "fake" else {})})

    # ---- one round ---------------------------------------------------------------------------
    def measure(self, model: ModelSpec, label: str, cfg: dict | None, tag: str = "") -> dict[str, Any]:
        job = self.job
        backend_name = job.get("fake_kind", job["backend"]) if job["backend"] == "fake" else job["backend"]
        rid = round_id(backend_name, job["tp"], model.name, job["tokens"], label, cfg, tag)
        if rid in self.cache:
            return self.cache[rid]
        current = self.out / "collect" / CURRENT_FILE
        if self.rank == 0:
            current.parent.mkdir(parents=True, exist_ok=True)
            current.write_text(rid)
        self.dist.barrier()
        rec: dict[str, Any] = {
            "case_id": rid,
            "kind": "round",
            "job_id": job["job_id"],
            "backend": backend_name,
            "tp": job["tp"],
            "model": model.name,
            "tokens": job["tokens"],
            "label": label,
            "tag": tag,
            "cfg": cfg,
            "env": self.env,
        }
        trace_rel = f"traces/{job['job_id']}/{rid.replace(':', '_')}_rank0.json.gz"
        status, error, ops, trace = "ok", None, None, None
        try:
            ops, trace = self.backend.run_round(
                label, cfg, self.out / trace_rel if _profiled(job, label, tag) else None
            )
        except NeedsFreshProcess:
            raise
        except Exception as exc:  # noqa: BLE001 - a failing candidate is recorded, the sweep goes on
            status = "failed"
            error = f"{type(exc).__name__}: {exc}".splitlines()[0][:500]
            rec["traceback"] = traceback.format_exc()[-3000:]
        statuses: list[Any] = [None] * self.world
        self.dist.all_gather_object(statuses, (status, error))
        bad = [s for s in statuses if s[0] != "ok"]
        if bad:
            status, error = "failed", bad[0][1]
        rec.update(status=status, error=error, ops=ops if status == "ok" else None)
        rec["trace"] = trace_rel if (status == "ok" and trace) else None
        box = [rec if self.rank == 0 else None]
        self.dist.broadcast_object_list(box, src=0)
        rec = box[0]
        if self.rank == 0:
            self._record(rec)
            print(f"[{status}] {rid} {error or ''}", flush=True)
        self.cache[rid] = rec
        self.rounds_measured += 1
        return rec

    # ---- one model ---------------------------------------------------------------------------
    def run_model(self, model: ModelSpec) -> None:
        job = self.job
        shapes = gemm_shapes(model, job["tp"], job["tokens"], tuple(job["operators"]))
        self.backend.start_model(model, shapes)
        try:
            fixed = self.backend.fixed_rounds()
            for label in fixed:
                self.measure(model, label, None)
            if not (self.backend.searchable and job["tp"] > 1):
                for p in range(job.get("verify_passes", 0)):
                    for label in fixed:
                        self.measure(model, label, None, tag=f"verify{p}")
                return
            space = SearchSpace.from_job(job["tp"], job["tokens"], job["space"])
            slots = slots_for(tuple(job["operators"]))
            planner, _ = plan_searches(slots, space)
            while (cfg := planner.next_round()) is not None:
                rec = self.measure(model, "search", cfg_to_dict(cfg))
                planner.tell(slot_costs(rec), failed=rec.get("status") != "ok")
            best = cfg_to_dict(planner.best_cfg())
            self.measure(model, "tuned", best)
            for p in range(job.get("verify_passes", 0)):
                for label in ("te_default", "tuned", "nccl"):
                    self.measure(model, label, best if label == "tuned" else None, tag=f"verify{p}")
            if self.rank == 0:
                evaluated = sum(
                    1
                    for r in self.cache.values()
                    if r.get("model") == model.name and r.get("job_id") == job["job_id"] and r.get("label") == "search"
                )
                self._record(
                    {
                        "case_id": f"{job['job_id']}:{model.name}:search",
                        "kind": "search",
                        "job_id": job["job_id"],
                        "model": model.name,
                        "tp": job["tp"],
                        "backend": job["backend"],
                        "rounds": evaluated,
                        "tuned_cfg": best,
                        "slots": {k: {"cfg": cfg_to_dict(p), "cost_ms": c} for k, (p, c) in planner.results.items()},
                        "candidates_profiled": _distinct_candidates(self.cache, job["job_id"], model.name, slots),
                        "full_sweep_candidates": {sl.key: space.full_grid_size(sl) for sl in slots},
                    },
                )
        finally:
            self.backend.end_model()

    def run(self) -> None:
        for m in self.job["models"]:
            self.run_model(ModelSpec.from_dict(m))
        if self.rank == 0:
            self._record(
                {
                    "case_id": done_id(self.job["job_id"]),
                    "kind": "job_done",
                    "job_id": self.job["job_id"],
                    "status": "ok",
                },
            )
            (self.out / "collect" / CURRENT_FILE).unlink(missing_ok=True)


def _distinct_candidates(cache: dict, job: str, model: str, slots) -> dict[str, int]:
    """Distinct variants measured per slot (what the search profiled)."""
    seen: dict[str, set] = {s.key: set() for s in slots}
    for r in cache.values():
        if r.get("job_id") != job or r.get("model") != model or r.get("label") != "search" or not r.get("cfg"):
            continue
        cfg = cfg_from_dict(r["cfg"])
        for s in slots:
            seen[s.key].add(tuple(cfg[n].label() for n in s.names if n in cfg))
    return {k: len(v) for k, v in seen.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--job", required=True)
    parser.add_argument("--out-dir", required=True)
    args = parser.parse_args(argv)
    exit_with_owner()
    job = json.loads(Path(args.job).read_text())
    import torch
    import torch.distributed as dist

    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    cuda = job.get("device", "cuda") == "cuda"
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group(backend="nccl" if cuda else "gloo")
    code = 0
    try:
        Worker(job, Path(args.out_dir), rank, world).run()
    except NeedsFreshProcess as exc:
        print(f"worker: {exc}; asking the launcher for a fresh process", flush=True)
        code = REINIT_EXIT_CODE
    if code == 0:
        dist.barrier()
    with contextlib.suppress(Exception):
        dist.destroy_process_group()
    if code:
        os._exit(code)  # skip teardown of userbuffers state that may hang
    return 0


if __name__ == "__main__":
    sys.exit(main())
