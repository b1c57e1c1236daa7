"""OverlapTunerConfig: what `mat overlap` tunes and how hard it tries (a frozen dataclass)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from ..errors import ConfigError
from .gemms import OPERATORS

BACKENDS = ("te", "symm-mem", "both")


@dataclass(frozen=True)
class OverlapTunerConfig:
    """Inputs of one tuning run.

    `tp_sizes` defaults to 2, 4, 8 up to `max_tp_size` (TP=1 always runs as the scaling baseline).
    `overlap_threshold`: a tuned GEMM whose overlap ratio (overlap / min(gemm, comm)) stays below it is
    flagged in the report. `scaling_tolerance`: TP=n is efficient for an op when
    time(TP=n) <= (1 + tolerance) * time(TP=1) / n.
    """

    models: tuple[str, ...]
    max_tp_size: int = 4
    tp_sizes: tuple[int, ...] | None = None
    max_token_len: int = 8192
    micro_batch_size: int = 1
    operators: tuple[str, ...] = OPERATORS
    min_num_sm: int = 1
    max_num_sm: int = 16
    num_splits: tuple[int, ...] = (2, 4, 8)
    cga_sizes: tuple[int, ...] = (1, 2, 4)
    overlap_threshold: float = 0.5
    scaling_tolerance: float = 0.2
    backend: str = "te"
    warmup: int = 3
    repeats: int = 10
    verify_passes: int = 1
    noise_frac: float = 0.005
    case_timeout_s: float = 60.0
    profile: str = "all"  # all | key (fixed and tuned rounds only) | none
    output_dir: str | None = None
    available_gpus: int | None = None
    device: str = "cuda"  # cpu: the fake backend only (tests)
    fake: bool = False  # synthetic backend, no GPU (tests, dry runs)
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if isinstance(self.models, str):
            object.__setattr__(self, "models", (self.models,))
        if not self.models:
            raise ConfigError("model", "at least one model is needed")
        if self.backend not in BACKENDS:
            raise ConfigError("backend", f"must be one of {', '.join(BACKENDS)}, got {self.backend!r}")
        for op in self.operators:
            if op not in OPERATORS:
                raise ConfigError("operators", f"unknown operator {op!r}; allowed: {', '.join(OPERATORS)}")
        if self.max_tp_size < 1:
            raise ConfigError("max_tp_size", f"must be >= 1, got {self.max_tp_size}")
        for tp in self.tp_sizes or ():
            if tp < 1 or tp & (tp - 1):
                raise ConfigError("tp_sizes", f"TP sizes must be powers of two, got {tp}")
        if not 1 <= self.min_num_sm <= self.max_num_sm:
            raise ConfigError(
                "min_num_sm", f"need 1 <= min_num_sm <= max_num_sm, got {self.min_num_sm} and {self.max_num_sm}"
            )
        if not 0 <= self.overlap_threshold <= 1:
            raise ConfigError("overlap_threshold", f"must be in [0, 1], got {self.overlap_threshold}")
        if self.scaling_tolerance < 0:
            raise ConfigError("scaling_tolerance", f"must be >= 0, got {self.scaling_tolerance}")
        if self.repeats < 1 or self.warmup < 0:
            raise ConfigError("repeats", "repeats must be >= 1 and warmup >= 0")
        if self.profile not in ("all", "key", "none"):
            raise ConfigError("profile", f"must be all, key or none, got {self.profile!r}")
        if self.max_token_len < 1 or self.micro_batch_size < 1:
            raise ConfigError("max_token_len", "max_token_len and micro_batch_size must be >= 1")

    @property
    def tp_list(self) -> tuple[int, ...]:
        """TP sizes to tune (> 1); TP=1 runs as the baseline in addition."""
        if self.tp_sizes is not None:
            return tuple(sorted({t for t in self.tp_sizes if t > 1}))
        out, t = [], 2
        while t <= self.max_tp_size:
            out.append(t)
            t *= 2
        return tuple(out)

    @property
    def backends(self) -> tuple[str, ...]:
        return ("te", "symm-mem") if self.backend == "both" else (self.backend,)

    @property
    def tokens(self) -> int:
        return self.max_token_len * self.micro_batch_size

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["tp_list"] = list(self.tp_list)
        return d
