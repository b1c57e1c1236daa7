"""Calibration tables: achieved TFLOP/s per operator and shape, measured by the testbench on one GPU.

File format (JSON, `schema_version` 1, `kind` "megatron-autotuner-calibration"):
    {"gpu": "H200", "device_name": "NVIDIA H200", "date": "...", "versions": {...},
     "ops": [{"op": "qkv", "phase": "fwd", "flops": 4.1e11, "time_ms": 0.55, "achieved_tflops": 750,
              "tokens": 8192, "m": 8192, "n": 6144, "k": 4096, "precision": "bf16"}, ...],
     "layers": [{"model": "Llama-3.1-8B", "num_gpus": 2, "tp": 2, "cp": 1, "ep": 1,
                 "sequence_parallel": true, "seq_length": 8192, "micro_batch_size": 1,
                 "phase": "fwd+bwd", "time_ms": 11.9, "model_flops": 1.2e13, "precision": "bf16"}, ...],
                                                                                    (optional)
     "memory": {"non_torch_gib": 2.9, "fragmentation_fraction": 0.18,
                "expandable_segments": false}}                                        (optional)
     "moe_host_floor": [{"precision": "bf16", "fwd_s": 4.6e-3, "fwd_per_local_expert_s": 31e-6,
                         "bwd_s": 0.9e-3, "bwd_per_local_expert_s": 133e-6}, ...]       (optional;
                         fp8 entries may name their "fp8_recipe": delayed | tensorwise | blockwise)
     (fragmentation_fraction: reserved-but-unallocated as a fraction of activation memory;
     expandable_segments: the allocator setting of the runs it came from, absent = any. `memory` may
     also be a list of such objects, one per setting: a prediction uses the block of its own setting,
     else the one without a setting, else the cost model's default for its setting.)

`moe_host_floor`: the host time of one eager MoE block per micro-batch on the machine measured (the
testbench's `moe` operator where it is host-bound, `testbench.calibration.moe_host_floors_from_records`);
with `CostOptions.moe_host_bound` (the validate runner's eager MoE) a MoE block never takes less. An fp8
recipe without its own entry uses another fp8 recipe's, a precision without one the bf16 entry (same host),
then `defaults.MOE_HOST_FLOOR_*`.

`dense_host_floor` (optional): the host time of one eager dense layer per micro-batch on the machine measured, from
the testbench's `decoder` cases (`testbench.calibration.dense_host_floors_from_records`):
    [{"precision": "bf16", "tp": 1, "sequence_parallel": false, "fwd_s": 3.1e-3, "bwd_s": 2.4e-3,
      "fwd_no_grad_s": 2.6e-3}, ...]
A layer's phase never takes less (`DenseHostFloor`; other TP sizes add or remove the host of their TP
collectives), then `defaults.DENSE_HOST_FLOOR_*`. `fwd_no_grad_s` (optional) is the forward under torch.no_grad()
that forward-only passes run; without it they use `fwd_s` x `defaults.NO_GRAD_FWD_HOST_RATIO`. `microbatch_s` and
`step_s` (optional) are the host's work outside the layers, per micro-batch and per training step (where absent,
`fwd_s` x `defaults.DENSE_HOST_MICROBATCH_PER_LAYER_FWD` and (`fwd_s` + `bwd_s`) x `DENSE_HOST_STEP_PER_LAYER`);
`mat validate --measure-host-floor` measures all of them in the model (`validate.host_floor`).

`host_copy` (optional): host <-> device copy bandwidth measured by `mat profile --mode copy-bandwidth`
(`testbench.copy_bandwidth`), one entry per row:
    [{"direction": "h2d" | "d2h", "pinned": true, "nbytes": 1073741824, "gbps": 52.1,
      "interference": "none" | "hbm_d2d" | "nccl_allreduce" | "nccl_loopback" | "gemm", "time_ms": 20.6}, ...]
(`gbps` in 1e9 bytes/s; `interference` the traffic that ran beside the copy, absent = none).
`Calibration.host_copy_gbps` interpolates linearly in log(nbytes) between the entries of one direction, host
memory kind and interference, clamped to the smallest / largest size measured; None when none was measured.

`op` is an operator name of `theory.flops` (qkv, proj, fc1, fc2, experts_fc1, ..., logits,
core_attention) or "gemm" for a generic matrix product; `phase` is fwd, dgrad, wgrad, bwd or
fwd+bwd; `precision` (bf16 | fp8) defaults to bf16. Attention entries may carry `seq_length`,
`heads`, `head_dim` and `causal`.

Lookup: the efficiency (achieved / dense peak of the calibration GPU) of an operator call is
interpolated linearly in log(FLOPs of the call) between the entries of the same op, phase and
precision, and clamped outside the measured range. A GEMM operator without entries of its own
uses the pooled entries of every GEMM operator; a phase without entries falls back to bwd, then
fwd+bwd, then fwd.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import AutotunerError, ConfigError
from ..files import DATA_LIMIT_BYTES, read_json_bounded
from ..specs.hardware import GPUSpec, get_gpu_spec
from ..specs.parallel import FP8_RECIPES, PRECISIONS
from ..theory.memory import MemoryAllowance
from . import defaults as d

CALIBRATION_KIND = "megatron-autotuner-calibration"
PHASES = ("fwd", "dgrad", "wgrad", "bwd", "fwd+bwd")
# What identifies a measured layer (`precision` optional in files, bf16 when absent): the cost model
# uses an entry only for a layer that matches all of them (`estimate.layer_calibration_scale`).
LAYER_KEY_FIELDS = (
    "model",
    "tp",
    "cp",
    "ep",
    "sequence_parallel",
    "seq_length",
    "micro_batch_size",
    "phase",
    "precision",
)
GEMM_OPS = frozenset(
    {
        "gemm",
        "qkv",
        "proj",
        "fc1",
        "fc2",
        "experts_fc1",
        "experts_fc2",
        "shared_fc1",
        "shared_fc2",
        "router",
        "logits",
        "q_proj",
        "q_down",
        "q_up",
        "kv_down",
        "kv_up",
        "eh_proj",
    }
)


@dataclass(frozen=True)
class OpMeasurement:
    op: str
    phase: str
    flops: float
    time_ms: float
    tokens: int
    precision: str = "bf16"
    shape: tuple[tuple[str, Any], ...] = ()

    @property
    def achieved_tflops(self) -> float:
        return self.flops / (self.time_ms * 1e-3) / 1e12


@dataclass(frozen=True)
class LayerMeasurement:
    model: str
    num_gpus: int
    tp: int
    cp: int
    ep: int
    sequence_parallel: bool
    seq_length: int
    micro_batch_size: int
    phase: str
    time_ms: float
    model_flops: float
    precision: str = "bf16"


@dataclass(frozen=True)
class MemoryCalibration:
    """A measured memory allowance and the allocator setting of the runs it came from (None: unstated)."""

    allowance: MemoryAllowance
    expandable_segments: bool | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "non_torch_gib": self.allowance.non_torch_gib,
            "fragmentation_fraction": self.allowance.fragmentation_fraction,
        }
        if self.expandable_segments is not None:
            out["expandable_segments"] = self.expandable_segments
        return out


def precision_fields(precision: str, fp8_recipe: str | None) -> dict[str, str]:
    """A host floor's precision in a calibration file: the fp8 recipe only where one was measured."""
    return {"precision": precision} if fp8_recipe is None else {"precision": "fp8", "fp8_recipe": fp8_recipe}


