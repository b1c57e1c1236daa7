"""The layout space: every (tp, pp, vpp, cp, ep, etp, sp, micro-batch, recompute, distributed
optimizer) combination megatron-core accepts for one model, GPU count and workload.

Rules (megatron-core `initialize_model_parallel`, Megatron-LM `arguments.py`, via
`specs.validate_layout`): tp divides heads, query groups and ffn, and stays inside one NVLink
node (tp <= gpus_per_node, the standard practice: TP collectives are on the critical path);
pp divides the layer count (even stages); vpp divides the layers per stage; cp is a power of two
with seq % 2cp == 0; tp*pp*cp divides num_gpus; ep divides the expert count and etp*ep*pp the
GPU count; micro-batch * dp divides the global batch. Sequence parallelism is enumerated on and
off for dense models (MoE with ep > 1 and tp > 1 requires it); TE TP-communication overlap is on
whenever sequence parallelism is (NVIDIA's recipes do so).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from ..specs.model import ModelSpec
from ..specs.parallel import RecomputeConfig

RECOMPUTE_CHOICES = {
    "none": RecomputeConfig(),
    "selective": RecomputeConfig("selective", modules=("core_attn",)),
    "full": RecomputeConfig("full", "uniform", 1),
}


@dataclass(frozen=True)
class SearchSpace:
    """What the search may vary. None means: everything valid."""

    tp: tuple[int, ...] | None = None
    pp: tuple[int, ...] | None = None
    cp: tuple[int, ...] | None = None
    ep: tuple[int, ...] | None = None
    vpp: tuple[int, ...] | None = None
    micro_batch_sizes: tuple[int, ...] | None = None
    recompute: tuple[str, ...] = ("none", "selective", "full")
    distributed_optimizer: tuple[bool, ...] = (True, False)
    sequence_parallel: tuple[bool, ...] = (True, False)
    max_vpp: int = 8
    max_cp: int = 32
    max_micro_batch: int = 8


def powers_of_two(limit: int) -> list[int]:
    out, v = [], 1
    while v <= limit:
        out.append(v)
        v *= 2
    return out


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def tp_choices(model: ModelSpec, gpus_per_node: int, space: SearchSpace) -> list[int]:
    out = []
    for tp in space.tp or powers_of_two(gpus_per_node):
        if model.num_attention_heads % tp or model.ffn_hidden_size % tp:
            continue
        if not model.multi_latent_attention and model.num_query_groups % tp:
            continue
        out.append(tp)
    return out


def cp_choices(seq_length: int, space: SearchSpace) -> list[int]:
    return [cp for cp in (space.cp or powers_of_two(space.max_cp)) if cp == 1 or seq_length % (2 * cp) == 0]


def pp_choices(model: ModelSpec, space: SearchSpace) -> list[int]:
    return [pp for pp in (space.pp or divisors(model.num_layers)) if model.num_layers % pp == 0]


def vpp_choices(model: ModelSpec, pp: int, space: SearchSpace) -> list[int | None]:
    if pp == 1:
        return [None]
    per_stage = model.num_layers // pp
    allowed = [v for v in divisors(per_stage) if 1 < v <= space.max_vpp]
    if space.vpp is not None:
        allowed = [v for v in allowed if v in space.vpp]
        return ([None] if 1 in space.vpp else []) + allowed
    return [None, *allowed]


def ep_choices(model: ModelSpec, space: SearchSpace) -> list[int]:
    if not model.is_moe:
        return [1]
    return [ep for ep in (space.ep or powers_of_two(model.num_moe_experts)) if model.num_moe_experts % ep == 0]


def micro_batch_choices(local_batch: int, space: SearchSpace, forward: bool) -> list[int]:
    """Micro-batch sizes that divide the global batch share of one DP rank (forward mode allows 4x larger)."""
    cap = space.max_micro_batch * (4 if forward else 1)
    sizes = space.micro_batch_sizes or tuple(powers_of_two(cap))
    return [b for b in sizes if local_batch % b == 0]


def iter_model_parallel(
    model: ModelSpec, num_gpus: int, seq_length: int, gpus_per_node: int, space: SearchSpace
) -> Iterator[tuple[int, int, int, int, int]]:
    """(tp, pp, cp, ep, etp) whose products divide num_gpus."""
    for tp in tp_choices(model, gpus_per_node, space):
        for pp in pp_choices(model, space):
            for cp in cp_choices(seq_length, space):
                if num_gpus % (tp * pp * cp):
                    continue
                for ep in ep_choices(model, space):
                    etps = sorted({1, tp}) if model.is_moe else [tp]
                    for etp in etps:
                        if model.is_moe and model.moe_ffn_hidden_size % etp:
                            continue
                        if num_gpus % (etp * ep * pp):
                            continue
                        yield tp, pp, cp, ep, etp
