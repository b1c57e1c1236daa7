"""The four tensor-parallel GEMMs of a transformer layer, their userbuffers names and per-rank shapes.

With TP size t, sequence parallel on, T = seq_len x micro_batch tokens and bf16 (2 bytes):

| op   | TE module (megatron-core)                 | parallel | in_features        | out_features             |
|------|-------------------------------------------|----------|--------------------|--------------------------|
| qkv  | LayerNormLinear (TELayerNormColumnParallelLinear) | column | hidden     | heads*d + 2*groups*d     |
| proj | Linear (TERowParallelLinear)              | row      | heads*d            | hidden                   |
| fc1  | LayerNormLinear (TELayerNormColumnParallelLinear) | column | hidden     | ffn (x2 with a GLU)      |
| fc2  | Linear (TERowParallelLinear)              | row      | ffn                | hidden                   |

Each runs three GEMMs: fprop, dgrad, wgrad, each of `2 * T * in * out / t` FLOPs per rank. The
communication a column-parallel op overlaps: all-gather of the [T/t, hidden] input in fprop
(`<op>_fprop`, ring_exchange), all-gather of the input again for wgrad hidden under the dgrad GEMM
(`<op>_dgrad`, bulk) and the reduce-scatter of dgrad hidden under the wgrad GEMM (`<op>_wgrad`, bulk).
A row-parallel op: reduce-scatter of the [T, hidden] output in fprop (`<op>_fprop`, pipeline) and the
all-gather of the output gradient in dgrad (`<op>_dgrad`, ring_exchange; `<op>_wgrad` is the
`external` overlap riding on it). Buffer: T x hidden x 2 bytes (the shape given to `initialize_ub`).
Source: TransformerEngine `transformer_engine/pytorch/module/base.py::initialize_ub` and
`module/linear.py` (ub_overlap_ag / ub_overlap_rs / ub_bulk_dgrad / ub_bulk_wgrad flags).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import ConfigError
from ..specs import ModelSpec

OPERATORS = ("qkv", "proj", "fc1", "fc2")
PHASES = ("fprop", "dgrad", "wgrad")
PARALLEL_MODE = {"qkv": "column", "proj": "row", "fc1": "column", "fc2": "row"}
# The measured ranges: forward (fprop) and backward (dgrad + wgrad) of each op.
RANGE_PHASES = ("fwd", "bwd")
PHASES_OF_RANGE = {"fwd": ("fprop",), "bwd": ("dgrad", "wgrad")}
DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp8": 1}


def ub_name(op: str, phase: str) -> str:
    return f"{op}_{phase}"


@dataclass(frozen=True)
class GemmShape:
    """Per-rank shape of one op at TP size `tp` (sequence parallel when tp > 1)."""

    op: str
    tp: int
    tokens: int  # T = seq_len x micro_batch (global, before the sequence-parallel split)
    hidden_size: int
    in_features: int  # global (before the TP split)
    out_features: int  # global

    @property
    def parallel_mode(self) -> str:
        return PARALLEL_MODE[self.op]

    @property
    def local_in(self) -> int:
        return self.in_features // self.tp if self.parallel_mode == "row" else self.in_features

    @property
    def local_out(self) -> int:
        return self.out_features // self.tp if self.parallel_mode == "column" else self.out_features

    @property
    def gemm_flops(self) -> float:
        """FLOPs of one of the three GEMMs on one rank: 2 * T * in * out / tp."""
        return 2.0 * self.tokens * self.in_features * self.out_features / self.tp

    def comm_bytes(self, dtype: str = "bf16") -> int:
        """Bytes of the full [T, hidden] tensor that each all-gather / reduce-scatter of this op moves."""
        return 0 if self.tp == 1 else self.tokens * self.hidden_size * DTYPE_BYTES[dtype]

    def to_dict(self) -> dict:
        return {
            "op": self.op,
            "tp": self.tp,
            "tokens": self.tokens,
            "hidden_size": self.hidden_size,
            "in_features": self.in_features,
            "out_features": self.out_features,
            "local_in": self.local_in,
            "local_out": self.local_out,
            "parallel_mode": self.parallel_mode,
            "gemm_flops": self.gemm_flops,
            "comm_bytes": self.comm_bytes(),
        }


def gemm_shapes(model: ModelSpec, tp: int, tokens: int, operators: tuple[str, ...] = OPERATORS) -> list[GemmShape]:
    """Shapes of `operators` for `model` at TP size `tp`; raises ConfigError when TP does not divide them."""
    if model.multi_latent_attention:
        raise ConfigError("model", f"{model.name}: multi-latent attention has no single qkv GEMM; not supported")
    if tp < 1:
        raise ConfigError("tp", f"must be >= 1, got {tp}")
    h = model.hidden_size
    ffn = model.ffn_hidden_size if not model.is_moe else (model.ffn_hidden_size or model.moe_ffn_hidden_size)
    fc1_out = ffn * (2 if model.gated_linear_unit else 1)
    dims = {
        "qkv": (h, model.qkv_projection_size),
        "proj": (model.attention_output_size, h),
        "fc1": (h, fc1_out),
        "fc2": (ffn, h),
    }
    out = []
    for op in operators:
        if op not in dims:
            raise ConfigError("operators", f"unknown operator {op!r}; allowed: {', '.join(OPERATORS)}")
        fin, fout = dims[op]
        split = fout if PARALLEL_MODE[op] == "column" else fin
        if split % tp:
            raise ConfigError("tp", f"{model.name} {op}: {split} is not divisible by TP={tp}")
        if tp > 1 and tokens % tp:
            raise ConfigError("max_token_len", f"{tokens} tokens are not divisible by TP={tp} (sequence parallel)")
        if op == "qkv" and tp > 1 and model.num_query_groups % tp:
            raise ConfigError("tp", f"{model.name}: {model.num_query_groups} query groups are not divisible by TP={tp}")
        out.append(GemmShape(op, tp, tokens, h, fin, fout))
    return out
