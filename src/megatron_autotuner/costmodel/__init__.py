"""Cost model: operator times from calibration tables or documented defaults, collectives by NCCL's
protocol curves inside a node (`nccl_protocols`) and an alpha-beta model across nodes, and the pipeline
schedule, giving step time, throughput, MFU and memory.

Pure Python; no torch. `measure_defaults` (run on a GPU) re-measures the default tables.
"""

from .calibration import (
    Calibration,
    LayerMeasurement,
    MemoryCalibration,
    OpMeasurement,
    calibration_from_dict,
    load_calibration,
)
from .collectives import collective_time_s, p2p_time_s
from .compute import flash_attention_time_s, gemm_time_s, memory_bound_time_s
from .estimate import DEFAULT_MEMORY_MARGIN, CostOptions, Estimate, StageTime, TimeResult, estimate, time_model
from .layer import LayerContext, LayerCost, layer_cost

__all__ = [
    "Calibration",
    "MemoryCalibration",
    "CostOptions",
    "DEFAULT_MEMORY_MARGIN",
    "Estimate",
    "LayerContext",
    "LayerCost",
    "LayerMeasurement",
    "OpMeasurement",
    "StageTime",
    "TimeResult",
    "calibration_from_dict",
    "collective_time_s",
    "estimate",
    "flash_attention_time_s",
    "gemm_time_s",
    "layer_cost",
    "load_calibration",
    "memory_bound_time_s",
    "p2p_time_s",
    "time_model",
]