def _floors_for(floors: tuple, precision: str, fp8_recipe: str) -> list:
    """The host floors measured for `precision` (and fp8 recipe, or none named), else another fp8 recipe's, else the
    bf16 ones (same host), else none: the same host issues the same layers whatever the precision's details."""
    for match in (
        lambda f: f.precision == precision and f.fp8_recipe in (fp8_recipe if precision == "fp8" else None, None),
        lambda f: f.precision == precision,
        lambda f: f.precision == "bf16",
    ):
        found = [f for f in floors if match(f)]
        if found:
            return found
    return []


@dataclass(frozen=True)
class MoeHostFloor:
    """Host time of one eager megatron-core MoE block per micro-batch, a line in its local experts E: forward
    `fwd_s + fwd_per_local_expert_s * E`, backward `bwd_s + bwd_per_local_expert_s * E`; the block never runs
    faster than this."""

    fwd_s: float = d.MOE_HOST_FLOOR_FWD_S
    bwd_s: float = d.MOE_HOST_FLOOR_BWD_S
    bwd_per_local_expert_s: float = d.MOE_HOST_FLOOR_BWD_PER_LOCAL_EXPERT_S
    precision: str = "bf16"
    fwd_per_local_expert_s: float = d.MOE_HOST_FLOOR_FWD_PER_LOCAL_EXPERT_S
    fp8_recipe: str | None = None  # fp8: the recipe measured (tensorwise adds an amax pass per tensor)
    # the token permute the block ran: TE's fused kernels (--moe-permute-fusion) or megatron-core's unfused path
    permute_fusion: bool = False
    # shares of the forward's host time spent in the router (and shared experts) and in the dispatcher's preprocess:
    # what CUDA graphs of scope moe_router / moe_preprocess take off the host
    router_share: float = d.MOE_HOST_ROUTER_SHARE
    preprocess_share: float = d.MOE_HOST_PREPROCESS_SHARE

    def forward_s(self, local_experts: int) -> float:
        return self.fwd_s + local_experts * self.fwd_per_local_expert_s

    def backward_s(self, local_experts: int) -> float:
        return self.bwd_s + local_experts * self.bwd_per_local_expert_s

    def line_ms(self) -> dict[str, float]:
        """The two lines in milliseconds, as reports print them: {"fwd", "fwd_per_local_expert", "bwd",
        "bwd_per_local_expert"}."""
        return {
            "fwd": self.fwd_s * 1e3,
            "fwd_per_local_expert": self.fwd_per_local_expert_s * 1e3,
            "bwd": self.bwd_s * 1e3,
            "bwd_per_local_expert": self.bwd_per_local_expert_s * 1e3,
        }

    def to_dict(self) -> dict[str, Any]:
        return precision_fields(self.precision, self.fp8_recipe) | {
            "fwd_s": self.fwd_s,
            "fwd_per_local_expert_s": self.fwd_per_local_expert_s,
            "bwd_s": self.bwd_s,
            "bwd_per_local_expert_s": self.bwd_per_local_expert_s,
            "permute_fusion": self.permute_fusion,
            "router_share": self.router_share,
            "preprocess_share": self.preprocess_share,
        }


