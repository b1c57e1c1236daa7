"""Transformer Engine userbuffers (UB) overlap configs: one `UbVariant` per GEMM name, TE's defaults and rules.

The rules, as TE 2.x `initialize_ub` and the userbuffers kernels apply them
(`transformer_engine/pytorch/module/base.py`, `common/comm_gemm_overlap/comm_gemm_overlap.cpp`):
- names: `{qkv,proj,fc1,fc2}_{fprop,dgrad,wgrad}`. All-gather (AG) overlaps: qkv/fc1 fprop, proj/fc2
  dgrad (ring_exchange), qkv/fc1 dgrad (bulk AG of the input for wgrad); reduce-scatter (RS):
  proj/fc2 fprop (pipeline), qkv/fc1 wgrad (bulk RS of dgrad); proj/fc2 wgrad are `external`
  (they ride on the ring_exchange of proj/fc2 dgrad).
- `pipeline` is not supported for an all-gather ("pipeline overlap method is not supported for AllGather").
- `bulk` exists only for the dgrad/wgrad overlaps of column-parallel ops (qkv, fc1); `external` only for
  proj/fc2 wgrad, and needs its dgrad on ring_exchange.
- qkv/fc1 dgrad on a non-bulk method turns it into a reduce-scatter of dgrad (module flag
  `ub_overlap_rs_dgrad`, Megatron `--tp-comm-overlap-rs-dgrad`); then `<op>_wgrad` must not be configured.
- `atomic_gemm` only with FP8 buffers, never for bulk/external, and with ring_exchange on both members
  of an AG/RS pair (qkv_fprop+proj_fprop, fc1_fprop+fc2_fprop) or neither.
- `aggregate` (2 GEMM chunks per ring step, ranks paired by tp_id % 2) only for ring_exchange and an
  even tp; at tp=2 it leaves one step and no overlap, so the generator tries it from tp=4 on.
  ring_exchange uses tp chunks (`num_splits` is not a ring_exchange parameter).
- `num_sm` (SMs of the communication kernels; the userbuffers kernels use at most 32, UB_MAX_SM) and
  `cga_size` (thread-block cluster size, 1..8, must divide num_sm: a cluster dimension divides the
  grid) matter for the SM-driven methods pipeline and bulk; ring_exchange copies with the copy engine
  (`use_ce`) so they do not apply there. `set_sm_margin` gives the GEMM `SMs - num_sm` SMs.
- pipeline: the [T, hidden] output is cut into `num_splits` chunks, each reduce-scattered over tp
  ranks, so T must be divisible by num_splits x tp.
TE defaults (`get_default_config`): ring_exchange num_sm 1, cga 1, no margin, aggregate off;
pipeline num_sm 16, cga 2, margin on, num_splits 4; bulk num_sm 16, cga 2, margin on.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from typing import Any

from ..errors import ConfigError

UB_NAMES = tuple(f"{op}_{ph}" for op in ("qkv", "proj", "fc1", "fc2") for ph in ("fprop", "dgrad", "wgrad"))
METHODS = ("ring_exchange", "pipeline", "bulk", "external")
ALL_GATHER_NAMES = frozenset(
    {"qkv_fprop", "qkv_dgrad", "proj_dgrad", "proj_wgrad", "fc1_fprop", "fc1_dgrad", "fc2_dgrad", "fc2_wgrad"}
)
REDUCE_SCATTER_NAMES = frozenset({"proj_fprop", "fc2_fprop", "qkv_wgrad", "fc1_wgrad"})
DEFAULT_METHOD = {
    "qkv_fprop": "ring_exchange",
    "fc1_fprop": "ring_exchange",
    "proj_dgrad": "ring_exchange",
    "fc2_dgrad": "ring_exchange",
    "proj_fprop": "pipeline",
    "fc2_fprop": "pipeline",
    "qkv_dgrad": "bulk",
    "qkv_wgrad": "bulk",
    "fc1_dgrad": "bulk",
    "fc1_wgrad": "bulk",
    "proj_wgrad": "external",
    "fc2_wgrad": "external",
}
RS_DGRAD_NAMES = ("qkv_dgrad", "fc1_dgrad")  # may leave bulk for an RS-dgrad overlap
AG_RS_PAIRS = {"qkv_fprop": "proj_fprop", "fc1_fprop": "fc2_fprop"}
EXTERNAL_PARTNER = {"proj_wgrad": "proj_dgrad", "fc2_wgrad": "fc2_dgrad"}
UB_MAX_SM = 32
MAX_CGA_SIZE = 8
SM_METHODS = ("pipeline", "bulk")


@dataclass(frozen=True)
class UbVariant:
    """The settings of one GEMM's overlap; None = not set (TE's default applies / not applicable)."""

    method: str
    num_sm: int | None = None
    cga_size: int | None = None
    set_sm_margin: bool | None = None
    num_splits: int | None = None
    aggregate: bool | None = None
    atomic_gemm: bool = False

    def to_cfg(self) -> dict[str, Any]:
        """The dict `initialize_ub(ub_cfgs={name: ...})` and Megatron's yaml take (only the keys set)."""
        out: dict[str, Any] = {"method": self.method}
        for f in fields(self):
            v = getattr(self, f.name)
            if f.name == "method" or v is None or (f.name == "atomic_gemm" and not v):
                continue
            out[f.name] = bool(v) if f.name in ("set_sm_margin", "aggregate", "atomic_gemm") else int(v)
        return out

    @classmethod
    def from_cfg(cls, name: str, cfg: Mapping[str, Any]) -> UbVariant:
        known = {f.name for f in fields(cls)}
        unknown = set(cfg) - known
        if unknown:
            raise ConfigError(name, f"unknown userbuffers keys {sorted(unknown)}; known: {sorted(known)}")
        kw = dict(cfg)
        kw.setdefault("method", DEFAULT_METHOD.get(name, "ring_exchange"))
        for key in ("set_sm_margin", "aggregate", "atomic_gemm"):
            if key in kw and kw[key] is not None:
                kw[key] = bool(kw[key])
        return cls(**kw)

    def label(self) -> str:
        parts = [self.method]
        for key, short in (("num_sm", "sm"), ("cga_size", "cga"), ("num_splits", "splits")):
            v = getattr(self, key)
            if v is not None:
                parts.append(f"{short}{v}")
        if self.set_sm_margin is not None:
            parts.append(f"margin{int(self.set_sm_margin)}")
        if self.aggregate is not None:
            parts.append(f"agg{int(self.aggregate)}")
        if self.atomic_gemm:
            parts.append("atomic")
        return ":".join(parts)


