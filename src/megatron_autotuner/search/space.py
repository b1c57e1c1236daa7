"""The layout space: every (tp, pp, vpp, cp, ep, etp, sp, micro-batch, recompute, distributed
optimizer) combination megatron-core accepts for one model, GPU count and workload.

Rules (megatron-core `initialize_model_parallel`, Megatron-LM `arguments.py`, via
`specs.validate_layout`): tp divides heads, query groups and ffn, and stays inside one NVLink
node (tp <= gpus_per_node, the standard practice: TP collectives are on the critical path);
any pp up to the layer count, each with the pipeline layouts NVIDIA's recipes use (`layout_choices`): even
splits, embedding / loss accounting, first / last stage counts and, for models with dense-first layers or MTP
(or where nothing else splits), a layout string balanced by FLOPs; cp is a power of two
with seq % 2cp == 0; tp*pp*cp divides num_gpus; ep divides the expert count and etp*ep*pp the
GPU count; micro-batch * dp divides the global batch. Sequence parallelism is enumerated on and
off for dense models (MoE with ep > 1 and tp > 1 requires it); TE TP-communication overlap is on
whenever sequence parallelism is (NVIDIA's recipes do so). CUDA graphs (`SearchSpace.cuda_graphs`): the
workload's own by default; `cuda_graph_choices` gives eager plus the per-layer graphs NVIDIA's recipes use, for a
search that tries them (their memory is in the fit check, `theory.memory`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

from ..errors import ConfigError
from ..specs.model import ModelSpec
from ..specs.parallel import CudaGraphConfig, RecomputeConfig
from ..specs.pipeline import PipelineLayout, balanced_layout, even_layout
from ..theory.flops import layer_forward_flops_per_token, logits_flops_per_token, mtp_forward_flops_per_token

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
    # uneven pipeline layouts (accounting, first / last counts, balanced layout strings); False: even splits only
    uneven_pipelines: bool = True
    # screening: each structure (tp pp vpp layout cp ep etp sp) is first timed at its smallest micro-batch with the
    # least recompute that fits; only those within this fraction of the fastest, or the `screen_keep` fastest, are
    # searched over recompute x micro-batch x distributed optimizer (a larger micro-batch or less recompute gained
    # 3-15% in the plans of 8-1024 GPUs; float("inf") searches everything)
    screen_slack: float = 0.25
    screen_keep: int = 48
    # CUDA graphs to try for every layout (each checked by `specs.validate_layout`, its memory in the fit check);
    # None: the planned workload's own graphs only (eager unless the launch has them). `cuda_graph_choices(model)`
    # tries eager and per-layer graphs. Which one is faster is the cost model's host-time term.
    cuda_graphs: tuple[CudaGraphConfig, ...] | None = None
    # Megatron's EP all-to-all overlap (`a2a_overlap_choices`) tried where megatron-core allows it; False: never
    moe_a2a_overlap: bool = True


def cuda_graph_choices(model: ModelSpec) -> tuple[CudaGraphConfig, ...]:
    """Eager, and Transformer Engine per-layer graphs as NVIDIA's recipes set them: the whole decoder layer
    (attn + mlp) of a dense model; attention, router and preprocess of an MoE model, whose dropless expert
    dispatch has dynamic shapes megatron-core cannot capture (docs/user-guide/features/cuda_graph.md @ Megatron-LM
    d98e8a6; Megatron-Bridge's Qwen3-30B-A3B / DeepSeek-V3 perf configs: attn + moe_router + moe_preprocess)."""
    scope = ("attn", "moe_router", "moe_preprocess") if model.is_moe else ("attn", "mlp")
    return (CudaGraphConfig(), CudaGraphConfig("transformer_engine", scope))


def a2a_overlap_choices(
    model: ModelSpec, ep: int, pp: int, vpp: int | None, space: SearchSpace, training: bool = True
) -> tuple[tuple[bool, bool], ...]:
    """(EP all-to-all overlap, delayed expert wgrad) pairs to try: none, and in training (the overlap pairs a
    forward with a backward micro-batch: a forward-only pass has nothing to pair) on a MoE layout with expert
    parallelism and, with a pipeline, virtual stages (`specs.ParallelConfig`) the overlap without and with delayed
    wgrad, unless `space.moe_a2a_overlap` is off; which one is faster is the cost model's `costmodel.moe_overlap`.
    NVIDIA's MoE recipes pair the two, but delayed wgrad made Mixtral L2 ep 2's overlap 8.2-8.6% slower in three
    fresh-process pairs on 2x H200 (+12-13% in two earlier single runs; benchmarks/results/delay_wgrad_h200_x2), which
    the model does not price: the overlap without it comes first, so that it is kept where the model sees no gain in
    delaying."""
    if training and space.moe_a2a_overlap and model.is_moe and ep > 1 and (pp == 1 or vpp):
        return ((False, False), (True, False), (True, True))
    return ((False, False),)


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


def cp_choices(seq_length: int, space: SearchSpace, packed: bool = False) -> list[int]:
    """Powers of two with seq % 2cp == 0; with packed variable lengths every one (each sequence is padded to a
    multiple of 2*tp*cp instead, `specs.parallel.thd_alignment`)."""
    return [cp for cp in (space.cp or powers_of_two(space.max_cp)) if cp == 1 or packed or seq_length % (2 * cp) == 0]


def pp_choices(model: ModelSpec, space: SearchSpace) -> list[int]:
    """Pipeline sizes: divisors of the layer count, and with uneven layouts every size up to layers + 2 (each
    stage holds at least one of the embedding, a decoder layer or the loss)."""
    if space.pp is not None:
        return list(space.pp)
    if not space.uneven_pipelines:
        return divisors(model.num_layers)
    return list(range(1, model.num_layers + 3))


def layout_choices(model: ModelSpec, pp: int, space: SearchSpace, seq_length: int) -> list[tuple]:
    """(vpp, PipelineLayout or None for Megatron's even split) pairs for `pp`: per vpp, the even split when the
    layers divide; embedding + loss accounting (NVIDIA's Llama-3.1-405B and Qwen3 recipes) or loss accounting
    when layers + 2 (+ 1) divide; otherwise first / last stage counts; and at vpp 1, 2, 4 and 8 a layout string
    balanced by forward FLOPs for models with dense-first layers or MTP (NVIDIA's DeepSeek-V3 recipe), or when
    nothing else splits."""
    L = model.num_layers
    if pp == 1:
        return [(None, None)]
    vpps = [1, *range(2, space.max_vpp + 1)]
    if space.vpp is not None:
        vpps = [v for v in vpps if v in space.vpp]
    out: list[tuple] = []
    irregular = bool(model.mtp_num_layers) or (model.is_moe and len(set(model.moe_layer_pattern)) > 1)
    for v in vpps:
        k = pp * v
        if k > L + 2:
            break
        vpp = v if v > 1 else None
        forms: list[PipelineLayout | None] = []
        if L % k == 0:
            forms.append(None)
        if space.uneven_pipelines:
            mtp = model.mtp_num_layers
            if (L + 2) % k == 0:
                forms.append(PipelineLayout.accounting(L, pp, vpp, True, True, mtp))
            elif (L + 1) % k == 0:
                forms.append(PipelineLayout.accounting(L, pp, vpp, False, True, mtp))
            if not forms and pp > 2:
                forms += _first_last_layouts(L, pp, v, mtp)
            # balanced strings, at the vpp sizes NVIDIA's layout strings use (1, 2, 4, 8)
            if (irregular or not forms) and v in (1, 2, 4, 8):
                with contextlib.suppress(ConfigError):  # more stages than layers
                    forms.append(_balanced(model, pp, v, seq_length))
        out += [(vpp, f) for f in _distinct_splits(forms, L, pp, vpp, model.mtp_num_layers)]
    return out


def _distinct_splits(forms: list, L: int, pp: int, vpp: int | None, mtp: int) -> list:
    """`forms` without the ones that put the same layers on the same virtual stages as an earlier one (at pp 2 the
    embedding + loss accounting of an even layer count is Megatron's even split: two names, one layout, one
    step time)."""
    seen, kept = set(), []
    for form in forms:
        stages = (form or even_layout(L, pp, vpp, mtp)).stages
        if stages not in seen:
            seen.add(stages)
            kept.append(form)
    return kept


def _first_last_layouts(L: int, pp: int, v: int, mtp: int) -> list[PipelineLayout]:
    """`--decoder-first/last-pipeline-num-layers` splits: middle ranks get n layers (a multiple of v, the smallest
    that leaves first and last at most n), first and last share the rest, the last (loss) one no heavier."""
    out = []
    n = -(-L // pp)
    n += (-n) % v
    rest = L - (pp - 2) * n
    if rest < 2 * v:
        return out
    last = (rest // 2) - (rest // 2) % v
    first = rest - last
    if first % v or first > n or last < v:
        return out
    with contextlib.suppress(ConfigError):
        out.append(PipelineLayout.first_last(L, pp, v if v > 1 else None, first, last, mtp))
    return out


def _balanced(model: ModelSpec, pp: int, v: int, seq_length: int) -> PipelineLayout:
    weights = [sum(layer_forward_flops_per_token(model, i, seq_length).values()) for i in range(model.num_layers)]
    loss = logits_flops_per_token(model)
    mtp = mtp_forward_flops_per_token(model, seq_length) + loss
    return balanced_layout(weights, pp, v, 0.0, loss, (mtp,) * model.mtp_num_layers)


def ep_choices(model: ModelSpec, space: SearchSpace) -> list[int]:
    if not model.is_moe:
        return [1]
    return [ep for ep in (space.ep or powers_of_two(model.num_moe_experts)) if model.num_moe_experts % ep == 0]


# Token budgets `mat plan` tries for verl's dynamic batching when lengths vary and --max-token-len is not given:
# these multiples of the longest sequence (verl needs max_token_len >= it). More tokens per micro-batch: fewer
# micro-batches, less per-micro-batch overhead and a smaller pipeline bubble, more activation memory.
TOKEN_BUDGET_MULTIPLES = (1, 2, 4, 8, 16)


def token_budget_choices(longest_tokens: int) -> list[int]:
    """max_token_len candidates, smallest first: the longest sequence x `TOKEN_BUDGET_MULTIPLES`."""
    return [longest_tokens * k for k in TOKEN_BUDGET_MULTIPLES]


def micro_batch_choices(local_batch: int, space: SearchSpace, forward: bool) -> list[int]:
    """Micro-batch sizes that divide the global batch share of one DP rank (forward mode allows 4x larger)."""
    cap = space.max_micro_batch * (4 if forward else 1)
    sizes = space.micro_batch_sizes or tuple(powers_of_two(cap))
    return [b for b in sizes if local_batch % b == 0]


def iter_model_parallel(
    model: ModelSpec, num_gpus: int, seq_length: int, gpus_per_node: int, space: SearchSpace, packed: bool = False
) -> Iterator[tuple[int, int, int, int, int]]:
    """(tp, pp, cp, ep, etp) whose products divide num_gpus (`packed`: variable lengths, see `cp_choices`)."""
    for tp in tp_choices(model, gpus_per_node, space):
        for pp in pp_choices(model, space):
            for cp in cp_choices(seq_length, space, packed):
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
