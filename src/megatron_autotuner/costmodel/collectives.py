"""Collective time: an alpha-beta model per collective type, group size and link.

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
    bw = cluster.link_gbps(n, stride) * 1e9 * d.LINK_EFFICIENCY[link]
    steps = {"all_reduce": 2 * (n - 1), "send_recv": 1}.get(collective, n - 1)
    alpha = d.COLLECTIVE_BASE_LATENCY_S + steps * d.HOP_LATENCY_S[link]
    if collective == "all_to_all" and link == "scale_out":
        per_node = max(1, min(n, cluster.gpu.gpus_per_node // max(stride, 1)))
        inter = message_bytes * (n - per_node) / n
        intra = message_bytes * (per_node - 1) / n
        nvlink = cluster.gpu.nvlink_gbps * 1e9 * d.LINK_EFFICIENCY["nvlink"]
        scale_out = cluster.gpu.scale_out_gbps * 1e9 * d.LINK_EFFICIENCY["scale_out"]
        return alpha + max(inter / scale_out, intra / nvlink)
    return alpha + message_bytes * wire_factor(collective, n) / bw


def p2p_time_s(message_bytes: float, cluster: ClusterSpec, stride: int) -> float:
    """One pipeline send/recv of `message_bytes` between ranks `stride` apart."""
    return collective_time_s("send_recv", 2, message_bytes, cluster, stride)