DEFAULT_MOE_HOST_FLOOR = MoeHostFloor()
DEFAULT_FUSED_MOE_HOST_FLOOR = MoeHostFloor(
    fwd_s=d.FUSED_MOE_HOST_FLOOR_FWD_S,
    fwd_per_local_expert_s=d.FUSED_MOE_HOST_FLOOR_FWD_PER_LOCAL_EXPERT_S,
    bwd_s=d.FUSED_MOE_HOST_FLOOR_BWD_S,
    bwd_per_local_expert_s=d.FUSED_MOE_HOST_FLOOR_BWD_PER_LOCAL_EXPERT_S,
    permute_fusion=True,
    router_share=d.FUSED_MOE_HOST_ROUTER_SHARE,
    preprocess_share=d.FUSED_MOE_HOST_PREPROCESS_SHARE,
)


def _tp_collectives_per_layer(tp: int, sequence_parallel: bool) -> tuple[int, int]:
    """(forward, backward) TP collectives one dense layer issues (`defaults.TP_COLLECTIVES_PER_LAYER`)."""
    return (0, 0) if tp <= 1 else d.TP_COLLECTIVES_PER_LAYER[bool(sequence_parallel)]


@dataclass(frozen=True)
class DenseHostFloor:
    """Host time of one eager megatron-core dense layer per micro-batch, forward and backward, measured at tensor
    parallel size `tp` (`defaults.DENSE_HOST_FLOOR_*`). At another TP size the layer issues another number of TP
    collectives, each `tp_collective_s` of host (`defaults.TP_COLLECTIVE_HOST_S`). A micro-batch never takes less
    than its layers' host time (`costmodel.estimate.stage_time`: the host issues ahead of the GPU, so only a host
    slower than the GPU shows)."""

    fwd_s: float = d.DENSE_HOST_FLOOR_FWD_S
    bwd_s: float = d.DENSE_HOST_FLOOR_BWD_S
    precision: str = "bf16"
    fp8_recipe: str | None = None
    tp: int = 1
    sequence_parallel: bool = False
    tp_collective_s: float = d.TP_COLLECTIVE_HOST_S
    # the forward under torch.no_grad() (forward-only passes); None: not measured, `fwd_s` x
    # `defaults.NO_GRAD_FWD_HOST_RATIO` stands in
    fwd_no_grad_s: float | None = None
    # the host outside the decoder layers: per micro-batch (embedding, output layer, loss, schedule) and per training
    # step (optimizer step, zero-grad); None: not measured, `outside_layers_s` scales the layer floor
    # (`defaults.DENSE_HOST_MICROBATCH_PER_LAYER_FWD` / `DENSE_HOST_STEP_PER_LAYER`)
    microbatch_s: float | None = None
    step_s: float | None = None

    # the fields a file may leave out (None: derived, as said above)
    OPTIONAL_FIELDS = ("fwd_no_grad_s", "microbatch_s", "step_s")

    def outside_layers_s(self) -> tuple[float, float]:
        """(per micro-batch s, per training step s) of host work outside the layers, at the measured TP size."""
        microbatch = self.microbatch_s
        if microbatch is None:
            microbatch = self.fwd_s * d.DENSE_HOST_MICROBATCH_PER_LAYER_FWD
        step = self.step_s
        if step is None:
            step = (self.fwd_s + self.bwd_s) * d.DENSE_HOST_STEP_PER_LAYER
        return microbatch, step

    def at(self, tp: int, sequence_parallel: bool, training: bool = True) -> tuple[float, float]:
        """(forward_s, backward_s) at TP size `tp`: the measured times plus (or less) the host of the TP
        collectives `tp` issues beyond (or short of) those of the measured size. Not `training`: the no-grad
        forward where measured."""
        have = _tp_collectives_per_layer(self.tp, self.sequence_parallel)
        want = _tp_collectives_per_layer(tp, sequence_parallel)
        if training:
            fwd = self.fwd_s
        else:
            fwd = self.fwd_no_grad_s if self.fwd_no_grad_s is not None else self.fwd_s * d.NO_GRAD_FWD_HOST_RATIO
        return (
            max(0.0, fwd + (want[0] - have[0]) * self.tp_collective_s),
            max(0.0, self.bwd_s + (want[1] - have[1]) * self.tp_collective_s),
        )

    def to_dict(self) -> dict[str, Any]:
        out = precision_fields(self.precision, self.fp8_recipe) | {
            "tp": self.tp,
            "sequence_parallel": self.sequence_parallel,
            "fwd_s": self.fwd_s,
            "bwd_s": self.bwd_s,
        }
        for key in self.OPTIONAL_FIELDS:
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        return out


