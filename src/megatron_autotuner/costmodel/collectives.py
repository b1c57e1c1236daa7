"""Collective time per collective type, group size and link.

Inside one NVLink domain, all-reduce / all-gather / reduce-scatter take the time of the algorithm and
protocol NCCL picks for the message size (`nccl_protocols`: NCCL 2.28.9's tuning model, LL for small
messages, LL128 / Simple above, corrected by what the 2x H200 traces measured). Everything else (groups
that cross nodes, all-to-all, send/recv) uses an alpha-beta model:

    t = alpha + wire_bytes / (link_gbps * LINK_EFFICIENCY[link])
    alpha = COLLECTIVE_BASE_LATENCY_S + steps * HOP_LATENCY_S[link]

wire_bytes per rank follow NCCL's ring bus-bandwidth factors (`theory.comm.wire_factor`):
all-gather / reduce-scatter (n-1)/n, all-reduce 2(n-1)/n, send/recv 1; steps = n-1 (2(n-1) for
all-reduce, 1 for send/recv). The link is NVLink when the group's span (n x stride, Megatron
orders ranks tp-fastest) fits in one node, else the scale-out network (`ClusterSpec.link_gbps`: a
group with k members per node rings over k NICs at once).
All-to-all across nodes is bounded by whichever of the two links carries its share longer: of the
(n-1)/n of the message that leaves a rank, the peers in other nodes receive (n - n_node)/n over
the network and the peers in the same node (n_node - 1)/n over NVLink.
"""

from __future__ import annotations

from functools import lru_cache

from ..specs.hardware import ClusterSpec
from ..theory.comm import wire_factor
from . import defaults as d
from .nccl_protocols import COLLECTIVES, achieved_time_s


def _link(cluster: ClusterSpec, group_size: int, stride: int) -> str:
    return "nvlink" if group_size * stride <= cluster.gpu.gpus_per_node else "scale_out"


@lru_cache(maxsize=65536)
def collective_time_s(
    collective: str, group_size: int, message_bytes: float, cluster: ClusterSpec, stride: int = 1
) -> float:
    """Seconds for one call of `collective` over `group_size` ranks spaced `stride` apart."""
    n = group_size
    if n <= 1 or message_bytes <= 0:
        return 0.0
    link = _link(cluster, n, stride)
    if link == "nvlink" and collective in COLLECTIVES:
        return achieved_time_s(collective, n, float(message_bytes), cluster.gpu)
    bw = cluster.link_gbps(n, stride) * 1e9 * d.LINK_EFFICIENCY[link]
    steps = {"all_reduce": 2 * (n - 1), "send_recv": 1}.get(collective, n - 1)
    alpha = d.COLLECTIVE_BASE_LATENCY_S + steps * d.HOP_LATENCY_S[link]
    if collective == "all_to_all" and link == "scale_out":
        per_node = _group_ranks_per_node(cluster, n, stride)
        inter = message_bytes * (n - per_node) / n
        intra = message_bytes * (per_node - 1) / n
        return alpha + _two_level_s(inter, intra, cluster)
    return alpha + message_bytes * wire_factor(collective, n) / bw


