"""TP communication-overlap tuner: TE userbuffers configs (and torch symmetric memory) per GEMM and TP size.

Pure-Python parts (candidates, rules, search, analysis, scaling, reports) import no torch; the worker
and its backends import torch / Transformer Engine lazily on the GPU machine.
"""

from .analysis import RangeMetrics, analyze_run, best_candidate, range_metrics, te_layer_metrics
from .candidates import SearchSpace, Slot, slots_for
from .config import OverlapTunerConfig
from .gemms import OPERATORS, GemmShape, gemm_shapes
from .rules import UB_NAMES, UbVariant, cfg_violations, te_default, validate_cfg, variant_violations
from .scaling import ScalingResult, scaling_check
from .search import LockstepPlanner, bracket_search, minimize, plan_searches, slot_search
from .tuner import OverlapTuner, analyze_and_report
from .yamlcfg import dump_ub_yaml, load_ub_yaml

__all__ = [
    "OPERATORS",
    "UB_NAMES",
    "GemmShape",
    "LockstepPlanner",
    "OverlapTuner",
    "OverlapTunerConfig",
    "RangeMetrics",
    "ScalingResult",
    "SearchSpace",
    "Slot",
    "UbVariant",
    "analyze_and_report",
    "analyze_run",
    "best_candidate",
    "bracket_search",
    "cfg_violations",
    "dump_ub_yaml",
    "gemm_shapes",
    "load_ub_yaml",
    "minimize",
    "plan_searches",
    "range_metrics",
    "scaling_check",
    "slot_search",
    "slots_for",
    "te_default",
    "te_layer_metrics",
    "validate_cfg",
    "variant_violations",
]