DEFAULT_DENSE_HOST_FLOOR = DenseHostFloor()
COPY_DIRECTIONS = ("h2d", "d2h")
COPY_INTERFERENCES = ("none", "hbm_d2d", "nccl_allreduce", "nccl_loopback", "gemm")  # testbench.copy_bandwidth


@dataclass(frozen=True)
class HostCopyMeasurement:
    """One measured host <-> device copy: its direction, host memory kind, size, bandwidth and the traffic beside it."""

    direction: str
    pinned: bool
    nbytes: int
    gbps: float
    interference: str = "none"

    def to_dict(self) -> dict[str, Any]:
        return {
            "direction": self.direction,
            "pinned": self.pinned,
            "nbytes": self.nbytes,
            "gbps": self.gbps,
            "interference": self.interference,
        }


@dataclass(frozen=True, eq=False)
class Calibration:
    """A loaded calibration file. Hashes by identity so cached cost functions can take it."""

    gpu: str
    device_name: str = ""
    date: str = ""
    versions: tuple[tuple[str, str], ...] = ()
    ops: tuple[OpMeasurement, ...] = ()
    layers: tuple[LayerMeasurement, ...] = ()
    memory: tuple[MemoryCalibration, ...] = ()
    moe_host_floors: tuple[MoeHostFloor, ...] = ()
    dense_host_floors: tuple[DenseHostFloor, ...] = ()
    host_copies: tuple[HostCopyMeasurement, ...] = ()
    source: str = ""
    _tables: dict = field(default_factory=dict, repr=False, compare=False)

    def gpu_spec(self) -> GPUSpec | None:
        """The preset of the GPU the file was measured on (None when the name is not a preset)."""
        for name in (self.gpu, self.device_name.replace("NVIDIA ", "")):
            try:
                return get_gpu_spec(name)
            except AutotunerError:
                continue
        return None

    def _table(self, key: tuple[str, str, str]) -> tuple[list[float], list[float]] | None:
        if key in self._tables:
            return self._tables[key]
        op, phase, precision = key
        if op == "*gemm*":
            rows = [o for o in self.ops if o.op in GEMM_OPS and o.phase == phase and o.precision == precision]
        else:
            rows = [o for o in self.ops if o.op == op and o.phase == phase and o.precision == precision]
        rows = [o for o in rows if o.flops > 0]
        table = None
        if rows:
            peak = self._peak_tflops(precision)
            points = sorted((math.log(o.flops), o.achieved_tflops / peak) for o in rows)
            table = ([p[0] for p in points], [p[1] for p in points])
        self._tables[key] = table
        return table

    def _peak_tflops(self, precision: str) -> float:
        spec = self.gpu_spec()
        if spec is None:
            # Unknown GPU: efficiencies are kept in TFLOP/s of an H100-class peak; callers that
            # estimate another GPU scale by its own peak.
            return 989.0 if precision == "bf16" else 1979.0
        return spec.peak_tflops(precision)

    def efficiency(self, op: str, phase: str, flops: float, precision: str = "bf16") -> float | None:
        """Measured fraction of the dense peak for one call of `op` doing `flops`, or None."""
        phases = [phase]
        if phase in ("dgrad", "wgrad"):
            phases += ["bwd"]
        phases += ["fwd+bwd", "fwd"] if phase != "fwd" else ["fwd+bwd"]
        ops = [op, "*gemm*"] if op in GEMM_OPS else [op]
        for candidate_op in ops:
            for ph in phases:
                table = self._table((candidate_op, ph, precision))
                if table is not None:
                    return _interpolate(table, math.log(max(flops, 1.0)))
        return None

    def memory_for(self, expandable_segments: bool) -> MemoryAllowance | None:
        """The measured allowance for runs with this allocator setting: the block measured with it, else a
        block that states no setting, else None (a fraction measured with one setting says nothing of the
        other: 0.18 vs 0.034 x activations on H200)."""
        for wanted in (expandable_segments, None):
            for block in self.memory:
                if block.expandable_segments is wanted:
                    return block.allowance
        return None

    def moe_host_floor(
        self, precision: str, fp8_recipe: str = "delayed", permute_fusion: bool = False
    ) -> MoeHostFloor | None:
        """The MoE host floor measured for the permute path and `precision` (and fp8 recipe), else another fp8
        recipe's, else the bf16 one (same host), else None: one path's floor says nothing of the other's."""
        same_path = tuple(f for f in self.moe_host_floors if f.permute_fusion == permute_fusion)
        found = _floors_for(same_path, precision, fp8_recipe)
        return found[0] if found else None

    def dense_host_floor(self, precision: str, fp8_recipe: str, tp: int) -> DenseHostFloor | None:
        """The dense-layer host floor measured for `precision` (and fp8 recipe), at `tp` if measured there, else
        at the nearest measured TP size; else another fp8 recipe's; else the bf16 one (same host); else None."""
        found = _floors_for(self.dense_host_floors, precision, fp8_recipe)
        return min(found, key=lambda f: (abs(f.tp - tp), f.tp)) if found else None

    def host_copy_gbps(self, direction: str, pinned: bool, nbytes: int, interference: str = "none") -> float | None:
        """Measured bandwidth (GB/s, 1e9 bytes/s) of one host <-> device copy of `nbytes`: linear in log(nbytes)
        between the measured sizes of this direction ("h2d" | "d2h"), host memory kind (pinned or pageable) and
        interference, the nearest measured size's outside them; None when nothing of the kind was measured."""
        if direction not in COPY_DIRECTIONS:
            raise ConfigError("direction", f"must be one of {', '.join(COPY_DIRECTIONS)}, got {direction!r}")
        if interference not in COPY_INTERFERENCES:
            raise ConfigError("interference", f"must be one of {', '.join(COPY_INTERFERENCES)}, got {interference!r}")
        key = ("host_copy", direction, bool(pinned), interference)
        if key not in self._tables:
            by_size: dict[int, list[float]] = {}
            for m in self.host_copies:
                if (m.direction, m.pinned, m.interference) == key[1:]:
                    by_size.setdefault(m.nbytes, []).append(m.gbps)
            points = sorted((math.log(n), sum(v) / len(v)) for n, v in by_size.items())
            self._tables[key] = ([x for x, _ in points], [y for _, y in points]) if points else None
        table = self._tables[key]
        if table is None:
            return None
        return _interpolate(table, math.log(max(int(nbytes), 1)))

    def to_summary(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "gpu": self.gpu,
            "device_name": self.device_name,
            "date": self.date,
            "ops": len(self.ops),
            "layers": len(self.layers),
            "memory": [block.to_dict() for block in self.memory],
            "moe_host_floor": [floor.to_dict() for floor in self.moe_host_floors],
            "dense_host_floor": [floor.to_dict() for floor in self.dense_host_floors],
            "host_copy": len(self.host_copies),
        }


