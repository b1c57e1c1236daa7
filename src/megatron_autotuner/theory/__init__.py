"""Closed-form theory: parameters, FLOPs, memory and communication per rank and per stage.

Pure functions of (`ModelSpec`, `ParallelConfig`, `Workload`); no torch. Each docstring states its
formula and its source.
"""

from .comm import CommVolume, comm_bytes_by_dimension, stage_comm_volumes
from .flops import FlopsBreakdown, iteration_flops, model_flops_per_token
from .memory import (
    ActivationOptions,
    MemoryAllowance,
    StageMemory,
    layer_activation_bytes,
    memory_per_stage,
    stage_memory,
)
from .params import ParameterCounts, stage_parameters, total_parameters
from .report import TheoryReport, theory_report

__all__ = [
    "ActivationOptions",
    "CommVolume",
    "FlopsBreakdown",
    "MemoryAllowance",
    "ParameterCounts",
    "StageMemory",
    "TheoryReport",
    "comm_bytes_by_dimension",
    "iteration_flops",
    "layer_activation_bytes",
    "memory_per_stage",
    "model_flops_per_token",
    "stage_comm_volumes",
    "stage_memory",
    "stage_parameters",
    "theory_report",
    "total_parameters",
]
