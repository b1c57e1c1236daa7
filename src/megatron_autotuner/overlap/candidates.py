"""Candidate generation: which overlap variants are worth measuring for each GEMM at a TP size.

A *slot* is one measured range of one op: `fwd` (its fprop GEMM) or `bwd` (dgrad + wgrad), with the
userbuffers names that change its time. Slots are independent (each op runs alone), so the tuner
searches all of them at once (see search.py) and every variant is legal under rules.py.

Per slot:
- all-gather fprop/dgrad (qkv/fc1 fprop, proj/fc2 dgrad): ring_exchange, aggregate off/on (on from tp=4).
- proj/fc2 fprop (reduce-scatter): pipeline with each legal `num_splits`, ring_exchange (aggregate
  off/on); for the best pipeline, `num_sm` by bracketing search over [min_num_sm, max_num_sm]
  (multiples of cga_size), then set_sm_margin flipped, then each cga_size dividing num_sm.
- qkv/fc1 backward (bulk dgrad all-gather + bulk wgrad reduce-scatter): bracketing search of dgrad
  num_sm, then wgrad num_sm, then set_sm_margin flipped on both, then cga sizes.
`atomic_gemm` (FP8 only, beta cuBLAS API, must be paired across AG/RS GEMMs) is validated but never
searched; `external` (proj/fc2 wgrad) has nothing to tune.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import ConfigError
from .gemms import OPERATORS, PARALLEL_MODE
from .rules import UB_MAX_SM, UbVariant, te_default, variant_violations


@dataclass(frozen=True)
class Slot:
    op: str
    phase: str  # fwd | bwd
    names: tuple[str, ...]

    @property
    def key(self) -> str:
        return f"{self.op}.{self.phase}"


def slots_for(operators: tuple[str, ...] = OPERATORS) -> list[Slot]:
    out = []
    for op in operators:
        if op not in PARALLEL_MODE:
            raise ConfigError("operators", f"unknown operator {op!r}; allowed: {', '.join(OPERATORS)}")
        out.append(Slot(op, "fwd", (f"{op}_fprop",)))
        if PARALLEL_MODE[op] == "column":
            out.append(Slot(op, "bwd", (f"{op}_dgrad", f"{op}_wgrad")))
        else:
            out.append(Slot(op, "bwd", (f"{op}_dgrad",)))  # <op>_wgrad: external, rides on the dgrad ring
    return out


@dataclass(frozen=True)
class SearchSpace:
    """What the search may try. `noise_frac`: a variant must beat the incumbent by this fraction to win."""

    tp: int
    tokens: int
    min_num_sm: int = 1
    max_num_sm: int = 16
    num_splits: tuple[int, ...] = (2, 4, 8)
    cga_sizes: tuple[int, ...] = (1, 2, 4)
    try_sm_margin: bool = True
    fp8: bool = False
    noise_frac: float = 0.005

    def __post_init__(self) -> None:
        if not 1 <= self.min_num_sm <= self.max_num_sm <= UB_MAX_SM:
            raise ConfigError(
                "num_sm", f"need 1 <= min_num_sm <= max_num_sm <= {UB_MAX_SM}, got {self.min_num_sm}..{self.max_num_sm}"
            )
        if self.tp < 2:
            raise ConfigError("tp", f"overlap candidates need tp >= 2, got {self.tp}")
        if not 0 <= self.noise_frac < 0.5:
            raise ConfigError("noise_frac", f"must be in [0, 0.5), got {self.noise_frac}")

    @classmethod
    def from_job(cls, tp: int, tokens: int, space: dict) -> SearchSpace:
        """The space a tuner job describes (`OverlapTuner.jobs()`'s "space": num_sm range, splits, CGA
        sizes, noise fraction)."""
        return cls(
            tp=tp,
            tokens=tokens,
            min_num_sm=space["min_num_sm"],
            max_num_sm=space["max_num_sm"],
            num_splits=tuple(space["num_splits"]),
            cga_sizes=tuple(space["cga_sizes"]),
            noise_frac=space["noise_frac"],
        )

    def num_sm_domain(self, cga_size: int) -> list[int]:
        """num_sm values the bracketing search may visit: multiples of cga_size in [min, max]."""
        return [n for n in range(self.min_num_sm, self.max_num_sm + 1) if n % cga_size == 0]

    def legal(self, name: str, v: UbVariant) -> bool:
        return not variant_violations(name, v, tp=self.tp, tokens=self.tokens, fp8=self.fp8)

    def ring_variants(self, name: str) -> list[UbVariant]:
        out = [UbVariant("ring_exchange", aggregate=False)]
        if self.tp >= 4 and self.tp % 2 == 0:
            out.append(UbVariant("ring_exchange", aggregate=True))
        return [v for v in out if self.legal(name, v)]

    def structural_variants(self, name: str) -> list[UbVariant]:
        """Variants of a slot's first stage, TE's default first."""
        default = te_default(name, self.tp)
        if default.method == "ring_exchange":
            return self.ring_variants(name)
        if default.method == "pipeline":
            out = [default]
            for s in self.num_splits:
                v = UbVariant("pipeline", default.num_sm, default.cga_size, default.set_sm_margin, s)
                if v not in out and self.legal(name, v):
                    out.append(v)
            return out + self.ring_variants(name)
        return [default]  # bulk: only num_sm / margin / cga to search

    def full_grid_size(self, slot: Slot) -> int:
        """Size of the exhaustive grid of a slot (what a full sweep would measure)."""
        total = 1
        for name in slot.names:
            method = te_default(name, self.tp).method
            sm_grid = sum(len(self.num_sm_domain(c)) for c in self.cga_sizes if self.num_sm_domain(c)) * (
                2 if self.try_sm_margin else 1
            )
            if method == "ring_exchange":
                n = len(self.ring_variants(name))
            elif method == "pipeline":
                splits = [s for s in self.num_splits if self.tokens % (s * self.tp) == 0]
                n = len(splits) * sm_grid + len(self.ring_variants(name))
            else:
                n = sm_grid
            total *= max(n, 1)
        return total