def _group_ranks_per_node(cluster: ClusterSpec, group_size: int, stride: int) -> int:
    """Ranks of a group spaced `stride` apart that share one node."""
    return max(1, min(group_size, cluster.gpu.gpus_per_node // max(stride, 1)))


def _two_level_s(inter_bytes: float, intra_bytes: float, cluster: ClusterSpec) -> float:
    """An exchange whose bytes leaving the node go over scale-out while the rest go over NVLink at the same time:
    the slower of the two."""
    nvlink = cluster.gpu.nvlink_gbps * 1e9 * d.LINK_EFFICIENCY["nvlink"]
    scale_out = cluster.gpu.scale_out_gbps * 1e9 * d.LINK_EFFICIENCY["scale_out"]
    return max(inter_bytes / scale_out, intra_bytes / nvlink)


def hidden_collective_cost_s(
    collective: str, group_size: int, cluster: ClusterSpec, stride: int, hidden_s: float
) -> float:
    """Compute time lost beside a collective for the `hidden_s` seconds it runs under compute:
    `defaults.NCCL_OVERLAP_COST[collective] * hidden_s` on NVLink; 0 for a group that leaves the node
    (not measured)."""
    if group_size <= 1 or hidden_s <= 0.0 or _link(cluster, group_size, stride) != "nvlink":
        return 0.0
    return d.NCCL_OVERLAP_COST[collective] * hidden_s


def remote_nodes_per_token(num_experts: int, topk: int, nodes: int, groups: int = 0, group_topk: int = 0) -> float:
    """Expected other nodes a token's top-k experts sit on, experts spread evenly over `nodes` nodes (consecutive
    experts per rank) and picked without repeats: (N - 1) x (1 - C(E - E/N, k) / C(E, k)). With group-limited routing
    (`groups` groups of consecutive experts, a token's experts inside its `group_topk` best ones; megatron-core
    moe_utils.group_limited_topk) and whole groups per node (groups a multiple of N), the picks are groups instead:
    (N - 1) x (1 - C(G - G/N, g) / C(G, g)), each picked group assumed to get at least one of the k experts (it is
    picked for its top experts' scores); the smaller of the two."""
    if nodes <= 1:
        return 0.0
    ungrouped = (nodes - 1) * (1.0 - _none_on_a_node(num_experts, topk, nodes))
    if groups and group_topk and groups % nodes == 0:
        return min(ungrouped, (nodes - 1) * (1.0 - _none_on_a_node(groups, group_topk, nodes)))
    return ungrouped


def _none_on_a_node(items: int, picks: int, nodes: int) -> float:
    """The chance that `picks` of `items` drawn without repeats miss one given node's items/nodes."""
    per_node = items / nodes
    none_there = 1.0
    for i in range(picks):
        none_there *= max(0.0, items - per_node - i) / (items - i)
    return none_there


@lru_cache(maxsize=65536)
def dispatch_time_s(
    routed_bytes: float,
    ep: int,
    cluster: ClusterSpec,
    stride: int,
    num_experts: int,
    topk: int,
    dedup: bool,
    groups: int = 0,
    group_topk: int = 0,
) -> float:
    """One MoE dispatch (or combine) of `routed_bytes` (the rank's top-k copies of its tokens) over `ep` ranks.

    The alltoall dispatcher sends every copy: `collective_time_s("all_to_all")`. The flex dispatcher over DeepEP or
    HybridEP sends a token to a rank once, however many of its experts sit there (DeepEP's dispatch layout is a
    `is_token_in_rank` [tokens, ranks] map, deepseek-ai/DeepEP deep_ep/buffer.py `get_dispatch_layout`; HybridEP sizes
    a rank's receive buffer at one copy of each token of every rank, DeepEP hybrid-ep branch
    docs/Hybrid-EP_Implementation.md "4.2 Buffer Allocation"), and a token to each other node once ("removes
    redundant tokens during cross-node communication", megatron/core/transformer/moe/README.md @ Megatron-LM
    d98e8a6; DeepEP's normal kernels forward from the RDMA domain to NVLink): D = `ranks_reached_per_token` ranks
    get it. Inside one node that is an all-to-all of D / k of the copies; across N nodes the token crosses to
    `remote_nodes_per_token` nodes over scale-out and to D (g - 1) / g ranks over NVLink (all but the one GPU of
    each node it lands on or starts from), g GPUs of the group per node, n = ep."""
    link = _link(cluster, ep, stride)
    if not dedup or ep <= 1 or routed_bytes <= 0:
        return collective_time_s("all_to_all", ep, routed_bytes, cluster, stride)
    per_token = routed_bytes / topk
    reached = ranks_reached_per_token(num_experts, topk, ep, groups, group_topk)
    if link == "nvlink":
        return collective_time_s("all_to_all", ep, per_token * reached, cluster, stride)
    per_node = _group_ranks_per_node(cluster, ep, stride)
    nodes = max(1, ep // per_node)
    inter = per_token * remote_nodes_per_token(num_experts, topk, nodes, groups, group_topk)
    intra = per_token * reached * (per_node - 1) / per_node
    alpha = d.COLLECTIVE_BASE_LATENCY_S + (ep - 1) * d.HOP_LATENCY_S["scale_out"]  # as the all_to_all's
    return alpha + _two_level_s(inter, intra, cluster)


def ranks_reached_per_token(num_experts: int, topk: int, ranks: int, groups: int = 0, group_topk: int = 0) -> float:
    """Expected ranks (its own included) holding at least one of a token's top-k experts, experts spread evenly over
    `ranks`: the other ranks as `remote_nodes_per_token` counts other nodes, plus the chance its own holds one
    (every rank alike: R / (R - 1) of the other ranks). At most min(k, R)."""
    if ranks <= 1:
        return 1.0
    return remote_nodes_per_token(num_experts, topk, ranks, groups, group_topk) * ranks / (ranks - 1)


def p2p_time_s(message_bytes: float, cluster: ClusterSpec, stride: int) -> float:
    """One pipeline send/recv of `message_bytes` between ranks `stride` apart."""
    return collective_time_s("send_recv", 2, message_bytes, cluster, stride)


UB_METHODS = ("ring_exchange", "pipeline", "bulk")


def userbuffers_time_s(method: str, collective: str, group_size: int, message_bytes: float, chunks: int = 4) -> float:
    """Seconds TE userbuffers take to all-gather / reduce-scatter `message_bytes` (the full tensor) over
    `group_size` NVLink ranks, with no NCCL protocol latency (`defaults.UB_*`, measured on 2x H200).

    ring_exchange: n-1 steps, each a copy-engine put of one n-th of the tensor to the next rank plus
        the push-send / push-receive flag kernels: (n-1) x (UB_STEP_SYNC_S + (m/n) / UB_P2P_COPY_GBPS);
    bulk: one userbuffers kernel on num_sm SMs: KERNEL_OVERHEAD_S + m(n-1)/n / UB_SM_KERNEL_GBPS;
    pipeline (reduce-scatter of the GEMM's `chunks` output chunks): chunks x KERNEL_OVERHEAD_S +
        m(n-1)/n / UB_SM_KERNEL_GBPS.
    """
    n = group_size
    if n <= 1 or message_bytes <= 0:
        return 0.0
    if method == "ring_exchange":
        return (n - 1) * (d.UB_STEP_SYNC_S + message_bytes / n / (d.UB_P2P_COPY_GBPS * 1e9))
    key = (method, collective)
    if key not in d.UB_SM_KERNEL_GBPS:
        raise ValueError(f"userbuffers {method} does not run {collective}")
    launches = chunks if method == "pipeline" else 1
    wire = message_bytes * (n - 1) / n
    return launches * d.KERNEL_OVERHEAD_S + wire / (d.UB_SM_KERNEL_GBPS[key] * 1e9)