def te_default(name: str, tp: int) -> UbVariant:
    """TE's default config of `name` (get_default_config), with the SM-method parameters spelled out."""
    method = DEFAULT_METHOD[name]
    if method == "ring_exchange":
        return UbVariant("ring_exchange", aggregate=False)
    if method == "pipeline":
        return UbVariant("pipeline", num_sm=16, cga_size=2, set_sm_margin=True, num_splits=4)
    if method == "bulk":
        return UbVariant("bulk", num_sm=16, cga_size=2, set_sm_margin=True)
    return UbVariant("external")


def allowed_methods(name: str, rs_dgrad: bool = False) -> tuple[str, ...]:
    if name not in DEFAULT_METHOD:
        raise ConfigError("ub_cfgs", f"unknown GEMM name {name!r}; known: {', '.join(UB_NAMES)}")
    if name in EXTERNAL_PARTNER:
        return ("external",)
    if name in RS_DGRAD_NAMES:
        return ("ring_exchange", "pipeline") if rs_dgrad else ("bulk",)
    if name.endswith("_wgrad"):
        return ("bulk",)
    if name in REDUCE_SCATTER_NAMES:  # proj/fc2 fprop
        return ("pipeline", "ring_exchange")
    return ("ring_exchange",)  # all-gather fprop / dgrad