def _interpolate(table: tuple[list[float], list[float]], x: float) -> float:
    xs, ys = table
    if x <= xs[0]:
        return ys[0]
    if x >= xs[-1]:
        return ys[-1]
    i = bisect_left(xs, x)
    x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
    if x1 == x0:
        return (y0 + y1) / 2
    return y0 + (y1 - y0) * (x - x0) / (x1 - x0)


def _number(where: str, value: Any, positive: bool = True, allow_zero: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ConfigError(where, f"must be a number, got {value!r}")
    if positive and (value < 0 or (value == 0 and not allow_zero)):
        raise ConfigError(where, f"must be {'>= 0' if allow_zero else '> 0'}, got {value!r}")
    return float(value)


def _bool(where: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(where, f"must be true or false, got {value!r}")
    return value


def _share(where: str, value: Any) -> float:
    share = _number(where, value, allow_zero=True)
    if share > 1.0:
        raise ConfigError(where, f"must be a share in [0, 1], got {value!r}")
    return share


def _integer(where: str, value: Any, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(where, f"must be an integer >= {minimum}, got {value!r}")
    return value


def _precision(where: str, value: Any) -> str:
    if value not in PRECISIONS:
        raise ConfigError(where, f"must be {' or '.join(PRECISIONS)}, got {value!r}")
    return value


def _parse_op(where: str, row: Any) -> OpMeasurement:
    if not isinstance(row, dict):
        raise ConfigError(where, "must be an object")
    for key in ("op", "phase", "flops", "time_ms"):
        if key not in row:
            raise ConfigError(f"{where}.{key}", "is required")
    op = row["op"]
    if not isinstance(op, str) or not op:
        raise ConfigError(f"{where}.op", f"must be a non-empty string, got {op!r}")
    if row["phase"] not in PHASES:
        raise ConfigError(f"{where}.phase", f"must be one of {', '.join(PHASES)}, got {row['phase']!r}")
    flops = _number(f"{where}.flops", row["flops"], allow_zero=True)
    time_ms = _number(f"{where}.time_ms", row["time_ms"])
    if "achieved_tflops" in row:
        _number(f"{where}.achieved_tflops", row["achieved_tflops"], allow_zero=True)
    tokens = _integer(f"{where}.tokens", row.get("tokens", 0), minimum=0)
    precision = _precision(f"{where}.precision", row.get("precision", "bf16"))
    shape_keys = ("m", "n", "k", "seq_length", "heads", "head_dim", "causal")
    shape = tuple((k, row[k]) for k in shape_keys if k in row)
    for k, v in shape:
        if k == "causal":
            if not isinstance(v, bool):
                raise ConfigError(f"{where}.causal", f"must be true or false, got {v!r}")
        else:
            _integer(f"{where}.{k}", v)
    return OpMeasurement(op, row["phase"], flops, time_ms, tokens, precision, shape)


def _parse_layer(where: str, row: Any) -> LayerMeasurement:
    if not isinstance(row, dict):
        raise ConfigError(where, "must be an object")
    required = (LAYER_KEY_FIELDS[0], "num_gpus", *LAYER_KEY_FIELDS[1:-1], "time_ms", "model_flops")
    for key in required:
        if key not in row:
            raise ConfigError(f"{where}.{key}", "is required")
    if not isinstance(row["model"], str) or not row["model"]:
        raise ConfigError(f"{where}.model", "must be a non-empty string")
    if row["phase"] not in ("fwd", "fwd+bwd"):
        raise ConfigError(f"{where}.phase", f"must be fwd or fwd+bwd, got {row['phase']!r}")
    if not isinstance(row["sequence_parallel"], bool):
        raise ConfigError(f"{where}.sequence_parallel", "must be true or false")
    return LayerMeasurement(
        model=row["model"],
        num_gpus=_integer(f"{where}.num_gpus", row["num_gpus"]),
        tp=_integer(f"{where}.tp", row["tp"]),
        cp=_integer(f"{where}.cp", row["cp"]),
        ep=_integer(f"{where}.ep", row["ep"]),
        sequence_parallel=row["sequence_parallel"],
        seq_length=_integer(f"{where}.seq_length", row["seq_length"]),
        micro_batch_size=_integer(f"{where}.micro_batch_size", row["micro_batch_size"]),
        phase=row["phase"],
        time_ms=_number(f"{where}.time_ms", row["time_ms"]),
        model_flops=_number(f"{where}.model_flops", row["model_flops"], allow_zero=True),
        precision=_precision(f"{where}.precision", row.get("precision", "bf16")),
    )


def _parse_memory_block(where: str, mem: Any) -> MemoryCalibration:
    if not isinstance(mem, dict):
        raise ConfigError(where, "must be an object")
    default = MemoryAllowance()
    non_torch = None  # absent: by layout (theory.memory.default_non_torch_gib)
    if mem.get("non_torch_gib") is not None:
        non_torch = _number(f"{where}.non_torch_gib", mem["non_torch_gib"], allow_zero=True)
    frag = _number(
        f"{where}.fragmentation_fraction",
        mem.get("fragmentation_fraction", default.fragmentation_fraction),
        allow_zero=True,
    )
    if frag >= 1:
        raise ConfigError(f"{where}.fragmentation_fraction", f"must be < 1, got {frag}")
    expandable = mem.get("expandable_segments")
    if expandable is not None and not isinstance(expandable, bool):
        raise ConfigError(f"{where}.expandable_segments", f"must be true or false, got {expandable!r}")
    allowance = MemoryAllowance(
        non_torch_gib=non_torch, fragmentation_fraction=frag, expandable_segments=bool(expandable)
    )
    return MemoryCalibration(allowance, expandable)


def _parse_memory(source: str, raw: Any) -> tuple[MemoryCalibration, ...]:
    if raw is None:
        return ()
    if isinstance(raw, dict):
        return (_parse_memory_block(f"{source}: memory", raw),)
    if not isinstance(raw, list):
        raise ConfigError(f"{source}: memory", "must be an object or a list of objects")
    blocks = tuple(_parse_memory_block(f"{source}: memory[{i}]", mem) for i, mem in enumerate(raw))
    settings = [b.expandable_segments for b in blocks]
    if len(set(settings)) != len(settings):
        raise ConfigError(f"{source}: memory", "has two blocks for the same expandable_segments setting")
    return blocks


def _fp8_recipe(where: str, row: dict[str, Any]) -> str | None:
    recipe = row.get("fp8_recipe")
    if recipe is None:
        return None
    if row.get("precision") != "fp8" or recipe not in FP8_RECIPES:
        raise ConfigError(where, f"must be one of {', '.join(FP8_RECIPES)} with precision fp8, got {recipe!r}")
    return recipe


def _object_rows(source: str, key: str, raw: Any):
    """(where, row) of a calibration list of objects under `key` (none when absent), each checked to be an object."""
    if raw is None:
        return
    if not isinstance(raw, list):
        raise ConfigError(f"{source}: {key}", "must be a list of objects")
    for i, row in enumerate(raw):
        where = f"{source}: {key}[{i}]"
        if not isinstance(row, dict):
            raise ConfigError(where, "must be an object")
        yield where, row


def _parse_moe_host_floors(source: str, raw: Any) -> tuple[MoeHostFloor, ...]:
    floors = []
    for where, row in _object_rows(source, "moe_host_floor", raw):
        floors.append(
            MoeHostFloor(
                fwd_s=_number(f"{where}.fwd_s", row.get("fwd_s"), allow_zero=True),
                fwd_per_local_expert_s=_number(
                    f"{where}.fwd_per_local_expert_s", row.get("fwd_per_local_expert_s", 0.0), allow_zero=True
                ),
                bwd_s=_number(f"{where}.bwd_s", row.get("bwd_s"), allow_zero=True),
                bwd_per_local_expert_s=_number(
                    f"{where}.bwd_per_local_expert_s", row.get("bwd_per_local_expert_s"), allow_zero=True
                ),
                precision=_precision(f"{where}.precision", row.get("precision", "bf16")),
                fp8_recipe=_fp8_recipe(f"{where}.fp8_recipe", row),
                permute_fusion=_bool(f"{where}.permute_fusion", row.get("permute_fusion", False)),
                router_share=_share(f"{where}.router_share", row.get("router_share", d.MOE_HOST_ROUTER_SHARE)),
                preprocess_share=_share(
                    f"{where}.preprocess_share", row.get("preprocess_share", d.MOE_HOST_PREPROCESS_SHARE)
                ),
            )
        )
    keys = [(f.precision, f.fp8_recipe, f.permute_fusion) for f in floors]
    if len(set(keys)) != len(keys):
        raise ConfigError(
            f"{source}: moe_host_floor", "has two entries for the same precision, fp8 recipe and permute path"
        )
    return tuple(floors)


def _parse_dense_host_floors(source: str, raw: Any) -> tuple[DenseHostFloor, ...]:
    floors = []
    for where, row in _object_rows(source, "dense_host_floor", raw):
        tp = row.get("tp", 1)
        if not isinstance(tp, int) or isinstance(tp, bool) or tp < 1:
            raise ConfigError(f"{where}.tp", f"must be a positive integer, got {tp!r}")
        floors.append(
            DenseHostFloor(
                fwd_s=_number(f"{where}.fwd_s", row.get("fwd_s"), allow_zero=True),
                bwd_s=_number(f"{where}.bwd_s", row.get("bwd_s"), allow_zero=True),
                precision=_precision(f"{where}.precision", row.get("precision", "bf16")),
                fp8_recipe=_fp8_recipe(f"{where}.fp8_recipe", row),
                tp=tp,
                sequence_parallel=bool(row.get("sequence_parallel", tp > 1)),
                **{
                    key: _number(f"{where}.{key}", row[key], allow_zero=True)
                    for key in DenseHostFloor.OPTIONAL_FIELDS
                    if row.get(key) is not None
                },
            )
        )
    keys = [(f.precision, f.fp8_recipe, f.tp) for f in floors]
    if len(set(keys)) != len(keys):
        raise ConfigError(f"{source}: dense_host_floor", "has two entries for the same precision, fp8 recipe and tp")
    return tuple(floors)


def _parse_host_copies(source: str, raw: Any) -> tuple[HostCopyMeasurement, ...]:
    out = []
    for where, row in _object_rows(source, "host_copy", raw):
        if row.get("direction") not in COPY_DIRECTIONS:
            raise ConfigError(f"{where}.direction", f"must be h2d or d2h, got {row.get('direction')!r}")
        if not isinstance(row.get("pinned"), bool):
            raise ConfigError(f"{where}.pinned", f"must be true or false, got {row.get('pinned')!r}")
        interference = row.get("interference", "none")
        if interference not in COPY_INTERFERENCES:
            raise ConfigError(
                f"{where}.interference", f"must be one of {', '.join(COPY_INTERFERENCES)}, got {interference!r}"
            )
        out.append(
            HostCopyMeasurement(
                direction=row["direction"],
                pinned=row["pinned"],
                nbytes=_integer(f"{where}.nbytes", row.get("nbytes")),
                gbps=_number(f"{where}.gbps", row.get("gbps")),
                interference=interference,
            )
        )
    return tuple(out)


def calibration_from_dict(data: Any, source: str = "<calibration>") -> Calibration:
    """Validate a parsed calibration document; every problem is one `ConfigError` naming the field."""
    if not isinstance(data, dict):
        raise ConfigError(source, "must be a JSON object")
    if data.get("kind") != CALIBRATION_KIND:
        raise ConfigError(f"{source}: kind", f"must be {CALIBRATION_KIND!r}, got {data.get('kind')!r}")
    if data.get("schema_version") != 1:
        raise ConfigError(f"{source}: schema_version", f"must be 1, got {data.get('schema_version')!r}")
    gpu = data.get("gpu")
    if not isinstance(gpu, str) or not gpu:
        raise ConfigError(f"{source}: gpu", "must be a non-empty string")
    ops_raw = data.get("ops")
    if not isinstance(ops_raw, list):
        raise ConfigError(f"{source}: ops", "must be a list")
    ops = tuple(_parse_op(f"{source}: ops[{i}]", row) for i, row in enumerate(ops_raw))
    layers_raw = data.get("layers", []) or []
    if not isinstance(layers_raw, list):
        raise ConfigError(f"{source}: layers", "must be a list")
    layers = tuple(_parse_layer(f"{source}: layers[{i}]", row) for i, row in enumerate(layers_raw))
    memory = _parse_memory(source, data.get("memory"))
    versions = data.get("versions") or {}
    if not isinstance(versions, dict):
        raise ConfigError(f"{source}: versions", "must be an object")
    return Calibration(
        gpu=gpu,
        device_name=str(data.get("device_name", "")),
        date=str(data.get("date", "")),
        versions=tuple((str(k), str(v)) for k, v in versions.items()),
        ops=ops,
        layers=layers,
        memory=memory,
        moe_host_floors=_parse_moe_host_floors(source, data.get("moe_host_floor")),
        dense_host_floors=_parse_dense_host_floors(source, data.get("dense_host_floor")),
        host_copies=_parse_host_copies(source, data.get("host_copy")),
        source=source,
    )


def load_calibration(path: str | Path) -> Calibration:
    """Read and validate a calibration JSON file (one-line `ConfigError` on any problem)."""
    p = Path(path)
    data = read_json_bounded(p, "calibration", DATA_LIMIT_BYTES)
    try:
        return calibration_from_dict(data, source=str(p))
    except (TypeError, ValueError, ArithmeticError, AttributeError, KeyError) as exc:
        if isinstance(exc, ConfigError):
            raise
        raise ConfigError("calibration", f"{p}: malformed calibration ({' '.join(str(exc).split())})") from exc
