"""Layout search: enumerate every layout megatron-core accepts, prune by memory, rank by
predicted step time, explain every rejection. Pure Python, no torch."""

from .plan import GRAPH_MODES, Candidate, PlanResult, Rejection, layout_label, plan, plan_with_graphs
from .space import RECOMPUTE_CHOICES, SearchSpace

__all__ = [
    "GRAPH_MODES",
    "RECOMPUTE_CHOICES",
    "Candidate",
    "PlanResult",
    "Rejection",
    "SearchSpace",
    "layout_label",
    "plan",
    "plan_with_graphs",
]