def variant_violations(
    name: str, v: UbVariant, *, tp: int, tokens: int | None = None, fp8: bool = False, rs_dgrad: bool = False
) -> list[str]:
    """Every rule `v` breaks for GEMM `name` (empty list = legal)."""
    out: list[str] = []
    if v.method not in METHODS:
        return [f"{name}: unknown method {v.method!r}"]
    allowed = allowed_methods(name, rs_dgrad)
    if v.method not in allowed:
        if v.method == "pipeline" and name in ALL_GATHER_NAMES and not (rs_dgrad and name in RS_DGRAD_NAMES):
            out.append(f"{name}: pipeline overlap is not supported for an all-gather")
        else:
            out.append(f"{name}: method {v.method} not allowed (allowed: {', '.join(allowed)})")
    if v.atomic_gemm:
        if not fp8:
            out.append(f"{name}: atomic_gemm needs FP8 buffers")
        if v.method in ("bulk", "external"):
            out.append(f"{name}: atomic_gemm is not supported for {v.method} overlap")
    if v.aggregate is not None and v.method != "ring_exchange":
        out.append(f"{name}: aggregate applies to ring_exchange only")
    if v.method == "ring_exchange":
        if v.num_splits is not None:
            out.append(f"{name}: ring_exchange always uses tp chunks; num_splits does not apply")
        if v.aggregate and tp % 2:
            # aggregate pairs neighbouring ranks (tp_id % 2) and exchanges 2X chunks
            out.append(f"{name}: aggregate pairs ranks and needs an even tp, got {tp}")
    if v.method in ("external",) and any(x is not None for x in (v.num_sm, v.cga_size, v.num_splits)):
        out.append(f"{name}: external overlap takes no num_sm / cga_size / num_splits")
    if v.num_sm is not None and not 1 <= v.num_sm <= UB_MAX_SM:
        out.append(f"{name}: num_sm must be in [1, {UB_MAX_SM}], got {v.num_sm}")
    if v.cga_size is not None:
        if not 1 <= v.cga_size <= MAX_CGA_SIZE:
            out.append(f"{name}: cga_size must be in [1, {MAX_CGA_SIZE}], got {v.cga_size}")
        num_sm = v.num_sm if v.num_sm is not None else te_default(name, tp).num_sm
        if num_sm and v.cga_size >= 1 and num_sm % v.cga_size:
            out.append(f"{name}: cga_size {v.cga_size} must divide num_sm {num_sm}")
    if v.num_splits is not None:
        if v.method == "bulk":
            out.append(f"{name}: bulk overlap is one GEMM; num_splits does not apply")
        elif v.num_splits < 1:
            out.append(f"{name}: num_splits must be >= 1, got {v.num_splits}")
        elif tokens is not None and tokens % (v.num_splits * tp):
            out.append(f"{name}: {tokens} tokens are not divisible by num_splits x tp = {v.num_splits * tp}")
    return out


def cfg_violations(
    cfg: Mapping[str, UbVariant], *, tp: int, tokens: int | None = None, fp8: bool = False, rs_dgrad: bool = False
) -> list[str]:
    """Rules of a whole ub_cfgs dict: each variant, plus the pairing rules across GEMMs."""
    out: list[str] = []
    for name, v in cfg.items():
        if name not in DEFAULT_METHOD:
            out.append(f"unknown GEMM name {name!r}")
            continue
        out.extend(variant_violations(name, v, tp=tp, tokens=tokens, fp8=fp8, rs_dgrad=rs_dgrad))

    def method(name: str) -> str:
        return cfg[name].method if name in cfg else DEFAULT_METHOD[name]

    for wgrad, dgrad in EXTERNAL_PARTNER.items():
        if method(wgrad) == "external" and method(dgrad) != "ring_exchange":
            out.append(f"{wgrad}: external overlap needs {dgrad} on ring_exchange, not {method(dgrad)}")
    for dgrad in RS_DGRAD_NAMES:
        wgrad = dgrad.replace("dgrad", "wgrad")
        if dgrad in cfg and cfg[dgrad].method != "bulk" and wgrad in cfg:
            out.append(f"{wgrad}: must not be configured when {dgrad} overlaps a reduce-scatter ({cfg[dgrad].method})")
    for ag, rs in AG_RS_PAIRS.items():
        a = ag in cfg and cfg[ag].atomic_gemm and cfg[ag].method == "ring_exchange"
        r = rs in cfg and cfg[rs].atomic_gemm and cfg[rs].method == "ring_exchange"
        if a != r:
            out.append(f"{ag}/{rs}: atomic ring_exchange must be used on both GEMMs of the pair or neither")
    return out


def validate_cfg(cfg: Mapping[str, UbVariant], **kw: Any) -> None:
    problems = cfg_violations(cfg, **kw)
    if problems:
        raise ConfigError("ub_cfgs", "; ".join(problems))


def with_changes(v: UbVariant, **changes: Any) -> UbVariant:
    return replace(v, **changes)


def cfg_to_dict(cfg: Mapping[str, UbVariant]) -> dict[str, dict[str, Any]]:
    return {name: cfg[name].to_cfg() for name in UB_NAMES if name in cfg}


def cfg_from_dict(data: Mapping[str, Mapping[str, Any]]) -> dict[str, UbVariant]:
    return {name: UbVariant.from_cfg(name, v or {}) for name, v in data.items()}
