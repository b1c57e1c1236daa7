"""OverlapTuner: the whole tuning run (jobs on GPUs, analysis, reports) behind one call.

from megatron_autotuner.overlap import OverlapTuner, OverlapTunerConfig
report = OverlapTuner(OverlapTunerConfig(models=("Llama-3.1-8B",), max_tp_size=2)).run()
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any

from ..errors import AutotunerError, ConfigError
from ..files import CONFIG_LIMIT_BYTES, check_output_dir, ensure_output_dir, read_json_bounded, write_text_atomic
from ..launch import OutputLock, append_record
from ..launch.records import LAUNCHER_FILE
from ..specs import load_model_spec
from .analysis import analyze_run
from .config import OverlapTunerConfig
from .gemms import gemm_shapes
from .jobs import job_finished, job_id
from .launcher import run_job
from .report import write_reports


def default_output_dir(command: str = "overlap") -> Path:
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    return Path("outputs") / f"{stamp}-{command}"


class OverlapTuner:
    def __init__(self, config: OverlapTunerConfig) -> None:
        self.config = config
        self.out = check_output_dir(config.output_dir if config.output_dir is not None else default_output_dir())
        self.models = [load_model_spec(m) for m in config.models]
        for m in self.models:  # fail early on shapes TP does not divide
            for tp in (1, *config.tp_list):
                gemm_shapes(m, tp, config.tokens, config.operators)

    def jobs(self) -> list[dict[str, Any]]:
        c = self.config
        names = [m.name for m in self.models]
        base = {
            "models": [m.to_dict() for m in self.models],
            "tokens": c.tokens,
            "operators": list(c.operators),
            "warmup": c.warmup,
            "repeats": c.repeats,
            "verify_passes": c.verify_passes,
            "profile": c.profile,
            "device": "cpu" if c.fake and c.device == "cpu" else c.device,
            "space": {
                "min_num_sm": c.min_num_sm,
                "max_num_sm": c.max_num_sm,
                "num_splits": list(c.num_splits),
                "cga_sizes": list(c.cga_sizes),
                "noise_frac": c.noise_frac,
            },
        }
        out = []
        for backend, tp in [("te", 1)] + [(b, tp) for tp in c.tp_list for b in c.backends]:
            kind = "fake" if c.fake else backend
            jid = job_id(backend, tp, names)
            out.append({**base, "job_id": jid, "backend": kind, "fake_kind": backend, "tp": tp, "world_size": tp})
        return out

    def _gpus(self) -> int | None:
        if self.config.available_gpus is not None:
            return self.config.available_gpus
        if self.config.fake:
            return None
        from ..launch.devices import visible_cuda_gpus

        return visible_cuda_gpus()

    def run(self) -> dict[str, Any]:
        ensure_output_dir(self.out)
        write_text_atomic(self.out / "config.json", json.dumps(self.config.to_dict(), indent=1, default=str))
        gpus = self._gpus()
        with OutputLock(self.out, "overlap"):
            self._run_jobs(gpus)
        return analyze_and_report(self.out, self.config.to_dict())

    def _run_jobs(self, gpus: int | None) -> None:
        for job in self.jobs():
            if job_finished(self.out, job["job_id"]):
                continue
            if gpus is not None and job["world_size"] > gpus:
                append_record(
                    self.out / "collect" / LAUNCHER_FILE,
                    {
                        "case_id": f"{job['job_id']}:done",
                        "kind": "job_done",
                        "job_id": job["job_id"],
                        "status": "failed",
                        "error": f"needs {job['world_size']} GPUs, {gpus} available",
                    },
                )
                continue
            run_job(job, self.out, self.config.case_timeout_s)


def analyze_and_report(
    out_dir: str | Path, config: dict[str, Any] | None = None, plots: bool = True, tie_frac: float | None = None
) -> dict[str, Any]:
    """The analysis step alone (`mat overlap analyze DIR`): no GPU, no torch."""
    out = Path(out_dir)
    check_output_dir(out, "directory")  # the reports are written next to the records
    if config is None:
        cfg_file = out / "config.json"
        config = read_json_bounded(cfg_file, "directory", CONFIG_LIMIT_BYTES) if cfg_file.exists() else {}
        if not isinstance(config, dict):
            raise ConfigError("directory", f"{cfg_file} must hold a JSON object (the run's configuration)")
    try:
        an = analyze_run(out)
        tie = tie_frac if tie_frac is not None else float(config.get("noise_frac", 0.005))
        return write_reports(an, config, out, tie_frac=tie, plots=plots)
    except (KeyError, TypeError, ValueError, AttributeError, IndexError) as exc:
        if isinstance(exc, AutotunerError):
            raise
        what = f"missing key {exc}" if isinstance(exc, KeyError) else " ".join(str(exc).split())[:200]
        raise ConfigError("directory", f"{out}: malformed run records or configuration ({what})") from None
